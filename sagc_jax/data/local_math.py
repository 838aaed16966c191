"""TFDS builders for GSM8K and MATH read from local files (``manual_dir``).

Why local files: training machines (and TPU pods) have no network access, and the
datasets ship in a few well-known layouts. The user copies the files once into a folder
and passes it as ``manual_dir``; the builders convert them to array_record so that every
run reads them the same way as the synthetic task (random access, no TensorFlow).

Layouts recognised (``{split}`` is ``train`` or ``test``; every split found is built,
at least one must be present):

* GSM8K (``Gsm8kLocal``): ``{split}.jsonl`` (the openai/grade-school-math files) or
  ``{split}-*.parquet`` (the Hugging Face ``openai/gsm8k`` repo's ``main/`` folder), in
  ``manual_dir`` or ``manual_dir/main``. Fields ``question`` and ``answer``; the
  reference answer is the text after the last ``####`` with thousands commas removed
  (``"... #### 1,234"`` -> ``"1234"``).
* MATH (``MathLocal``): ``{split}.jsonl`` or ``{split}-*.parquet`` in ``manual_dir``
  (also the MATH-500 ``test.jsonl``), or the original release's ``{split}/<subject>/*.json``
  files. Fields ``problem`` and ``solution``; the reference answer is the ``answer``
  field when present and non-empty, else the content of the last ``\\boxed{...}`` of the
  solution (braces balanced: ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``).

Features of both: ``prompt`` (the question plus an instruction to put the final answer in
``\\boxed{}``, which is what the math-verify reward reads), ``answer``, ``solution`` (the
reference solution text as given) and ``id`` (index in the split, in file order).
Parquet needs ``pyarrow`` (installed with tensorflow-datasets); without it only JSON
layouts work and the error says so.

A prepared dataset records a fingerprint of its source files (``info.metadata``);
``loader.load_split`` re-prepares it when the files in ``manual_dir`` change.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from sagc_jax.data.synthetic import PlainModuleCodePath
from sagc_jax.rewards import last_boxed_content

__all__ = [
    "BOXED_INSTRUCTION",
    "Gsm8kLocal",
    "MathLocal",
    "find_split_files",
    "gsm8k_reference_answer",
    "make_prompt",
    "math_reference_answer",
    "source_fingerprint",
]

SPLITS = ("train", "test")
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def make_prompt(question: str) -> str:
  return question.strip() + "\n\n" + BOXED_INSTRUCTION


def gsm8k_reference_answer(answer_text: str) -> str:
  """``"... #### 1,234"`` -> ``"1234"``; ValueError without a ``####`` marker."""
  if "####" not in answer_text:
    raise ValueError(f"GSM8K answer has no '####' marker: {answer_text[-80:]!r}")
  value = answer_text.rsplit("####", 1)[1].strip().replace(",", "")
  if not value:
    raise ValueError(f"GSM8K answer is empty after '####': {answer_text[-80:]!r}")
  return value


def math_reference_answer(record: dict[str, Any]) -> str:
  """The ``answer`` field if non-empty, else the last ``\\boxed{}`` of ``solution``."""
  answer = record.get("answer")
  if isinstance(answer, str) and answer.strip():
    return answer.strip()
  boxed = last_boxed_content(str(record.get("solution") or ""))
  if boxed is None or not boxed.strip():
    raise ValueError("MATH record has no 'answer' field and no \\boxed{...} in its solution")
  return boxed.strip()


# ------------------------------------------------------------------------ file layouts
def _has_pyarrow() -> bool:
  try:
    import pyarrow.parquet  # noqa: F401
  except ImportError:
    return False
  return True


def _expected_names(split: str, json_dirs: bool) -> list[str]:
  names = [f"{split}.jsonl", f"{split}-*.parquet", f"{split}.parquet"]
  if json_dirs:
    names.append(f"{split}/<subject>/*.json")
  return names


def find_split_files(manual_dir: str, split: str, subdirs: tuple[str, ...] = ("",),
                     json_dirs: bool = False) -> tuple[str, list[str]] | None:
  """``(kind, sorted paths)`` of a split's source files, kind in {jsonl, parquet, json}.

  Looks in ``manual_dir/<subdir>`` for each subdir in order; in each, JSONL first, then
  parquet, then (``json_dirs``) one JSON file per record under ``{split}/``. None if
  nothing matches.
  """
  for sub in subdirs:
    folder = os.path.join(manual_dir, sub) if sub else manual_dir
    if not os.path.isdir(folder):
      continue
    names = sorted(os.listdir(folder))
    if f"{split}.jsonl" in names:
      return "jsonl", [os.path.join(folder, f"{split}.jsonl")]
    parquet = [n for n in names if n.endswith(".parquet")
               and (n == f"{split}.parquet" or n.startswith(f"{split}-"))]
    if parquet:
      if not _has_pyarrow():
        raise ImportError(
            f"found parquet files {parquet} in {folder!r} but pyarrow is not installed; "
            f"install pyarrow or provide {split}.jsonl instead")
      return "parquet", [os.path.join(folder, n) for n in parquet]
    split_dir = os.path.join(folder, split)
    if json_dirs and os.path.isdir(split_dir):
      paths = sorted(os.path.join(root, n) for root, _, files in os.walk(split_dir)
                     for n in files if n.endswith(".json"))
      if paths:
        return "json", paths
  return None


