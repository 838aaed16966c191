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
* MATH (``MathLocal``): ``{split}.jsonl`` or ``{split}-*.parquet`` in ``manual_dir`` or
  ``manual_dir/data`` (also the MATH-500 ``test.jsonl``), the original release's
  ``{split}/<subject>/*.json`` files, or, failing those, the same JSONL / parquet names in
  one subfolder per subject (Hugging Face EleutherAI/hendrycks_math:
  ``algebra/train-00000-of-00001.parquet``, ``geometry/test-...``; subjects in name order,
  hidden folders such as ``.cache/`` skipped). Fields ``problem`` and ``solution``; the
  reference answer is the ``answer`` field when present and non-empty, else the content
  of the last ``\\boxed{...}`` of the solution (braces balanced:
  ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``).

Features of both: ``prompt`` (the question plus an instruction to put the final answer in
``\\boxed{}``, which is what the math-verify reward reads), ``answer``, ``solution`` (the
reference solution text as given) and ``id`` (index in the split, in file order).
Parquet needs ``pyarrow`` (installed with tensorflow-datasets); without it only JSON
layouts work and the error says so.

A prepared dataset records a fingerprint of its source files (``info.metadata``);
``loader.load_split`` re-prepares it when the files in ``manual_dir`` change. Reading the
files and the TFDS plumbing are shared with user datasets (``record_files.py``).
"""

from __future__ import annotations

import os
from typing import Any

from sagc_jax.data.record_files import FileRecordsBuilder, Sources, has_pyarrow, text_field
from sagc_jax.rewards.verifiers import last_boxed_content

__all__ = ["BOXED_INSTRUCTION", "Gsm8kLocal", "MathLocal", "gsm8k_reference_answer",
           "make_prompt", "math_reference_answer"]

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
def _files_in(folder: str, split: str) -> tuple[str, list[str]] | None:
  """``{split}.jsonl``, else ``{split}.parquet`` / ``{split}-*.parquet``, in ``folder``."""
  names = sorted(os.listdir(folder))
  if f"{split}.jsonl" in names:
    return "jsonl", [os.path.join(folder, f"{split}.jsonl")]
  parquet = [n for n in names if n.endswith(".parquet")
             and (n == f"{split}.parquet" or n.startswith(f"{split}-"))]
  if not parquet:
    return None
  if not has_pyarrow():
    raise ImportError(
        f"found parquet files {parquet} in {folder!r} but pyarrow is not installed; "
        f"install pyarrow or provide {split}.jsonl instead")
  return "parquet", [os.path.join(folder, n) for n in parquet]


def _subject_files(manual_dir: str, split: str) -> tuple[str, list[str]] | None:
  """A split's files one folder down, in every subject folder (name order), as in the
  Hugging Face EleutherAI/hendrycks_math repo (``algebra/train-00000-of-00001.parquet``)."""
  found = []
  for name in sorted(os.listdir(manual_dir)):
    folder = os.path.join(manual_dir, name)
    if not name.startswith(".") and os.path.isdir(folder):  # skip .cache/ of HF downloads
      files = _files_in(folder, split)
      if files is not None:
        found.append((name, files))
  kinds = {kind for _, (kind, _) in found}
  if len(kinds) > 1:
    raise ValueError(f"the subject folders of {manual_dir!r} mix file kinds for split "
                     f"{split!r}: {[(name, kind) for name, (kind, _) in found]}")
  return (kinds.pop(), [p for _, (_, paths) in found for p in paths]) if found else None


# --------------------------------------------------------------------------- builders
class _LocalMathBuilder(FileRecordsBuilder, skip_registration=True):
  """Shared machinery: the known layouts of each split's files in the manual dir."""

  SUBDIRS: tuple[str, ...] = ("",)
  JSON_DIRS = False
  SUBJECT_DIRS = False

  @classmethod
  def expected_files(cls) -> str:
    where = " or ".join(repr(s or ".") for s in cls.SUBDIRS)
    names = []
    for split in SPLITS:
      names += [f"{split}.jsonl", f"{split}-*.parquet", f"{split}.parquet"]
      if cls.JSON_DIRS:
        names.append(f"{split}/<subject>/*.json")
      if cls.SUBJECT_DIRS:
        names.append(f"<subject>/{split}-*.parquet")
    return f"one of {', '.join(names)} (in {where} of the manual dir)"

  @classmethod
  def split_files(cls, manual_dir: str, split: str) -> tuple[str, list[str]] | None:
    """``(kind, sorted paths)`` of a split's source files, kind in {jsonl, parquet, json}.

    Looks in ``manual_dir/<subdir>`` for each of ``SUBDIRS`` in order; in each, JSONL
    first, then parquet, then (``JSON_DIRS``) one JSON file per record under
    ``{split}/``. If none of them has the split and ``SUBJECT_DIRS``: the JSONL /
    parquet names one level down, in every subfolder of ``manual_dir``
    (``_subject_files``). None if nothing matches.
    """
    for sub in cls.SUBDIRS:
      folder = os.path.join(manual_dir, sub) if sub else manual_dir
      if not os.path.isdir(folder):
        continue
      files = _files_in(folder, split)
      if files is not None:
        return files
      split_dir = os.path.join(folder, split)
      if cls.JSON_DIRS and os.path.isdir(split_dir):
        paths = sorted(os.path.join(root, n) for root, _, files in os.walk(split_dir)
                       for n in files if n.endswith(".json"))
        if paths:
          return "json", paths
    return _subject_files(manual_dir, split) if cls.SUBJECT_DIRS else None

  @classmethod
  def find_sources(cls, manual_dir: str) -> Sources:
    """``{split: (kind, paths)}`` of the splits present; FileNotFoundError if none."""
    if not os.path.isdir(manual_dir):
      raise FileNotFoundError(
          f"{cls.name}: manual_dir {manual_dir!r} does not exist; it must hold "
          f"{cls.expected_files()}")
    found = {split: files for split in SPLITS
             if (files := cls.split_files(manual_dir, split)) is not None}
    if not found:
      extra = "" if has_pyarrow() else " (pyarrow is not installed: JSON layouts only)"
      raise FileNotFoundError(
          f"{cls.name}: no data files in manual_dir {manual_dir!r}; expected "
          f"{cls.expected_files()}{extra}; found {sorted(os.listdir(manual_dir))[:20]}")
    return found


class Gsm8kLocal(_LocalMathBuilder):
  """GSM8K from local JSONL / parquet files (see the module docstring)."""

  SUBDIRS = ("", "main")
  DESCRIPTION = "GSM8K grade-school math word problems, read from local files."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put GSM8K's train.jsonl / test.jsonl (fields 'question', 'answer' ending in "
      "'#### N'), or the Hugging Face openai/gsm8k main/train-*.parquet / "
      "test-*.parquet files, in the manual dir (or its main/ subfolder).")

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    question = text_field(record, "question", location)
    solution = text_field(record, "answer", location)
    return {"prompt": make_prompt(question), "answer": gsm8k_reference_answer(solution),
            "solution": solution}


class MathLocal(_LocalMathBuilder):
  """MATH (Hendrycks et al.) / MATH-500 from local files (see the module docstring)."""

  SUBDIRS = ("", "data")
  JSON_DIRS = True
  SUBJECT_DIRS = True
  DESCRIPTION = "MATH competition problems, read from local files."
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Put MATH's train.jsonl / test.jsonl (fields 'problem', 'solution', optional "
      "'answer'), train-*.parquet / test-*.parquet (also in a data/ subfolder, or in one "
      "subfolder per subject: algebra/train-*.parquet, ...), or the original release's "
      "train/<subject>/*.json and test/<subject>/*.json in the manual dir.")

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    problem = text_field(record, "problem", location)
    solution = record.get("solution")        # ``text_field`` checked it is an object
    answer = math_reference_answer(record)
    return {"prompt": make_prompt(problem), "answer": answer,
            "solution": solution if isinstance(solution, str) else ""}
