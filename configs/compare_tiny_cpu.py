"""Quick CPU comparison: {GRPO, DAPO} x {static G = 4, 8, 16, SAGC} on the tiny default.

Eight arms of 40 RL steps each from one shared supervised warm start, about a
quarter of an hour on two CPU cores.

Run: python -m sagc_jax.compare --config configs/compare_tiny_cpu.py --workdir runs/compare
"""

import ml_collections

from sagc_jax.config import tiny_cpu_config


def get_config():
  c = tiny_cpu_config()
  c.train.update(dict(steps=40, eval_every=40, checkpoint_every=20))
  c.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo")))
  return c
