"""Random-access splits of the TFDS builders and a resumable, shardable prompt iterator.

Why this shape: RL training draws P prompts per step (P changes with the group size
chosen by SAGC), checkpoints every N steps and must resume on exactly the examples an
uninterrupted run would have seen. A random-access source (array_record via
``as_data_source``, no TensorFlow needed) plus an explicit, seeded per-epoch permutation
makes the iterator position two integers (epoch, position) that fit in a JSON checkpoint.

* ``load_split(name, split, data_dir, manual_dir=None, **builder_kwargs)`` prepares the
  builder in ``data_dir`` if needed (array_record) and returns a ``DataSource``: ``len``
  and ``source[i]`` -> ``{"prompt": str, "answer": str, "solution": str, "id": int}``.
  ``builder_options(config.data)`` gives the ``builder_kwargs`` of a run's config.
* ``PromptLoader(source, seed, shard_index=0, num_shards=1, limit=0)`` serves examples in a
  fresh permutation every epoch, drawn from ``(seed, epoch)``; ``limit`` > 0 serves only the
  source's first ``limit`` examples (a few prompts that recur, each keeping its id). With
  several shards (one per process in multi-host training) every epoch's permutation is cut into ``num_shards``
  equal contiguous slices; the ``len(source) % num_shards`` leftover examples of that
  epoch's permutation are skipped, so every shard has the same epoch length and the
  processes stay in lockstep (a different handful is skipped each epoch).
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import io
import logging
import os
import re
import time
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

from sagc_jax.data.local_math import Gsm8kLocal, MathLocal
from sagc_jax.data.prompt_files import FILE_FORMATS, FilesSpec, PromptAnswerFiles
from sagc_jax.data.word_problems import WordProblems
from sagc_jax.data.synthetic import (SyntheticArithmetic, SyntheticConfig,
                                     builder_config_for)

__all__ = ["DATASET_NAMES", "DataSource", "PromptLoader", "builder_options", "load_split",
           "make_builder"]

DATASET_NAMES = ("synthetic", "word_problems", "gsm8k_local", "math_local") + FILE_FORMATS
_LOCAL_BUILDERS = {"gsm8k_local": Gsm8kLocal, "math_local": MathLocal}
_FILE_FORMAT = "array_record"  # random access without TensorFlow (tfrecord needs tf.data)


# ----------------------------------------------------------------------- data source
def _to_python(value: Any) -> Any:
  """A record's field as a plain str / int (numpy scalars and bytes unwrapped)."""
  if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else value


class DataSource(collections.abc.Sequence):
  """A prepared split: ``len`` and ``source[i]`` -> plain dict (str texts, int id)."""

  def __init__(self, source: Sequence[Any], name: str, split: str):
    self._source = source
    self.name = name
    self.split = split

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
      raise TypeError(f"index must be an int or a slice, got {type(index).__name__}")
    n = len(self)
    i = int(index) + n if index < 0 else int(index)
    if not 0 <= i < n:
      raise IndexError(f"index {int(index)} out of range for {self.name}/{self.split} "
                       f"with {n} examples")
    return {k: _to_python(v) for k, v in self._source[i].items()}

  def __repr__(self) -> str:
    return f"DataSource({self.name}/{self.split}, {len(self)} examples)"


# --------------------------------------------------------------------------- builders
def _synthetic_config(kwargs: dict[str, Any]) -> SyntheticConfig:
  """SyntheticConfig from ``config=`` (a SyntheticConfig or a mapping) and/or fields."""
  base = kwargs.pop("config", None) or SyntheticConfig()
  if isinstance(base, Mapping):
    base, kwargs = SyntheticConfig(), {**base, **kwargs}
  elif not isinstance(base, SyntheticConfig):
    raise ValueError(f"synthetic config must be a SyntheticConfig or a mapping, "
                     f"got {type(base).__name__}")
  fields = [f.name for f in dataclasses.fields(SyntheticConfig)]
  unknown = sorted(set(kwargs) - set(fields))
  if unknown:
    raise ValueError(f"unknown synthetic option(s) {unknown}; allowed: ['config'] + {fields}")
  return dataclasses.replace(base, **kwargs)


