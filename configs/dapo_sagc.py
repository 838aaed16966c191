"""DAPO with SAGC group-size control on the base settings.

Run: python -m sagc_jax.train --config configs/dapo_sagc.py --workdir runs/dapo_sagc
"""

from sagc_jax.config import preset


def get_config():
  return preset("dapo", "sagc")
