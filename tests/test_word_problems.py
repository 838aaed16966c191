"""The natural-language word problems: answers re-derived from the story text, disjoint
deterministic splits, the TFDS builder through ``load_split``, and a config's use."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sagc_jax.data import load_split
from sagc_jax.data.word_problems import INSTRUCTION, generate_problem, generate_split


def story_answer(question: str) -> int:
  """The count at the end of a story, read from its sentences alone (an independent
  re-derivation: it does not look at the generator's answer or solution)."""
  sentences = [s.strip() for s in question.split(". ") if s.strip()]
  count = int(re.match(r"\w+ has (\d+) ", sentences[0]).group(1))
  for s in sentences[1:]:
    if s.startswith("How many"):
      break
    number = re.search(r"(\d+)", s)
    if re.search(r" buys \d+ more| gives (him|her) \d+ ", s):
      count += int(number.group(1))
    elif re.search(r" gives \d+ \w+ to | loses \d+ of them", s):
      count -= int(number.group(1))
    elif "doubles" in s:
      count *= 2
    elif "shares them equally with" in s:
      count //= int(number.group(1)) + 1
    else:
      raise AssertionError(f"unparsed sentence {s!r}")
  return count


@pytest.mark.parametrize("kwargs", [{}, dict(min_steps=2, max_steps=4, max_start=40,
                                             max_operand=20)])
def test_answers_follow_from_the_story(kwargs):
  rng = np.random.default_rng(3)
  for _ in range(2000):
    problem = generate_problem(rng, **kwargs)
    assert int(problem["answer"]) == story_answer(problem["question"]), problem
    assert int(problem["answer"]) >= 0
    assert problem["solution"].endswith(f"The answer is {problem['answer']}.")


def test_splits_are_deterministic_disjoint_and_sized():
  train = [p["prompt"] for p in generate_split("train")]
  test = [p["prompt"] for p in generate_split("test")]
  assert len(train) == 20000 and len(test) == 1000
  assert not set(train) & set(test)
  assert [p["prompt"] for p in generate_split("test")] == test
  assert all(p.endswith(INSTRUCTION) for p in test[:10])
  with pytest.raises(ValueError, match="unknown split 'dev'"):
    next(generate_split("dev"))


def test_builder_reads_back_through_load_split(tmp_path):
  source = load_split("word_problems", "test[:5]", str(tmp_path))
  first = next(generate_split("test"))
  assert len(source) == 5 and source[0]["prompt"] == first["prompt"]
  assert source[0]["answer"] == first["answer"] and source[0]["id"] == 0
  with pytest.raises(ValueError, match="generated offline and takes no manual_dir"):
    load_split("word_problems", "test", str(tmp_path), manual_dir=str(tmp_path))