def builder_options(data: Any) -> dict[str, Any]:
  """The ``load_split`` builder options of a run's ``config.data`` section."""
  if data.name == "synthetic":
    return {"config": dict(data.synthetic)}
  if data.name in FILE_FORMATS:
    return {key: getattr(data, key) for key in FilesSpec.option_names()}
  return {}


def make_builder(name: str, data_dir: str, **builder_kwargs) -> tfds.core.DatasetBuilder:
  """The TFDS builder of dataset ``name`` rooted at ``data_dir`` (array_record).

  ``jsonl`` / ``parquet`` take the ``FilesSpec`` fields and ``root`` (the folder relative
  patterns are resolved against; default: the current directory).
  """
  if name not in DATASET_NAMES:
    raise ValueError(f"unknown dataset {name!r}; allowed: {list(DATASET_NAMES)}")
  data_dir = os.fspath(data_dir)
  if name == "synthetic":
    cfg = _synthetic_config(dict(builder_kwargs))
    return SyntheticArithmetic(data_dir=data_dir, config=builder_config_for(cfg),
                               file_format=_FILE_FORMAT)
  if name in FILE_FORMATS:
    kwargs = dict(builder_kwargs)
    root = kwargs.pop("root", None) or os.curdir
    unknown = sorted(set(kwargs) - set(FilesSpec.option_names()))
    if unknown:
      raise ValueError(f"unknown {name} option(s) {unknown}; allowed: "
                       f"{['root', *FilesSpec.option_names()]}")
    return PromptAnswerFiles(root=root, spec=FilesSpec(format=name, **kwargs),
                             data_dir=data_dir, file_format=_FILE_FORMAT)
  if builder_kwargs:
    raise ValueError(f"{name} takes no builder options, got {sorted(builder_kwargs)}")
  if name == "word_problems":
    return WordProblems(data_dir=data_dir, file_format=_FILE_FORMAT)
  return _LOCAL_BUILDERS[name](data_dir=data_dir, file_format=_FILE_FORMAT)


def _prepare_local(name: str, builder: tfds.core.DatasetBuilder,
                   manual_dir: str | None) -> None:
  """Prepares a local-file dataset, re-preparing when the source files changed."""
  if manual_dir is None:
    if not builder.is_prepared():
      raise FileNotFoundError(
          f"{name} is not prepared in {builder.data_dir!r}; pass manual_dir=<folder with "
          f"{builder.expected_files()}>")
    return  # read what was prepared earlier
  manual_dir = os.fspath(manual_dir)
  fingerprint = builder.fingerprint(manual_dir)  # also checks the folder and its files
  config = tfds.download.DownloadConfig(manual_dir=manual_dir)
  if builder.is_prepared():
    if builder.info.metadata.get("source_fingerprint") == fingerprint:
      return
    logging.warning("%s: the files in %s changed since %s was prepared; re-preparing it",
                    name, manual_dir, builder.data_dir)
    config = tfds.download.DownloadConfig(  # regenerate the dataset
        manual_dir=manual_dir, download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS)
  prepare_quietly(builder, f"from the files in {manual_dir}", download_config=config)


@contextlib.contextmanager
def tfds_quiet():
  """TFDS' own output off: it prints "Downloading and preparing dataset Unknown size
  ..." even for data generated offline or read from local files (nothing is
  downloaded here), and logs a 400-character "Using custom data configuration" and a
  "Variant folder ... has no dataset_info.json" warning per builder. Errors still
  show; ``prepare_quietly`` says in one line what happens instead."""
  quiet = [logging.getLogger(name) for name in ("absl", "tensorflow_datasets")]
  levels = [logger.level for logger in quiet]
  for logger in quiet:
    logger.setLevel(logging.ERROR)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    for logger, level in zip(quiet, levels):
      logger.setLevel(level)


