"""Data: synthetic task (correctness, determinism, length tail), TFDS builders read back
through array_record without TensorFlow, local GSM8K / MATH layouts, PromptLoader."""

import dataclasses
import json
import re

import numpy as np
import pytest

from sagc_jax.data import loader as loader_lib
from sagc_jax.data.loader import DATASET_NAMES, PromptLoader, load_split
from sagc_jax.data.local_math import (BOXED_INSTRUCTION, Gsm8kLocal, MathLocal,
                                      gsm8k_reference_answer, make_prompt)
from sagc_jax.data.synthetic import (SyntheticConfig, draw_example, evaluate_left_to_right,
                                     generate_split, make_example, prompt_split)

SMALL = dict(num_train=300, num_test=40)


# ---------------------------------------------------------------------------- synthetic
_STEP = re.compile(r"^(?:check )?(-?\d+)([-+*])(\d+)=(-?\d+)$")


def check_solution(example):
  """Re-derives an example independently; returns the number of recheck lines."""
  prompt = example["prompt"]
  assert prompt.endswith("=?\n")
  tokens = re.findall(r"\d+|[-+*]", prompt[:-3])
  numbers, ops = [int(t) for t in tokens[::2]], tokens[1::2]
  expected = numbers[0]
  for op, b in zip(ops, numbers[1:]):
    expected = {"+": expected + b, "-": expected - b, "*": expected * b}[op]
  lines = example["solution"].split("\n")
  assert lines[-1] == "" and lines[-2] == f"answer {expected}"
  assert example["answer"] == str(expected)
  steps = lines[:-2]
  rechecks = 0
  for k, line in enumerate(steps):
    m = _STEP.match(line)
    assert m, line
    a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
    assert c == {"+": a + b, "-": a - b, "*": a * b}[op], line
    if line.startswith("check "):
      rechecks += 1
      assert line[6:] in steps[:len(ops)]
    else:
      assert k < len(ops) and rechecks == 0  # the steps come first, in order
  assert len(steps) - rechecks == len(ops)
  return rechecks


def test_synthetic_solutions_are_correct():
  for cfg in (SyntheticConfig(), SyntheticConfig(allow_mul=True, max_operand=20, max_ops=5)):
    rng = np.random.default_rng(0)
    for _ in range(2000):
      check_solution(make_example(rng, cfg))


def test_synthetic_negative_results_and_mul():
  cfg = SyntheticConfig(allow_mul=True)
  examples = [make_example(np.random.default_rng(i), cfg) for i in range(300)]
  assert any(e["answer"].startswith("-") for e in examples)
  assert any("*" in e["prompt"] for e in examples)
  assert not any("*" in e["prompt"] for e in generate_split(SyntheticConfig(**SMALL), "train"))
  assert evaluate_left_to_right([2, 3, 4], ["+", "*"]) == [2, 5, 20]  # no precedence


def test_synthetic_deterministic_and_splits_differ():
  cfg = SyntheticConfig(**SMALL)
  a, b = list(generate_split(cfg, "train")), list(generate_split(cfg, "train"))
  assert a == b
  assert [e["id"] for e in a] == list(range(cfg.num_train))
  test = list(generate_split(cfg, "test"))
  assert [e["prompt"] for e in test] != [e["prompt"] for e in a[:len(test)]]
  other = list(generate_split(dataclasses.replace(cfg, seed=1), "train"))
  assert [e["prompt"] for e in other] != [e["prompt"] for e in a]
  assert draw_example(cfg, "test", 7) == {k: v for k, v in test[7].items() if k != "id"}
  # Held out for real: no test prompt occurs in train, and both splits mix lengths alike.
  assert not {e["prompt"] for e in test} & {e["prompt"] for e in a}
  assert all(prompt_split(e["prompt"]) == "test" for e in test)
  n_ops = lambda rows: np.mean([e["prompt"].count("+") + e["prompt"].count("-") for e in rows])
  assert abs(n_ops(test) - n_ops(a)) < 0.35


