"""GRPO with a static group size (controller.static_g) on the base settings.

Run: python -m sagc_jax.train --config configs/grpo_static.py --workdir runs/grpo_static
"""

from sagc_jax.config import preset


def get_config():
  return preset("grpo", "static")
