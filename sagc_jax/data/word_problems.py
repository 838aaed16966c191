"""Natural-language arithmetic word problems, generated offline (TFDS builder).

Why: a real pretrained chat model needs a task it can partly solve before RL, with a
checkable answer, on a machine without network. GSM8K is far too hard for a 135M model
(SmolLM2-135M-Instruct solves almost none, and many of its responses run past a
512-token cap). These are GSM8K-like stories on small whole numbers,
one change to a count by default ("Mia has 9 stickers. She buys 4 more. How many
stickers does Mia have now?"); the model answers in natural chain-of-thought text of
natural, heavy-tailed length. The defaults are calibrated so that SmolLM2-135M-Instruct,
at the rollout temperature 0.7 of ``configs/smollm2_cpu.py``, solves some but far from
all of them; harder variants (two-step stories, larger numbers) or T = 1.0 leave it
almost nothing to learn from (docs/results.md, "SmolLM2: import and probes").
``generate_problem``'s arguments make harder variants.

Records: ``prompt`` (the story, the question and ``INSTRUCTION``: end with "The answer
is N.", whose number the math-verify reward reads), ``answer`` (the integer as text),
``solution`` (one line per step) and ``id``. Train and test are a hash partition of the
problem text, so no held-out problem appears in training. Deterministic in the seed.
"""

from __future__ import annotations

import zlib
from typing import Iterator

import numpy as np

from sagc_jax.data.synthetic import GeneratedTaskBuilder

__all__ = ["INSTRUCTION", "WordProblems", "generate_problem", "generate_split"]

# A 135M chat model rarely follows "put the answer in \\boxed{}" (it writes the
# phrase itself); it does end with a sentence it was shown. math-verify reads the
# last number of the response, so "The answer is N." is checkable. (A worked example in
# the prompt made it copy the example's numbers.)
INSTRUCTION = "Think step by step, then end with the sentence: The answer is N."

NAMES = (("Mia", "she", "her", "her"), ("Leo", "he", "his", "him"),
         ("Ava", "she", "her", "her"), ("Noah", "he", "his", "him"),
         ("Zoe", "she", "her", "her"), ("Omar", "he", "his", "him"),
         ("Lena", "she", "her", "her"), ("Ravi", "he", "his", "him"),
         ("Ines", "she", "her", "her"), ("Tom", "he", "his", "him"))
ITEMS = ("apples", "stickers", "marbles", "pencils", "cookies", "stamps", "books",
         "shells", "cards", "coins")
SPLITS = {"train": 20000, "test": 1000}     # problems generated per split (before dedup)
_TEST_BUCKET = 20                            # hash % _TEST_BUCKET == 0 -> test


def generate_problem(rng: np.random.Generator, *, min_steps: int = 1, max_steps: int = 1,
                     max_start: int = 12, max_operand: int = 6) -> dict[str, str]:
  """One story: a start count, then ``min_steps..max_steps`` changes, then the question."""
  name, she, her, them = NAMES[rng.integers(len(NAMES))]   # subject, possessive, object
  friend = NAMES[rng.integers(len(NAMES))][0]
  while friend == name:
    friend = NAMES[rng.integers(len(NAMES))][0]
  item = ITEMS[rng.integers(len(ITEMS))]
  count = int(rng.integers(5, max_start + 1))
  story = [f"{name} has {count} {item}."]
  work = []
  for _ in range(int(rng.integers(min_steps, max_steps + 1))):
    kind = rng.choice(["buy", "get", "give", "eat_or_lose", "double", "split"],
                      p=[0.25, 0.2, 0.25, 0.1, 0.1, 0.1])
    if kind in ("give", "eat_or_lose") and count < 2:
      kind = "buy"
    if kind == "split" and not [k for k in (2, 3, 4) if count % k == 0 and count >= 2 * k]:
      kind = "get"
    if kind == "double" and count > 60:
      kind = "give"
    before = count
    if kind in ("buy", "get"):
      b = int(rng.integers(2, max_operand + 1))
      count += b
      story.append(f"{she.capitalize()} buys {b} more." if kind == "buy"
                   else f"{friend} gives {them} {b} {item}.")
      work.append(f"{before} + {b} = {count}")
    elif kind in ("give", "eat_or_lose"):
      b = int(rng.integers(1, min(max_operand, count - 1) + 1))
      count -= b
      story.append(f"{she.capitalize()} gives {b} {item} to {friend}." if kind == "give"
                   else f"{she.capitalize()} loses {b} of them.")
      work.append(f"{before} - {b} = {count}")
    elif kind == "double":
      count *= 2
      story.append(f"Then {her} aunt doubles {her} {item}.")
      work.append(f"{before} * 2 = {count}")
    else:
      k = int(rng.choice([k for k in (2, 3, 4) if count % k == 0 and count >= 2 * k]))
      count //= k
      story.append(f"{she.capitalize()} shares them equally with {k - 1} friends "
                   f"and keeps one share.")
      work.append(f"{before} / {k} = {count}")
  question = " ".join(story) + f" How many {item} does {name} have now?"
  return {"question": question, "answer": str(count),
          "solution": "\n".join(work) + f"\nThe answer is {count}."}


def generate_split(split: str, seed: int = 0) -> Iterator[dict]:
  """The problems of ``split`` in generation order, ``id`` = index in the split."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; allowed: {list(SPLITS)}")
  rng = np.random.Generator(np.random.PCG64([seed, 2026]))
  seen, index = set(), 0
  for _ in range(SPLITS["train"] + SPLITS["test"] * _TEST_BUCKET):
    problem = generate_problem(rng)
    text = problem["question"]
    if text in seen:
      continue
    seen.add(text)
    is_test = zlib.crc32(text.encode()) % _TEST_BUCKET == 0
    if is_test != (split == "test"):
      continue
    yield {"prompt": f"{text}\n\n{INSTRUCTION}", "answer": problem["answer"],
           "solution": problem["solution"], "id": index}
    index += 1
    if index >= SPLITS[split]:
      return


class WordProblems(GeneratedTaskBuilder):
  """TFDS builder of the word problems (``file_format="array_record"``)."""

  DESCRIPTION = "Arithmetic word problems in natural language (one step by default)."
  SPLIT_NAMES = tuple(SPLITS)

  def generate(self, split: str) -> Iterator[dict]:
    return generate_split(split)
