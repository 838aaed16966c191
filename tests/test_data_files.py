"""User prompt/answer datasets (data.name jsonl / parquet) and the Hugging Face MATH
layouts: round trips against the rows written here, glob order, splits, re-preparing on
changed files, one error per kind of bad input (file, line / row and field named), the
config keys and the run's data loading."""

import json
import os
from pathlib import Path

import pytest

from sagc_jax import config as config_lib
from sagc_jax.data import FILE_FORMATS, load_split
from sagc_jax.data.loader import DATASET_NAMES
from sagc_jax.data.local_math import BOXED_INSTRUCTION, MathLocal

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TEMPLATE = "Q: {prompt}\nPut the final answer within \\boxed{}."


def write_jsonl(path: Path, records, blank_after: int | None = None) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = [json.dumps(r) + "\n" for r in records]
  if blank_after is not None:
    lines.insert(blank_after, "\n")
  path.write_text("".join(lines))
  return path


def write_parquet(path: Path, records) -> Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.Table.from_pylist(records), path)
  return path


def expected(rows, template=None):
  """What the builder must produce for ``rows`` of (prompt, answer text), written out
  by hand rather than by the builder's code."""
  return [{"prompt": f"Q: {p}\nPut the final answer within \\boxed{{}}." if template else p,
           "answer": a, "solution": "", "id": i} for i, (p, a) in enumerate(rows)]


def load(name, split, tmp_path, manual="m", **options):
  options.setdefault("prompt_field", "question")
  return load_split(name, split, str(tmp_path / "tfds"),
                    None if manual is None else str(tmp_path / manual), **options)


# ------------------------------------------------------------------------- round trips
def test_jsonl_round_trip_globs_template_and_splits(tmp_path):
  m = tmp_path / "m"
  write_jsonl(m / "train" / "part-1.jsonl", [{"question": "3*4?", "answer": 12.0},
                                            {"question": "1-4?", "answer": -3}])
  write_jsonl(m / "train" / "part-0.jsonl", [{"question": "2+3?", "answer": 5, "x": [1]},
                                            {"question": "half of 1?", "answer": 0.5}],
              blank_after=1)
  write_jsonl(m / "extra.jsonl", [{"question": "7?", "answer": " 7 "}])
  write_jsonl(m / "held_out.jsonl", [{"question": "9+9?", "answer": "18"}])
  # part-0 is matched twice: read once, where its first pattern put it.
  options = dict(files=("train/*.jsonl", "extra.jsonl", "train/part-0.jsonl"),
                 eval_files=("held_out.jsonl",), prompt_template=TEMPLATE)
  train = load("jsonl", "train", tmp_path, **options)
  assert train[:] == expected([("2+3?", "5"), ("half of 1?", "0.5"), ("3*4?", "12"),
                               ("1-4?", "-3"), ("7?", "7")], TEMPLATE)
  assert load("jsonl", "test", tmp_path, **options)[:] == expected([("9+9?", "18")], TEMPLATE)
  # No eval_files: only a train split, and the eval split is a part of it.
  no_eval = dict(options, eval_files=())
  assert load("jsonl", "train[:2]", tmp_path, **no_eval)[:] == train[:2]
  with pytest.raises(ValueError, match=r"no split 'test'.*available: \['train'\]"):
    load("jsonl", "test", tmp_path, **no_eval)


def test_parquet_shards_and_plain_prompt(tmp_path):
  write_parquet(tmp_path / "m" / "data" / "train-00001-of-00002.parquet",
                [{"question": "b", "answer": 2.0}])
  write_parquet(tmp_path / "m" / "data" / "train-00000-of-00002.parquet",
                [{"question": "a", "answer": 1.0}, {"question": "c", "answer": 3.5}])
  write_parquet(tmp_path / "m" / "data" / "test-00000-of-00001.parquet",
                [{"question": "t", "answer": 9.0}])
  options = dict(files=("data/train-*.parquet",), eval_files=("data/test-*.parquet",))
  assert load("parquet", "train", tmp_path, **options)[:] == expected(
      [("a", "1"), ("c", "3.5"), ("b", "2")])
  assert load("parquet", "test", tmp_path, **options)[:] == expected([("t", "9")])


