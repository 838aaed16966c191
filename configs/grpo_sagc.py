"""GRPO with SAGC group-size control on the base settings.

Run: python -m sagc_jax.train --config configs/grpo_sagc.py --workdir runs/grpo_sagc
"""

from sagc_jax.config import preset


def get_config():
  return preset("grpo", "sagc")