def test_synthetic_length_distribution_is_heavy_tailed():
  cfg = SyntheticConfig()
  examples = list(generate_split(dataclasses.replace(cfg, num_train=5000), "train"))
  lengths = np.array([len(e["solution"]) for e in examples])
  q = np.percentile(lengths, [5, 25, 50, 75, 90, 95, 99])
  print("solution length quantiles 5/25/50/75/90/95/99%:", q.tolist(), "max", lengths.max())
  assert q[5] / q[2] > 1.8                # p95 / median
  assert lengths.max() / q[2] > 3.0       # a few are 3-4x longer
  rechecked = np.mean([check_solution(e) > 0 for e in examples])
  assert abs(rechecked - cfg.recheck_prob) < 0.03
  # geometric count: P(>= 2 rechecks) ~ p^2
  two = np.mean([e["solution"].count("check") >= 2 for e in examples])
  assert abs(two - cfg.recheck_prob ** 2) < 0.03
  none = SyntheticConfig(recheck_prob=0.0)
  assert not any("check" in e["solution"]
                 for e in generate_split(dataclasses.replace(none, num_train=200), "train"))
  capped = dataclasses.replace(cfg, recheck_prob=0.99, max_rechecks=2, num_train=50)
  assert all(e["solution"].count("check") <= 2 for e in generate_split(capped, "train"))


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_operand=0), "max_operand"),
    (dict(min_ops=0), "min_ops"),
    (dict(min_ops=3, max_ops=2), "max_ops"),
    (dict(recheck_prob=1.0), "recheck_prob"),
    (dict(recheck_prob=-0.1), "recheck_prob"),
    (dict(max_rechecks=-1), "max_rechecks"),
    (dict(num_train=0), "num_train"),
    (dict(seed=-1), "seed"),
    (dict(allow_mul=1), "allow_mul"),
    (dict(max_ops=2.0), "max_ops"),
    (dict(modulus=-1), "modulus"),
    (dict(guess_prob=1.0), "guess_prob"),
    (dict(guess_prob=-0.5), "guess_prob"),
])
def test_synthetic_config_validation(kwargs, field):
  with pytest.raises(ValueError, match=field):
    SyntheticConfig(**kwargs)


def test_synthetic_config_names_differ():
  a, b = SyntheticConfig(), SyntheticConfig(recheck_prob=0.5)
  assert a.name() != b.name()
  assert re.fullmatch(r"[\w.\-]+", a.name())
  names = {SyntheticConfig(modulus=10).name(), SyntheticConfig(guess_prob=0.5).name(),
           SyntheticConfig(modulus=10, guess_prob=0.5).name(), a.name()}
  assert len(names) == 4 and all(re.fullmatch(r"[\w.\-]+", n) for n in names)
  # Data of the default settings keeps its folder name from before the knobs existed.
  assert a.name() == "ops1-3_max9_addsub_recheck0.35x6_train20000_test500_seed0"


def test_synthetic_modulus_reduces_every_running_value():
  """Checked against Python's own arithmetic: + and - are left-associative with equal
  precedence, and reducing every running value mod m gives the whole expression mod m."""
  cfg = SyntheticConfig(modulus=10, min_ops=3, max_ops=5, num_train=300)
  for e in generate_split(cfg, "train"):
    expression = e["prompt"].removesuffix("=?\n")
    assert int(e["answer"]) == eval(expression) % 10       # noqa: S307 - digits and +/- only
    for line in e["solution"].splitlines():
      if "=" in line:
        lhs, result = line.removeprefix("check ").split("=")
        assert int(result) == eval(lhs) % 10 and 0 <= int(result) < 10   # noqa: S307


def test_synthetic_guess_prob_skips_the_work_and_keeps_everything_else():
  """A guess is the answer line alone, drawn last: every other example is exactly the
  always-work example of the same index (same prompt, same scratchpad, same answer)."""
  work = SyntheticConfig(num_train=2000)
  mixed = dataclasses.replace(work, guess_prob=0.7)
  guesses = 0
  for w, m in zip(generate_split(work, "train"), generate_split(mixed, "train")):
    assert (m["prompt"], m["answer"]) == (w["prompt"], w["answer"])
    if m["solution"] == f"answer {w['answer']}\n":
      guesses += 1
    else:
      assert m["solution"] == w["solution"]
  assert abs(guesses / work.num_train - 0.7) < 0.04


# ----------------------------------------------------------------------- TFDS round trip
def test_synthetic_builder_round_trip(tmp_path):
  cfg = SyntheticConfig(**SMALL, seed=3)
  train = load_split("synthetic", "train", str(tmp_path), config=cfg)
  test = load_split("synthetic", "test", str(tmp_path), config=cfg)
  assert len(train) == cfg.num_train and len(test) == cfg.num_test
  assert [train[i] for i in range(len(train))] == list(generate_split(cfg, "train"))
  assert test[:] == list(generate_split(cfg, "test"))
  assert isinstance(train[0]["prompt"], str) and type(train[0]["id"]) is int
  assert train[-1]["id"] == cfg.num_train - 1
  assert {e["prompt"] for e in test} != {e["prompt"] for e in train[:len(test)]}
  # Field kwargs name the same config, so the prepared data is reused.
  again = load_split("synthetic", "train", str(tmp_path), seed=3, **SMALL)
  assert again[5] == train[5]
  # Different settings live in a different folder.
  other = load_split("synthetic", "train", str(tmp_path), num_train=50, num_test=5)
  assert len(other) == 50
  with pytest.raises(IndexError, match="out of range"):
    train[cfg.num_train]


