"""Training configs: what users write (an ml_collections ``ConfigDict``: the schema of
every key and its default, and the presets) and what the code below the command
line reads (``RunConfig``, frozen typed sections checked when built). Imports no JAX.

``from sagc_jax.config import base_config, preset, run_config`` is all a config file
or a tool needs.
"""

import hashlib
import json

from sagc_jax.config.compare import CompareSection
from sagc_jax.config.presets import (preset, smollm2_cpu_config, tiny_cpu_config,
                                     tpu_pod_long_preset, tpu_pod_preset)
from sagc_jax.config.run import RunConfig, check_run, controller_settings, run_config
from sagc_jax.config.schema import base_config, learner_section
from sagc_jax.config.sections import DATASETS, DTYPES, FILE_DATASETS, REWARDS
from sagc_jax.rl.config import LearnerConfig


def validate(config) -> RunConfig:
  """Checks a whole config before any work; the first problem raises ``ValueError``
  naming its dotted key. Returns the typed config (``run_config``)."""
  return run_config(config)


def learner_config(config) -> LearnerConfig:
  """The resolved ``LearnerConfig`` of a training config (its algorithm preset filled
  in, the derived fields set from the rollout and train sections)."""
  return run_config(config).learner


def config_digest(config) -> str:
  """A short digest of every setting of ``config`` (a ``ConfigDict``): what a trace was
  sampled under, and which comparison a prediction was made for."""
  settings = json.dumps(config.to_dict(), sort_keys=True, default=str)
  return hashlib.sha256(settings.encode()).hexdigest()[:16]


__all__ = ["CompareSection", "DATASETS", "DTYPES", "FILE_DATASETS", "REWARDS", "RunConfig",
           "base_config", "check_run", "config_digest", "controller_settings", "learner_config",
           "learner_section", "preset", "run_config",
           "smollm2_cpu_config", "tiny_cpu_config", "tpu_pod_long_preset", "tpu_pod_preset",
           "validate"]