def test_patterns_relative_to_cwd_or_absolute(tmp_path, monkeypatch):
  write_jsonl(tmp_path / "m" / "a.jsonl", [{"question": "q", "answer": "1"}])
  monkeypatch.chdir(tmp_path)
  assert load("jsonl", "train", tmp_path, manual=None, files=("m/a.jsonl",))[:] == expected(
      [("q", "1")])
  absolute = str(tmp_path / "m" / "*.jsonl")
  assert len(load("jsonl", "train", tmp_path, manual="elsewhere", files=(absolute,))) == 1


def test_reprepares_when_files_change(tmp_path):
  m = tmp_path / "m"
  write_jsonl(m / "a.jsonl", [{"question": "q1", "answer": "1"}])
  options = dict(files=("*.jsonl",))
  assert load("jsonl", "train", tmp_path, **options)[:] == expected([("q1", "1")])
  prepared = sorted((tmp_path / "tfds" / "prompt_answer_files").iterdir())
  write_jsonl(m / "a.jsonl", [{"question": "q1", "answer": "2"}])           # edited
  assert load("jsonl", "train", tmp_path, **options)[:] == expected([("q1", "2")])
  write_jsonl(m / "b.jsonl", [{"question": "q2", "answer": "3"}])           # new match
  assert load("jsonl", "train", tmp_path, **options)[:] == expected([("q1", "2"),
                                                                      ("q2", "3")])
  # Same options: prepared in place; other options: a folder of their own.
  assert sorted((tmp_path / "tfds" / "prompt_answer_files").iterdir()) == prepared
  load("jsonl", "train", tmp_path, prompt_template=TEMPLATE, **options)
  assert len(list((tmp_path / "tfds" / "prompt_answer_files").iterdir())) == 2