def _read_records(kind: str, paths: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
  """``(location, record)`` pairs in file order; location names file and line / row."""
  for path in paths:
    if kind == "jsonl":
      with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
          if not line.strip():
            continue
          try:
            record = json.loads(line)
          except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
          yield f"{path}:{lineno}", record
    elif kind == "parquet":
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
      for row, record in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path} row {row}", record
    elif kind == "json":
      with open(path, encoding="utf-8") as f:
        try:
          record = json.load(f)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}: invalid JSON ({e.msg})") from None
      yield path, record
    else:
      raise ValueError(f"unknown file kind {kind!r}")


def _field(record: Any, key: str, location: str) -> str:
  if not isinstance(record, dict):
    raise ValueError(f"{location}: expected a JSON object, got {type(record).__name__}")
  value = record.get(key)
  if not isinstance(value, str):
    raise ValueError(f"{location}: field {key!r} is missing or not a string "
                     f"(fields present: {sorted(record)})")
  return value


def source_fingerprint(kind: str, paths: list[str], manual_dir: str) -> str:
  """SHA-1 over the source files' relative names and contents (stale-cache check)."""
  digest = hashlib.sha1(kind.encode())
  for path in paths:
    digest.update(os.path.relpath(path, manual_dir).encode() + b"\0")
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()


# --------------------------------------------------------------------------- builders
class _LocalMathBuilder(PlainModuleCodePath, tfds.core.GeneratorBasedBuilder,
                        skip_registration=True):
  """Shared machinery: find the files of each split, convert records, fingerprint."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  SUBDIRS: tuple[str, ...] = ("",)
  JSON_DIRS = False
  DESCRIPTION = ""

  @classmethod
  def expected_files(cls) -> str:
    where = " or ".join(repr(s or ".") for s in cls.SUBDIRS)
    names = ", ".join(n for split in SPLITS for n in _expected_names(split, cls.JSON_DIRS))
    return f"one of {names} (in {where} of the manual dir)"

  @classmethod
  def find_sources(cls, manual_dir: str) -> dict[str, tuple[str, list[str]]]:
    """``{split: (kind, paths)}`` of the splits present; FileNotFoundError if none."""
    if not os.path.isdir(manual_dir):
      raise FileNotFoundError(
          f"{cls.name}: manual_dir {manual_dir!r} does not exist; it must hold "
          f"{cls.expected_files()}")
    found = {}
    for split in SPLITS:
      files = find_split_files(manual_dir, split, cls.SUBDIRS, cls.JSON_DIRS)
      if files is not None:
        found[split] = files
    if not found:
      extra = "" if _has_pyarrow() else " (pyarrow is not installed: JSON layouts only)"
      raise FileNotFoundError(
          f"{cls.name}: no data files in manual_dir {manual_dir!r}; expected "
          f"{cls.expected_files()}{extra}; found {sorted(os.listdir(manual_dir))[:20]}")
    return found

  @classmethod
  def fingerprint(cls, manual_dir: str,
                  sources: dict[str, tuple[str, list[str]]] | None = None) -> str:
    """Fingerprint of all source files (``find_sources`` unless given)."""
    sources = cls.find_sources(manual_dir) if sources is None else sources
    return hashlib.sha1("".join(
        f"{split}:{source_fingerprint(kind, paths, manual_dir)};"
        for split, (kind, paths) in sorted(sources.items())).encode()).hexdigest()

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "prompt": tfds.features.Text(),
            "answer": tfds.features.Text(),
            "solution": tfds.features.Text(),
            "id": np.int64,
        }),
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    try:
      manual_dir = os.fspath(dl_manager.manual_dir)
    except AssertionError as e:  # tfds: missing or empty manual dir
      raise FileNotFoundError(f"{self.name}: {e}") from None
    sources = self.find_sources(manual_dir)
    self.info.metadata["source_fingerprint"] = self.fingerprint(manual_dir, sources)
    self.info.metadata["source_files"] = {
        split: [os.path.relpath(p, manual_dir) for p in paths]
        for split, (_, paths) in sources.items()}
    return {split: self._generate_examples(kind, paths)
            for split, (kind, paths) in sources.items()}

  def _generate_examples(self, kind: str, paths: list[str]):
    for i, (location, record) in enumerate(_read_records(kind, paths)):
      try:
        example = self._convert(record, location)
      except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith(location) else f"{location}: {msg}") from None
      yield i, {**example, "id": i}

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    """``{prompt, answer, solution}`` of one source record (ValueError if malformed)."""
    raise NotImplementedError


class Gsm8kLocal(_LocalMathBuilder):
  """GSM8K from local JSONL / parquet files (see the module docstring)."""

  SUBDIRS = ("", "main")
  DESCRIPTION = "GSM8K grade-school math word problems, read from local files."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put GSM8K's train.jsonl / test.jsonl (fields 'question', 'answer' ending in "
      "'#### N'), or the Hugging Face openai/gsm8k main/train-*.parquet / "
      "test-*.parquet files, in the manual dir (or its main/ subfolder).")

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    question = _field(record, "question", location)
    solution = _field(record, "answer", location)
    return {"prompt": make_prompt(question), "answer": gsm8k_reference_answer(solution),
            "solution": solution}


class MathLocal(_LocalMathBuilder):
  """MATH (Hendrycks et al.) / MATH-500 from local files (see the module docstring)."""

  JSON_DIRS = True
  DESCRIPTION = "MATH competition problems, read from local files."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put MATH's train.jsonl / test.jsonl (fields 'problem', 'solution', optional "
      "'answer'), train-*.parquet / test-*.parquet, or the original release's "
      "train/<subject>/*.json and test/<subject>/*.json in the manual dir.")

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    problem = _field(record, "problem", location)
    solution = record.get("solution") if isinstance(record, dict) else None
    answer = math_reference_answer(record)
    return {"prompt": make_prompt(problem), "answer": answer,
            "solution": solution if isinstance(solution, str) else ""}
