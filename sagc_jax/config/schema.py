"""The training config as users write it: an ml_collections ``ConfigDict`` with every
key and its default.

Config files in ``configs/`` start from ``base_config()`` (or a preset of
``config.presets``) and override what they change; every key can be overridden on
the command line (``--config.learner.lr=1e-6``). The keys, their defaults and their
meaning are the typed sections' (``config.sections``; the learner's are
``rl.config.LearnerConfig``'s): this module only turns them into a ConfigDict, so a
default is written once. ``config.run_config`` turns the result back into checked
typed sections. Imports no JAX.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from sagc_jax.config.sections import SECTIONS
from sagc_jax.rl.config import DERIVED_FIELDS, PRESET_FIELDS, LearnerConfig

# ``None`` defaults become typed placeholders, so that the command line can set them
# (--config.controller.initial_g=8, --config.learner.clip_c=3.0).
_PLACEHOLDER_TYPES = {"int | None": int, "float | None": float}


def _section(cls) -> ml_collections.ConfigDict:
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(cls):
    value = (field.default_factory() if field.default is dataclasses.MISSING
             else field.default)
    if value is None:
      value = config_dict.placeholder(_PLACEHOLDER_TYPES[field.type])
    section[field.name] = value
  return section


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by every preset (a small GRPO + SAGC run on the built-in task)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  for cls in SECTIONS:
    c[cls.NAME] = _section(cls)
  # learner.algorithm names a preset (rl/config.py ALGORITHM_PRESETS): the objective
  # keys left at None here take its values (``LearnerConfig.from_dict``); a key set
  # anywhere (file, Python, command line) wins.
  c.learner = learner_section(lr=1e-4, weight_decay=0.0, algorithm="grpo")
  return c


def learner_section(**changes) -> ml_collections.ConfigDict:
  """Every ``LearnerConfig`` setting a config file can set (all of them but
  ``DERIVED_FIELDS``), at the dataclass defaults plus ``changes``.

  The objective keys of the algorithm presets (``PRESET_FIELDS``) default to
  ``None``: "the preset's value". ``None`` defaults are typed placeholders, so that
  ``--config.learner.clip_c=3.0`` or ``--config.learner.clip_high=0.3`` works.
  """
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(LearnerConfig):
    if field.name in DERIVED_FIELDS:
      continue
    default = None if field.name in PRESET_FIELDS else field.default
    value = changes.pop(field.name, default)
    if value is None:
      value = config_dict.placeholder(float if field.default is None else type(field.default))
    section[field.name] = value
  if changes:
    raise ValueError(f"learner_section: unknown learner settings {sorted(changes)}")
  return section
