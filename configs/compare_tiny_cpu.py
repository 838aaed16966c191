"""Quick CPU comparison: {GRPO, DAPO} x {static G = 4, 8, 16, SAGC} on the tiny default.

Eight arms x 3 seeds, each given the same 20 s of step time, from one shared
supervised warm start; the report says which arm trains the best model per hour
(docs/claims.md). Timings: docs/results.md.

Run: python -m sagc_jax.compare --config configs/compare_tiny_cpu.py --workdir runs/compare
"""

import ml_collections

from sagc_jax.config import tiny_cpu_config


def get_config():
  c = tiny_cpu_config()
  # Every arm gets 20 s of step time (about static 16's 40 steps here), evaluated at
  # 8 evenly spaced points of it; train.steps is only a cap above every arm's need.
  c.train.update(dict(steps=400, eval_every=400, checkpoint_every=20))
  # 3 seeds per arm (mean and 95% CI in results.md); targets: held-out sampled
  # accuracies whose time to reach is reported (per_hour.json). This task's warm start
  # samples 0.26-0.50 correct depending on the CPU model (XLA:CPU numerics), so a
  # target can be met before RL (time 0) on some machines.
  c.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo"), seeds=3,
                                             time_budget_s=20.0, eval_points=8,
                                             targets=(0.5, 0.6)))
  return c
