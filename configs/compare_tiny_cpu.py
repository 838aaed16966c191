"""Quick CPU comparison: {GRPO, DAPO} x {static G = 4, 8, 16, SAGC} on the tiny default.

Eight arms x 3 seeds of 40 RL steps each from one shared supervised warm start,
about a quarter of an hour on two CPU cores (12 of the 24 runs took 8 min on the
2-core VM, 2026-12-01).

Run: python -m sagc_jax.compare --config configs/compare_tiny_cpu.py --workdir runs/compare
"""

import ml_collections

from sagc_jax.config import tiny_cpu_config


def get_config():
  c = tiny_cpu_config()
  c.train.update(dict(steps=40, eval_every=40, checkpoint_every=20))
  # 3 seeds per arm (mean and 95% CI in results.md); time to target = the first
  # wall-clock at which the 5-step mean train reward reaches reward_target.
  c.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo"), seeds=3,
                                             reward_target=0.5))
  return c