# ------------------------------------------------------------------------------ errors
def test_jsonl_record_errors_name_file_line_and_field(tmp_path):
  bad = tmp_path / "m" / "bad.jsonl"
  ok = {"question": "q", "answer": "1"}
  cases = [
      ([ok, {"q": "x", "answer": "1"}],
       r"bad\.jsonl:3: field 'question' is missing \(fields present: \['answer', 'q'\]\)"),
      ([ok, {"question": "q", "answer": [1, 2]}],
       r"bad\.jsonl:3: field 'answer' must be a string or a number, got list \[1, 2\]"),
      ([{"question": "q", "answer": None}], r"bad\.jsonl:1: field 'answer' is null"),
      ([{"question": "q", "answer": True}], r"bad\.jsonl:1: field 'answer' .* got bool"),
      ([{"question": 5, "answer": "5"}],
       r"bad\.jsonl:1: field 'question' must be a string, got int"),
      ([{"question": "  ", "answer": "1"}], r"bad\.jsonl:1: field 'question' is empty"),
      ([["question", "answer"]], r"bad\.jsonl:1: expected a JSON object, got list"),
  ]
  for records, message in cases:
    write_jsonl(bad, records, blank_after=1 if len(records) > 1 else None)
    with pytest.raises(ValueError, match=message):
      load("jsonl", "train", tmp_path, files=("bad.jsonl",))
  bad.write_text(json.dumps(ok) + "\n{\"question\": \"q\", \"answer\": }\n")
  with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON"):
    load("jsonl", "train", tmp_path, files=("bad.jsonl",))
  # A byte that is not UTF-8 on line 201 is named at line 201 (not where a decoder
  # reading ahead in chunks happened to be).
  good = (json.dumps(ok) + "\n").encode() * 200
  bad.write_bytes(good + b'{"question": "caf\xe9", "answer": "1"}\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl:201: not UTF-8 text \(byte 18 of the line"):
    load("jsonl", "train", tmp_path, files=("bad.jsonl",))
  bad.write_text("\n\n")
  with pytest.raises(ValueError, match=r"bad\.jsonl: no records \(the jsonl file is empty\)"):
    load("jsonl", "train", tmp_path, files=("bad.jsonl",))
  # Fixed: the failed attempt left nothing that passes for prepared data.
  write_jsonl(bad, [ok])
  assert load("jsonl", "train", tmp_path, files=("bad.jsonl",))[:] == expected([("q", "1")])


def test_parquet_record_errors_name_file_row_and_field(tmp_path):
  path = write_parquet(tmp_path / "m" / "train.parquet",
                       [{"question": "a", "answer": 1}, {"question": "b", "answer": None}])
  with pytest.raises(ValueError, match=r"train\.parquet row 1: field 'answer' is null"):
    load("parquet", "train", tmp_path, files=("*.parquet",))
  write_parquet(path, [{"question": "a", "answer": [1]}])
  with pytest.raises(ValueError, match=r"train\.parquet row 0: field 'answer' .* got list"):
    load("parquet", "train", tmp_path, files=("*.parquet",))
  path.write_text("not parquet")
  with pytest.raises(ValueError, match=r"train\.parquet: not a readable parquet file"):
    load("parquet", "train", tmp_path, files=("*.parquet",))


def test_file_and_option_errors(tmp_path):
  write_jsonl(tmp_path / "m" / "a.jsonl", [{"question": "q", "answer": "1"}])
  with pytest.raises(FileNotFoundError,
                     match=r"data\.eval_files: the pattern 'nope/\*\.jsonl' matches no files "
                           r"\(relative to .*m\)"):
    load("jsonl", "train", tmp_path, files=("*.jsonl",), eval_files=("nope/*.jsonl",))
  write_parquet(tmp_path / "m" / "b.parquet", [{"question": "q", "answer": "1"}])
  with pytest.raises(ValueError, match=r"b\.parquet \(matched by '\*'\) is not a jsonl file"):
    load("jsonl", "train", tmp_path, files=("*",))
  with pytest.raises(ValueError, match=r"unknown jsonl option\(s\) \['prompt_fields'\]"):
    load("jsonl", "train", tmp_path, files=("*.jsonl",), prompt_fields="x")
  with pytest.raises(ValueError, match=r"prompt_template='Q: \{question\}'.*\{prompt\}"):
    load("jsonl", "train", tmp_path, files=("*.jsonl",), prompt_template="Q: {question}")


# ----------------------------------------------------------------- MATH on Hugging Face
MATH_ROWS = [
    {"problem": "Algebra 1?", "level": "Level 1", "type": "Algebra",
     "solution": "So $x = \\boxed{\\frac{1}{2}}$."},
    {"problem": "Algebra 2?", "level": "Level 2", "type": "Algebra",
     "solution": "It is \\boxed{3}."},
    {"problem": "Geometry 1?", "level": "Level 3", "type": "Geometry",
     "solution": "The area is $\\boxed{4\\pi}$."},
]
MATH_ANSWERS = ["\\frac{1}{2}", "3", "4\\pi"]


def test_math_data_subfolder_layout(tmp_path):
  write_parquet(tmp_path / "m" / "data" / "train-00000-of-00001.parquet", MATH_ROWS[:2])
  write_parquet(tmp_path / "m" / "data" / "test-00000-of-00001.parquet", MATH_ROWS[2:])
  train = load_split("math_local", "train", str(tmp_path / "tfds"), str(tmp_path / "m"))
  assert [e["answer"] for e in train] == MATH_ANSWERS[:2]
  assert train[0]["prompt"] == "Algebra 1?\n\n" + BOXED_INSTRUCTION
  test = load_split("math_local", "test", str(tmp_path / "tfds"), str(tmp_path / "m"))
  assert [e["answer"] for e in test] == MATH_ANSWERS[2:]


def test_math_subject_folders_layout(tmp_path):
  m = tmp_path / "m"
  write_parquet(m / "geometry" / "train-00000-of-00001.parquet", MATH_ROWS[2:])
  write_parquet(m / "algebra" / "train-00000-of-00001.parquet", MATH_ROWS[:2])
  write_parquet(m / "algebra" / "test-00000-of-00001.parquet", MATH_ROWS[1:2])
  write_parquet(m / ".cache" / "huggingface" / "train-00000-of-00001.parquet", MATH_ROWS)
  (m / "README.md").write_text("dataset card")
  train = load_split("math_local", "train", str(tmp_path / "tfds"), str(m))
  assert [e["prompt"].split("\n")[0] for e in train] == [r["problem"] for r in MATH_ROWS]
  assert [e["answer"] for e in train] == MATH_ANSWERS
  assert [e["id"] for e in train] == [0, 1, 2]
  test = load_split("math_local", "test", str(tmp_path / "tfds"), str(m))
  assert [e["answer"] for e in test] == ["3"]
  write_jsonl(m / "geometry" / "test.jsonl", MATH_ROWS[2:])
  with pytest.raises(ValueError, match="subject folders .* mix file kinds for split 'test'"):
    load_split("math_local", "test", str(tmp_path / "tfds"), str(m))
  assert "<subject>/train-*.parquet" in MathLocal.expected_files()
  assert "'data'" in MathLocal.expected_files()


# ---------------------------------------------------------------------- config and run
def files_config(tmp_path, **data):
  """A validated-size CPU config reading tmp_path/m/*.jsonl (eval on part of train)."""
  c = config_lib.preset("grpo", "static")
  c.data.update({**dict(name="jsonl", manual_dir=str(tmp_path / "m"), files=("*.jsonl",),
                        prompt_field="question", eval_split="train[:2]", eval_examples=2,
                        data_dir=str(tmp_path / "tfds")), **data})
  c.rollout.prompt_buckets = (64,)
  return c


def test_config_keys_and_validation(tmp_path):
  assert config_lib.DATASETS == DATASET_NAMES
  assert config_lib.FILE_DATASETS == FILE_FORMATS
  base = config_lib.base_config().data
  assert (base.files, base.eval_files, base.prompt_template) == ((), (), "")
  config_lib.validate(files_config(tmp_path))
  config_lib.validate(files_config(tmp_path, manual_dir=""))   # patterns from the cwd
  config_lib.validate(files_config(tmp_path, name="parquet", eval_split="test",
                                   eval_files=("test-*.parquet",)))
  cases = [
      (dict(files=()), r"data\.files=\(\) is empty: data\.name='jsonl'"),
      (dict(eval_split="test"), r"data\.eval_split='test': data\.eval_files is empty"),
      (dict(prompt_template="Q:"), r"data\.prompt_template='Q:' must be ''"),
      (dict(answer_field="question"), r"data\.answer_field='question' is also the prompt"),
      (dict(files=("gs://b/train.jsonl",)), r"data\.files=.*is a URL.*data\.manual_dir"),
      (dict(files=("",)), r"data\.files=\('',\): every glob pattern"),
      (dict(name="synthetic", manual_dir=""),
       r"data\.files, data\.prompt_field set but data\.name='synthetic' "
       r"does not read them"),
  ]
  for changes, message in cases:
    with pytest.raises(ValueError, match=message):
      config_lib.validate(files_config(tmp_path, **changes))
  synthetic = config_lib.base_config()
  synthetic.data.prompt_template = "Q: {prompt}"      # would be silently ignored
  with pytest.raises(ValueError, match=r"data\.prompt_template set but data\.name='synthetic'"):
    config_lib.validate(synthetic)


def test_run_inputs_reads_a_jsonl_dataset(tmp_path):
  from sagc_jax.training.inputs import build_run_inputs

  rows = [{"question": f"{a}+{b}=?", "answer": a + b} for a, b in ((1, 2), (3, 4), (5, 6))]
  write_jsonl(tmp_path / "m" / "train.jsonl", rows)
  config = files_config(tmp_path, prompt_template="{prompt}\n")
  config_lib.validate(config)
  inputs = build_run_inputs(config, tmp_path / "run", tmp_path / "cache", log=lambda _: None)
  try:
    want = [{"prompt": f"{r['question']}\n", "answer": str(r["answer"]), "solution": "",
             "id": i} for i, r in enumerate(rows)]
    assert inputs.train_source[:] == want
    assert inputs.eval_source[:] == want[:2]
    assert len(inputs.encode(inputs.train_source[:1])[0]) >= len(want[0]["prompt"])
  finally:
    inputs.close()
  assert os.path.isdir(tmp_path / "tfds" / "prompt_answer_files")
