"""DAPO with a static group size (controller.static_g) on the base settings.

Run: python -m sagc_jax.train --config configs/dapo_static.py --workdir runs/dapo_static
"""

from sagc_jax.config import preset


def get_config():
  return preset("dapo", "static")
