"""Records from local JSON Lines / parquet / JSON files, and the TFDS builder base that
converts them into prompt/answer examples.

Why one place: GSM8K, MATH and user datasets (``data.name`` ``jsonl`` / ``parquet``)
differ only in where their files are and how one record becomes an example. Reading the
files, naming the spot of a bad record (``path:line`` for JSON Lines, ``path row N`` for
parquet, 0-based), taking a text field, fingerprinting the sources (so that a changed file
re-prepares the dataset) and the TFDS plumbing are the same for all of them.
"""

from __future__ import annotations

import decimal
import hashlib
import importlib.util
import json
import math
import os
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from sagc_jax.data.synthetic import PlainModuleBuilder

__all__ = ["FileRecordsBuilder", "has_pyarrow", "read_records", "source_fingerprint",
           "text_field"]

Sources = dict[str, tuple[str, list[str]]]   # {split: (kind, paths)}


def has_pyarrow() -> bool:
  """Whether parquet files can be read (pyarrow comes with tensorflow-datasets)."""
  return importlib.util.find_spec("pyarrow") is not None


def read_records(kind: str, paths: list[str]) -> Iterator[tuple[str, Any]]:
  """``(location, record)`` pairs in file order; location names file and line / row.

  ``kind``: ``jsonl`` (one JSON value per non-blank line; location ``path:line``,
  1-based), ``parquet`` (location ``path row N``, 0-based) or ``json`` (one record per
  file; location ``path``).
  """
  for path in paths:
    if kind == "jsonl":
      # Bytes, decoded line by line: a text-mode file decodes ahead in 8 KiB chunks,
      # so a bad byte would be reported at the line before the chunk, not its own.
      with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
          try:
            line = raw.decode("utf-8")
          except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte {e.start + 1} of the "
                             "line; is it a JSON Lines file?)") from None
          if not line.strip():
            continue
          try:
            record = json.loads(line)
          except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
          yield f"{path}:{lineno}", record
    elif kind == "parquet":
      import pyarrow  # pylint: disable=g-import-not-at-top
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
      try:
        rows = pq.read_table(path).to_pylist()
      except pyarrow.ArrowException as e:
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None
      for row, record in enumerate(rows):
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


def _number_text(value: Any) -> str | None:
  """``42`` / ``42.0`` -> ``"42"``, ``0.5`` -> ``"0.5"``; None for NaN, inf, non-numbers.

  An integral float prints as an int because parquet writers store integer columns with
  missing values as floats, and ``exact_match`` compares the text ``"42"``.
  """
  if isinstance(value, bool):
    return None
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  if isinstance(value, (float, np.floating, decimal.Decimal)):
    if not math.isfinite(value):
      return None
    if value == int(value):
      return str(int(value))
    return str(value) if isinstance(value, decimal.Decimal) else repr(float(value))
  return None


def text_field(record: Any, key: str, location: str, *, numbers: bool = False) -> str:
  """Field ``key`` of a record as non-empty text; ValueError naming location and field.

  ``numbers``: ints and finite floats are accepted and written as text (``_number_text``).
  Null, lists, objects and booleans are refused rather than guessed at.
  """
  if not isinstance(record, dict):
    raise ValueError(f"{location}: expected a JSON object, got {type(record).__name__}")
  if key not in record:
    raise ValueError(f"{location}: field {key!r} is missing (fields present: {sorted(record)})")
  value = record[key]
  if isinstance(value, str):
    if not value.strip():
      raise ValueError(f"{location}: field {key!r} is empty")
    return value
  text = _number_text(value) if numbers else None
  if text is not None:
    return text
  if value is None:
    raise ValueError(f"{location}: field {key!r} is null")
  shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
  raise ValueError(f"{location}: field {key!r} must be a string"
                   f"{' or a number' if numbers else ''}, got {type(value).__name__} {shown}")


def source_fingerprint(kind: str, paths: list[str], manual_dir: str) -> str:
  """SHA-1 over the source files' relative names and contents (stale-cache check)."""
  digest = hashlib.sha1(kind.encode())
  for path in paths:
    digest.update(os.path.relpath(path, manual_dir).encode() + b"\0")
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
  return digest.hexdigest()


class FileRecordsBuilder(PlainModuleBuilder, tfds.core.GeneratorBasedBuilder,
                         skip_registration=True):
  """Converts the records of local files into ``{prompt, answer, solution, id}``.

  Subclasses say where each split's files are (``find_sources(root)``: ``{split: (kind,
  paths)}``, FileNotFoundError when there are none) and how one record becomes an example
  (``_convert``). ``root`` is the folder the files are found in and named relative to:
  ``dl_manager.manual_dir`` unless ``source_root`` says otherwise. Prepared data records
  ``fingerprint(root)`` in ``info.metadata``; ``loader.load_split`` compares it.
  """


  def find_sources(self, root: str) -> Sources:
    raise NotImplementedError

  def fingerprint(self, root: str, sources: Sources | None = None) -> str:
    """Fingerprint of all source files (``find_sources`` unless given)."""
    sources = self.find_sources(root) if sources is None else sources
    return hashlib.sha1("".join(
        f"{split}:{source_fingerprint(kind, paths, root)};"
        for split, (kind, paths) in sorted(sources.items())).encode()).hexdigest()

  def source_root(self, dl_manager) -> str:
    try:
      return os.fspath(dl_manager.manual_dir)
    except AssertionError as e:  # tfds: missing or empty manual dir
      raise FileNotFoundError(f"{self.name}: {e}") from None

  def _info(self) -> tfds.core.DatasetInfo:
    return self.example_info(metadata=tfds.core.MetadataDict())

  def _split_generators(self, dl_manager):
    root = self.source_root(dl_manager)
    sources = self.find_sources(root)
    self.info.metadata["source_fingerprint"] = self.fingerprint(root, sources)
    self.info.metadata["source_files"] = {
        split: [os.path.relpath(p, root) for p in paths]
        for split, (_, paths) in sources.items()}
    return {split: self._generate_examples(kind, paths)
            for split, (kind, paths) in sources.items()}

  def _generate_examples(self, kind: str, paths: list[str]):
    i = -1
    for i, (location, record) in enumerate(read_records(kind, paths)):
      try:
        example = self._convert(record, location)
      except ValueError as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith(location) else f"{location}: {msg}") from None
      yield i, {**example, "id": i}
    if i < 0:        # else TFDS fails later with "No examples were yielded", naming no file
      raise ValueError(f"{', '.join(paths)}: no records (the {kind} file"
                       f"{'s are' if len(paths) > 1 else ' is'} empty)")

  def _convert(self, record: Any, location: str) -> dict[str, str]:
    """``{prompt, answer, solution}`` of one source record (ValueError if malformed)."""
    raise NotImplementedError