def prepare_quietly(builder: tfds.core.DatasetBuilder, source: str, **kwargs) -> None:
  """``builder.download_and_prepare(**kwargs)`` with one line before and one after
  instead of TFDS' output (``tfds_quiet``)."""
  print(f"preparing dataset {builder.name} {source} in {builder.data_dir} ...", flush=True)
  start = time.perf_counter()
  with tfds_quiet():
    builder.download_and_prepare(**kwargs)  # format: set by make_builder
  print(f"prepared dataset {builder.name} in {time.perf_counter() - start:.1f} s", flush=True)


def _quiet_builder(name: str, data_dir: str, manual_dir: str | None,
                   builder_kwargs: dict[str, Any]) -> tuple[tfds.core.DatasetBuilder, str | None]:
  """(builder, manual_dir): the files of ``jsonl`` / ``parquet`` are found relative to
  ``manual_dir``, which defaults to the current directory."""
  if name in FILE_FORMATS:
    manual_dir = os.path.abspath(manual_dir or os.curdir)
    builder_kwargs = {**builder_kwargs, "root": manual_dir}
  with tfds_quiet():
    return make_builder(name, data_dir, **builder_kwargs), manual_dir


def example_location(name: str, split: str, index: int, data_dir: str,
                     manual_dir: str | None = None, **builder_kwargs) -> str | None:
  """Where example ``index`` (its ``id``) of a split was read from: ``FILE:LINE``,
  ``FILE row R`` or ``FILE`` for the datasets built from files; None for generated
  ones (or when the files are gone). Re-reads the split's files up to that record:
  for error messages only."""
  from sagc_jax.data.record_files import FileRecordsBuilder, read_records

  builder, manual_dir = _quiet_builder(name, data_dir, manual_dir, builder_kwargs)
  if not isinstance(builder, FileRecordsBuilder) or not manual_dir or index < 0:
    return None
  try:
    kind, paths = builder.find_sources(manual_dir)[split.split("[")[0]]
    for i, (location, _) in enumerate(read_records(kind, paths)):
      if i == index:
        return location
  except (OSError, KeyError, ValueError):
    return None
  return None


def load_split(name: str, split: str, data_dir: str, manual_dir: str | None = None,
               **builder_kwargs) -> DataSource:
  """A random-access split of dataset ``name``, prepared in ``data_dir`` if needed.

  Args:
    name: one of ``DATASET_NAMES``.
    split: ``"train"`` or ``"test"`` (TFDS slicing such as ``"test[:100]"`` works).
    data_dir: TFDS data root; prepared data is reused across runs.
    manual_dir: folder with the source files of ``gsm8k_local`` / ``math_local``
      (optional once prepared; when given, a change in its files triggers re-preparing);
      for ``jsonl`` / ``parquet`` the folder relative patterns are resolved against
      (default: the current directory; their files are always checked for changes).
      Must be None for ``synthetic`` and ``word_problems``.
    **builder_kwargs: for ``synthetic``, ``config=SyntheticConfig(...)`` (or a mapping)
      and/or individual SyntheticConfig fields (``num_train=2000, seed=1``); for
      ``jsonl`` / ``parquet`` the ``FilesSpec`` fields (``files=("train.jsonl",),
      prompt_field="question"``).
  """
  builder, manual_dir = _quiet_builder(name, data_dir, manual_dir, builder_kwargs)
  if name in ("synthetic", "word_problems"):
    if manual_dir is not None:
      raise ValueError(f"{name} is generated offline and takes no manual_dir "
                       f"(got {manual_dir!r})")
    with tfds_quiet():
      prepared = builder.is_prepared()
    if not prepared:
      prepare_quietly(builder, "(generated offline)")
  else:
    _prepare_local(name, builder, manual_dir)
  base = re.match(r"\w+", split)
  available = sorted(builder.info.splits.keys())
  if base is None or base.group(0) not in available:
    raise ValueError(f"{name} has no split {split!r} in {builder.data_dir!r}; "
                     f"available: {available}")
  return DataSource(builder.as_data_source(split=split), name, split)


