"""Training configs: the schema (every key and its default), the presets, start-up
validation and the checks every config section uses. Imports no JAX.

``from sagc_jax.config import base_config, preset, validate`` is all a config file
or a tool needs.
"""

from sagc_jax.config.presets import (preset, smollm2_cpu_config, tiny_cpu_config,
                                     tpu_pod_16k_preset, tpu_pod_preset)
from sagc_jax.config.schema import (DATASETS, DTYPES, FILE_DATASETS, REWARDS, base_config,
                                    learner_section)
from sagc_jax.config.validate import learner_config, validate

__all__ = ["DATASETS", "DTYPES", "FILE_DATASETS", "REWARDS", "base_config", "learner_config",
           "learner_section", "preset", "smollm2_cpu_config", "tiny_cpu_config",
           "tpu_pod_16k_preset", "tpu_pod_preset", "validate"]