def test_load_split_errors(tmp_path):
  with pytest.raises(ValueError, match="allowed: .*synthetic.*gsm8k_local.*math_local"):
    load_split("gsm8k", "train", str(tmp_path))
  with pytest.raises(ValueError, match="unknown synthetic option.*num_trian"):
    load_split("synthetic", "train", str(tmp_path), num_trian=5)
  with pytest.raises(ValueError, match="manual_dir"):
    load_split("synthetic", "train", str(tmp_path), manual_dir=str(tmp_path), **SMALL)
  with pytest.raises(ValueError, match="no split 'validation'.*available: \\['test', 'train'\\]"):
    load_split("synthetic", "validation", str(tmp_path), **SMALL)
  assert DATASET_NAMES == ("synthetic", "word_problems", "gsm8k_local", "math_local", "jsonl",
                           "parquet")


# ------------------------------------------------------------------------ local GSM8K/MATH
GSM = [
    {"question": "Tom has 1,000 apples and buys 234 more. How many?",
     "answer": "1000 + 234 = <<1000+234=1234>>1234\n#### 1,234"},
    {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"},
]
GSM_TEST = [{"question": "Half of 9 minus 4.5?", "answer": "9/2-4.5=0\n#### 0"}]
MATH = [
    {"problem": "What is $1/2$ as a fraction?", "level": "Level 1", "type": "Algebra",
     "solution": "It is $\\boxed{\\frac{1}{2}}$, not \\boxed{2}... so $\\boxed{\\frac{1}{2}}$."},
    {"problem": "Set?", "solution": "The set is $\\boxed{\\{1,\\{2\\}\\}}$."},
]
MATH500 = [{"problem": "Compute 6*7.", "solution": "6*7 = \\boxed{42}", "answer": "42",
            "subject": "Prealgebra", "level": 1, "unique_id": "test/x/1.json"}]


def write_jsonl(path, records):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_gsm8k_answer_extraction():
  assert gsm8k_reference_answer("a\n#### 1,234") == "1234"
  assert gsm8k_reference_answer("x #### 3 #### -7 ") == "-7"
  with pytest.raises(ValueError, match="####"):
    gsm8k_reference_answer("no marker 42")
  assert make_prompt("  Q?  ").startswith("Q?\n") and make_prompt("Q").endswith("\\boxed{}.")


def test_gsm8k_local_jsonl(tmp_path):
  manual = tmp_path / "manual"
  write_jsonl(manual / "train.jsonl", GSM)
  write_jsonl(manual / "test.jsonl", GSM_TEST)
  train = load_split("gsm8k_local", "train", str(tmp_path / "data"), str(manual))
  assert len(train) == 2
  assert train[0] == {"prompt": GSM[0]["question"] + "\n\n" + BOXED_INSTRUCTION,
                      "answer": "1234", "solution": GSM[0]["answer"], "id": 0}
  assert train[1]["answer"] == "5"
  test = load_split("gsm8k_local", "test", str(tmp_path / "data"), str(manual))
  assert test[0]["answer"] == "0"
  # Once prepared, no manual_dir is needed; changed files trigger re-preparing.
  assert load_split("gsm8k_local", "train", str(tmp_path / "data"))[1] == train[1]
  write_jsonl(manual / "train.jsonl", GSM + GSM_TEST)
  assert len(load_split("gsm8k_local", "train", str(tmp_path / "data"), str(manual))) == 3


def test_gsm8k_local_parquet(tmp_path):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  main = tmp_path / "manual" / "main"
  main.mkdir(parents=True)
  pq.write_table(pa.Table.from_pylist(GSM[:1]), main / "train-00000-of-00002.parquet")
  pq.write_table(pa.Table.from_pylist(GSM[1:]), main / "train-00001-of-00002.parquet")
  pq.write_table(pa.Table.from_pylist(GSM_TEST), main / "test-00000-of-00001.parquet")
  train = load_split("gsm8k_local", "train", str(tmp_path / "data"), str(tmp_path / "manual"))
  assert [e["answer"] for e in train] == ["1234", "5"] and [e["id"] for e in train] == [0, 1]
  assert load_split("gsm8k_local", "test", str(tmp_path / "data"))[0]["answer"] == "0"


def test_math_local_layouts(tmp_path):
  manual = tmp_path / "manual"
  write_jsonl(manual / "train.jsonl", MATH)
  write_jsonl(manual / "test.jsonl", MATH500)
  train = load_split("math_local", "train", str(tmp_path / "data"), str(manual))
  assert train[0]["answer"] == "\\frac{1}{2}"
  assert train[1]["answer"] == "\\{1,\\{2\\}\\}"
  assert train[0]["prompt"] == MATH[0]["problem"] + "\n\n" + BOXED_INSTRUCTION
  assert train[0]["solution"] == MATH[0]["solution"]
  assert load_split("math_local", "test", str(tmp_path / "data"), str(manual))[0]["answer"] == "42"
  # The original release: one JSON file per problem under {split}/<subject>/.
  orig = tmp_path / "orig"
  for i, record in enumerate(MATH):
    (orig / "test" / "algebra").mkdir(parents=True, exist_ok=True)
    (orig / "test" / "algebra" / f"{i}.json").write_text(json.dumps(record))
  test = load_split("math_local", "test", str(tmp_path / "data2"), str(orig))
  assert [e["answer"] for e in test] == ["\\frac{1}{2}", "\\{1,\\{2\\}\\}"]
  with pytest.raises(ValueError, match="no split 'train'.*available: \\['test'\\]"):
    load_split("math_local", "train", str(tmp_path / "data2"), str(orig))


def test_local_missing_and_malformed_files(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "notes.txt").write_text("x")
  with pytest.raises(FileNotFoundError, match=r"empty.*train\.jsonl.*train-\*\.parquet"):
    load_split("gsm8k_local", "train", str(tmp_path / "data"), str(empty))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_split("math_local", "train", str(tmp_path / "data"), str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="not prepared.*manual_dir"):
    load_split("math_local", "train", str(tmp_path / "data"))
  bad = tmp_path / "bad"
  write_jsonl(bad / "train.jsonl", [GSM[0], {"question": "q", "answer": "no marker"}])
  with pytest.raises(ValueError, match=r"train\.jsonl:2.*####"):
    load_split("gsm8k_local", "train", str(tmp_path / "data"), str(bad))
  write_jsonl(bad / "train.jsonl", [{"question": "q"}])
  with pytest.raises(ValueError, match=r"train\.jsonl:1: field 'answer' is missing"):
    load_split("gsm8k_local", "train", str(tmp_path / "data"), str(bad))
  write_jsonl(bad / "train.jsonl", [{"problem": "q", "solution": "no box"}])
  with pytest.raises(ValueError, match=r"train\.jsonl:1.*boxed"):
    load_split("math_local", "train", str(tmp_path / "data"), str(bad))
  with pytest.raises(ValueError, match="takes no builder options"):
    load_split("math_local", "train", str(tmp_path / "data"), str(bad), seed=1)
  assert "train.jsonl" in Gsm8kLocal.expected_files()
  assert "train/<subject>/*.json" in MathLocal.expected_files()


# --------------------------------------------------------------------------- PromptLoader
class FakeSource(list):
  """A list of dicts standing in for a DataSource (PromptLoader needs len/getitem)."""

  def __init__(self, n):
    super().__init__({"id": i} for i in range(n))


def ids(batch):
  return [e["id"] for e in batch]


def test_loader_order_deterministic_and_seeded():
  src = FakeSource(50)
  a, b, c = PromptLoader(src, seed=0), PromptLoader(src, seed=0), PromptLoader(src, seed=1)
  first = ids(a.next_batch(30))
  assert first == ids(b.next_batch(30))
  assert first != ids(c.next_batch(30))
  assert first != list(range(30))  # shuffled


def test_loader_epochs_reshuffle_and_cover_once():
  src = FakeSource(23)
  loader = PromptLoader(src, seed=5)
  served = ids(loader.next_batch(23 * 3))
  epochs = [served[i * 23:(i + 1) * 23] for i in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(23))
  assert epochs[0] != epochs[1] != epochs[2]
  # Batch sizes that straddle epoch boundaries serve the same stream.
  other = PromptLoader(src, seed=5)
  stream = []
  for n in (7, 16, 1, 0, 30, 15):
    stream += ids(other.next_batch(n))
  assert stream == served
  assert loader.state_dict() == {"epoch": 2, "position": 23, "seed": 5}
  with pytest.raises(ValueError, match="n must be an int >= 0"):
    loader.next_batch(-1)


def test_loader_state_round_trip_mid_epoch():
  src = FakeSource(37)
  reference = PromptLoader(src, seed=11)
  expected = ids(reference.next_batch(200))
  run = PromptLoader(src, seed=11)
  got = ids(run.next_batch(50))        # into epoch 1
  state = json.loads(json.dumps(run.state_dict()))
  assert state == {"epoch": 1, "position": 13, "seed": 11}
  resumed = PromptLoader(src, seed=999)  # the checkpoint's seed wins
  resumed.load_state_dict(state)
  got += ids(resumed.next_batch(150))
  assert got == expected
  with pytest.raises(ValueError, match="position.*exceeds"):
    resumed.load_state_dict({"epoch": 0, "position": 38, "seed": 11})
  with pytest.raises(ValueError, match="lacks \\['seed'\\]"):
    resumed.load_state_dict({"epoch": 0, "position": 3})


def test_loader_shards_disjoint_and_cover_epoch():
  src = FakeSource(40)
  shards = [PromptLoader(src, seed=2, shard_index=i, num_shards=4) for i in range(4)]
  for _ in range(2):  # two epochs
    parts = [ids(s.next_batch(10)) for s in shards]
    assert sorted(sum(parts, [])) == list(range(40))
  # Uneven sizes: equal epoch lengths, disjoint, the remainder is skipped.
  odd = [PromptLoader(FakeSource(43), seed=2, shard_index=i, num_shards=4) for i in range(4)]
  parts = [ids(s.next_batch(10)) for s in odd]
  assert all(s.epoch_length == 10 for s in odd)
  assert len(set(sum(parts, []))) == 40
  with pytest.raises(ValueError, match="shard_index=4 must be < num_shards=4"):
    PromptLoader(src, seed=0, shard_index=4, num_shards=4)
  with pytest.raises(ValueError, match="fewer than num_shards"):
    PromptLoader(FakeSource(3), seed=0, num_shards=4)
  with pytest.raises(ValueError, match="seed must be an int >= 0"):
    PromptLoader(src, seed=-1)


def test_loader_over_prepared_split(tmp_path):
  src = load_split("synthetic", "train", str(tmp_path), **SMALL)
  loader = PromptLoader(src, seed=0)
  batch = loader.next_batch(4)
  assert all(isinstance(e["prompt"], str) and isinstance(e["id"], int) for e in batch)
  order = loader.epoch_order(0)[:4]
  assert ids(batch) == order.tolist()
  assert loader_lib.DataSource is type(src)


def test_preparing_a_dataset_says_one_line_and_nothing_about_downloads(tmp_path, capsys,
                                                                       caplog):
  """Offline data: no 'Downloading and preparing dataset Unknown size', no 400-character
  'Using custom data configuration' or 'Variant folder' warnings; one line instead."""
  import logging

  caplog.set_level(logging.INFO)
  load_split("synthetic", "test", str(tmp_path), num_train=20, num_test=5)
  out = capsys.readouterr().out
  assert "Downloading" not in out and "downloaded and prepared" not in out
  assert "preparing dataset synthetic_arithmetic (generated offline) in" in out
  assert "prepared dataset synthetic_arithmetic in" in out
  noise = [r.getMessage() for r in caplog.records
           if "custom data configuration" in r.getMessage() or "Variant folder" in r.getMessage()]
  assert not noise
  load_split("synthetic", "test", str(tmp_path), num_train=20, num_test=5)
  assert capsys.readouterr().out == ""                      # prepared: silent


def test_a_read_only_checkpoint_reader_logs_no_orbax_warnings(tmp_path, caplog):
  import logging

  from sagc_jax.runtime.checkpoint import Checkpointer

  Checkpointer(tmp_path / "ckpt").close()                   # creates the folder
  caplog.set_level(logging.INFO)
  reader = Checkpointer(tmp_path / "ckpt", read_only=True)
  assert reader.all_steps() == []
  assert not [r for r in caplog.records if "read only" in r.getMessage()
              or "save_interval_steps" in r.getMessage()]


def test_loader_limit_serves_only_the_first_examples():
  loader = PromptLoader(FakeSource(40), seed=3, limit=7)
  epochs = [ids(loader.next_batch(7)) for _ in range(3)]
  assert all(sorted(epoch) == list(range(7)) for epoch in epochs)    # each once an epoch
  with pytest.raises(ValueError, match="limit=41 is more than the source's 40"):
    PromptLoader(FakeSource(40), seed=3, limit=41)
