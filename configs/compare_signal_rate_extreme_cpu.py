"""signal_rate against every static G and SAGC, per hour, at extreme pass rates
(``configs/compare_extreme_cpu.py`` under ``hold_prompts``: 70% of the held-out prompts
at 0 < p <= 0.1), GRPO and DAPO, 8 seeds (docs/results.md, "signal_rate per hour").

The goal, fixed before the first run (docs/data/signal_rate_extreme/goal.md):
* primary arm: ``signal_rate`` per step, its defaults (control.signal_rate) with the
  cost seeded from calibrate's fit of the warm-start trace
  (``python -m sagc_jax.calibrate --trace docs/data/extreme_warm_start/trace.jsonl``);
* Holm family: signal_rate against static 4, 8 and 16, per algorithm, paired by seed,
  on the mean held-out accuracy over [0, H];
* not worse than the best static G (the 95% interval's lower end >= -0.03), better than
  every static G (Holm-resolved) and better than SAGC.
Seeds 0-7 are measured; nothing was tuned.

Run: python -m sagc_jax.compare --config configs/compare_signal_rate_extreme_cpu.py \
  --workdir runs/compare_signal_rate_extreme
"""

import pathlib
import runpy

# calibrate --trace docs/data/extreme_warm_start/trace.jsonl: its printed override.
# The seed these runs used: the raw decode fit, whose per-row and learner terms count
# every token where signal_rate counts rows x the median length (calibrate now prints
# it converted, replay.costs.DecodeCost.cost_seed); worth cost_seed_steps = 4 steps.
COST_SEED = (0.0007972, 1.293e-05, 0.03933, 0.000132)


def get_config():
  c = runpy.run_path(str(pathlib.Path(__file__).with_name(
      "compare_extreme_cpu.py")))["get_config"]("hold_prompts")
  c.controller.cost_seed = COST_SEED
  c.compare.update(dict(seeds=8, kinds=("signal_rate",)))
  return c
