"""User datasets: prompt/answer records in JSON Lines or parquet files named by globs.

Why: any task with a question and a checkable answer can train a policy; the user should
not have to write a builder for it. ``data.name`` ``jsonl`` / ``parquet`` picks the file
format, and the rest of the ``data`` section says where the records are and which fields
to read (``FilesSpec``, one field per config key):

* ``files``: glob patterns of the train split's files (``**`` spans folders). Relative
  patterns are resolved against ``data.manual_dir`` (so a gs:// folder staged there
  works), else the current directory; absolute ones are used as they are. Files are read
  pattern by pattern, each pattern's matches in name order, a file matched twice once.
  Every pattern must match at least one file.
* ``eval_files``: the same for the ``test`` split (the default ``data.eval_split``).
  Empty: there is no ``test`` split, and ``data.eval_split`` must be a part of train
  (``"train[:200]"``).
* ``prompt_field`` / ``answer_field``: the record fields read. The prompt must be a
  non-empty string; the answer a non-empty string or a number (``42`` and ``42.0`` become
  ``"42"``, what ``exact_match`` compares). Null, lists and objects are refused.
* ``prompt_template``: ``""`` = the prompt as is; else the template with every
  ``{prompt}`` replaced by the prompt. Other braces stay as written, so an instruction
  such as ``\\boxed{}`` needs no escaping (a ``str.format`` template would need ``{{}}``).

Examples have the features of every dataset here: ``prompt`` (templated), ``answer``
(stripped), ``solution`` (``""``: the records hold no reference solution, and the
supervised warm start is for the built-in task only) and ``id`` (index in the split).

Prepared data lives in ``<data_dir>/prompt_answer_files/<format>_<hash of the options>/``:
other options get their own folder, changed file contents re-prepare it (the
fingerprint of ``record_files``). Errors name the file, the line (JSON Lines, 1-based) or
row (parquet, 0-based) and the field.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from typing import Any

import tensorflow_datasets as tfds

from sagc_jax.data.record_files import FileRecordsBuilder, Sources, has_pyarrow, text_field

__all__ = ["FILE_FORMATS", "FilesSpec", "PromptAnswerFiles", "apply_template", "match_files"]

FILE_FORMATS = ("jsonl", "parquet")
# Extensions of the other format: a clearer error than the reader's on such a file.
_FOREIGN = {"jsonl": (".parquet",), "parquet": (".jsonl", ".json")}


def _patterns(key: str, value: Any) -> tuple[str, ...]:
  patterns = (value,) if isinstance(value, str) else tuple(value)
  for pattern in patterns:
    if not isinstance(pattern, str) or not pattern.strip():
      raise ValueError(f"{key}={value!r}: every glob pattern must be a non-empty string")
    if "://" in pattern:
      raise ValueError(f"{key}={value!r}: {pattern!r} is a URL; put the folder in "
                       "data.manual_dir (gs:// is copied to local disk) and give patterns "
                       "relative to it")
  return patterns


@dataclasses.dataclass(frozen=True)
class FilesSpec:
  """Where a user dataset's records are and which fields to read (module docstring).

  ValueError names the bad field as its ``data`` config key (without ``data.``).
  """

  format: str
  files: tuple[str, ...]
  eval_files: tuple[str, ...] = ()
  prompt_field: str = "prompt"
  answer_field: str = "answer"
  prompt_template: str = ""

  def __post_init__(self):
    if self.format not in FILE_FORMATS:
      raise ValueError(f"format={self.format!r} is not one of {FILE_FORMATS}")
    object.__setattr__(self, "files", _patterns("files", self.files))
    object.__setattr__(self, "eval_files", _patterns("eval_files", self.eval_files))
    if not self.files:
      raise ValueError(f"files=() is empty: data.name={self.format!r} reads the train split "
                       "from the files these glob patterns match")
    for key in ("prompt_field", "answer_field"):
      value = getattr(self, key)
      if not isinstance(value, str) or not value:
        raise ValueError(f"{key}={value!r} must be a non-empty field name")
    if self.prompt_field == self.answer_field:
      raise ValueError(f"answer_field={self.answer_field!r} is also the prompt_field")
    template = self.prompt_template
    if not isinstance(template, str) or (template and "{prompt}" not in template):
      raise ValueError(f"prompt_template={template!r} must be '' (the prompt as is) or a "
                       "text containing '{prompt}'")
    if self.format == "parquet" and not has_pyarrow():
      raise ValueError("format='parquet' needs pyarrow, which is not installed")

  @classmethod
  def option_names(cls) -> tuple[str, ...]:
    """The fields set from the ``data`` section (``format`` is ``data.name``)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "format")

  def name(self) -> str:
    """TFDS config name: the format and a hash of every option (one folder per spec)."""
    options = json.dumps(dataclasses.asdict(self), sort_keys=True)
    return f"{self.format}_{hashlib.sha1(options.encode()).hexdigest()[:16]}"


def apply_template(template: str, prompt: str) -> str:
  return template.replace("{prompt}", prompt) if template else prompt


def match_files(key: str, patterns: tuple[str, ...], root: str, kind: str) -> list[str]:
  """The files the glob ``patterns`` of config key ``key`` match (module docstring)."""
  paths: list[str] = []
  for pattern in patterns:
    full = os.path.join(glob.escape(root), os.path.expanduser(pattern))
    matches = sorted(os.path.abspath(p) for p in glob.glob(full, recursive=True)
                     if os.path.isfile(p))
    if not matches:
      where = "" if os.path.isabs(os.path.expanduser(pattern)) else f" (relative to {root})"
      raise FileNotFoundError(f"data.{key}: the pattern {pattern!r} matches no files{where}")
    for path in matches:
      if path.endswith(_FOREIGN[kind]):
        raise ValueError(f"data.{key}: {path} (matched by {pattern!r}) is not a {kind} "
                         f"file; data.name={kind!r} reads {kind} files only")
      if path not in paths:
        paths.append(path)
  return paths


@dataclasses.dataclass
class PromptFilesConfig(tfds.core.BuilderConfig):
  """TFDS builder config holding a ``FilesSpec``; named by ``FilesSpec.name``."""

  spec: FilesSpec | None = None


class PromptAnswerFiles(FileRecordsBuilder):
  """TFDS builder of a user dataset (``data.name`` jsonl / parquet; module docstring).

  ``PromptAnswerFiles(root=..., spec=FilesSpec(...), data_dir=...,
  file_format="array_record")``; ``root`` resolves relative patterns.
  """

  DESCRIPTION = "Prompt/answer records read from local JSON Lines or parquet files."

  def __init__(self, *, root: str, spec: FilesSpec, **kwargs):
    self.root = os.path.abspath(root)
    super().__init__(config=PromptFilesConfig(name=spec.name(), spec=spec,
                                              description=self.DESCRIPTION), **kwargs)

  @property
  def spec(self) -> FilesSpec:
    return self.builder_config.spec

  def source_root(self, dl_manager) -> str:
    del dl_manager  # patterns name the files; no manual dir needed
    return self.root

  def find_sources(self, root: str) -> Sources:
    kind = self.spec.format
    sources = {"train": (kind, match_files("files", self.spec.files, root, kind))}
    if self.spec.eval_files:
      sources["test"] = (kind, match_files("eval_files", self.spec.eval_files, root, kind))
    return sources

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    prompt = text_field(record, self.spec.prompt_field, location)
    answer = text_field(record, self.spec.answer_field, location, numbers=True).strip()
    return {"prompt": apply_template(self.spec.prompt_template, prompt), "answer": answer,
            "solution": ""}