# ----------------------------------------------------------------------- prompt loader
def _check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
  return int(value)


class PromptLoader:
  """Deterministic, resumable, shardable iterator over a random-access source.

  Epoch ``e`` serves this shard's slice of ``default_rng((seed, e)).permutation(n)``.
  ``state_dict()`` is ``{"epoch", "position", "seed"}``: position counts the examples of
  the current epoch already served by this shard.
  """

  def __init__(self, source: Sequence[Any], seed: int, shard_index: int = 0,
               num_shards: int = 1, limit: int = 0):
    self.source = source
    self.seed = _check_int("seed", seed, 0)
    self.num_shards = _check_int("num_shards", num_shards, 1)
    self.shard_index = _check_int("shard_index", shard_index, 0)
    if self.shard_index >= self.num_shards:
      raise ValueError(f"shard_index={shard_index} must be < num_shards={num_shards}")
    self.num_examples = len(source)
    if _check_int("limit", limit, 0) > self.num_examples:
      raise ValueError(f"limit={limit} is more than the source's {self.num_examples} examples")
    self.num_examples = limit or self.num_examples
    if self.num_examples < self.num_shards:
      raise ValueError(f"source has {self.num_examples} examples, fewer than "
                       f"num_shards={self.num_shards}: every shard needs at least one")
    self.epoch_length = self.num_examples // self.num_shards
    self._epoch = 0
    self._position = 0
    self._order: np.ndarray | None = None

  def epoch_order(self, epoch: int) -> np.ndarray:
    """Source indices this shard serves in ``epoch``, in order."""
    perm = np.random.default_rng((self.seed, _check_int("epoch", epoch, 0))).permutation(
        self.num_examples)
    start = self.shard_index * self.epoch_length
    return perm[start:start + self.epoch_length]

  def next_indices(self, n: int) -> list[int]:
    """The source indices of the next ``n`` examples (advances the iterator)."""
    n = _check_int("n", n, 0)
    out: list[int] = []
    while len(out) < n:
      if self._position == self.epoch_length:
        self._epoch += 1
        self._position = 0
        self._order = None
      if self._order is None:
        self._order = self.epoch_order(self._epoch)
      take = min(n - len(out), self.epoch_length - self._position)
      out.extend(int(i) for i in self._order[self._position:self._position + take])
      self._position += take
    return out

  def peek_indices(self, n: int) -> list[int]:
    """The source indices ``next_indices(n)`` would return, without advancing."""
    saved = (self._epoch, self._position, self._order)
    try:
      return self.next_indices(n)
    finally:
      self._epoch, self._position, self._order = saved

  def next_batch(self, n: int) -> list[dict]:
    """The next ``n`` examples, crossing epoch boundaries seamlessly."""
    return [self.source[i] for i in self.next_indices(n)]

  def state_dict(self) -> dict[str, int]:
    return {"epoch": self._epoch, "position": self._position, "seed": self.seed}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Continues from ``state`` (its seed wins: the checkpoint defines the order)."""
    missing = sorted({"epoch", "position", "seed"} - set(state))
    if missing:
      raise ValueError(f"PromptLoader state lacks {missing}; got keys {sorted(state)}")
    epoch = _check_int("state['epoch']", state["epoch"], 0)
    position = _check_int("state['position']", state["position"], 0)
    if position > self.epoch_length:
      raise ValueError(f"state['position']={position} exceeds the epoch length "
                       f"{self.epoch_length} of this shard (did the dataset change?)")
    self.seed = _check_int("state['seed']", state["seed"], 0)
    self._epoch, self._position, self._order = epoch, position, None
