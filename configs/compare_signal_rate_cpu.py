"""signal_rate against every static G, SAGC and a warm-started SAGC, per hour, on the
SAGC paper's regime on CPU (mod 10, GRPO; docs/results.md, "signal_rate per hour").

The goal, fixed before the first run (docs/data/signal_rate_mod10/goal.md):
* primary arm: ``signal_rate`` per step, its defaults (control.signal_rate) with the
  cost seeded from calibrate's fit of this config's warm-start trace
  (docs/data/signal_rate_mod10/calibrate; the sampling took 5 s of the 64 x 32
  responses, outside every arm's H);
* Holm family: signal_rate against static 4, 8 and 16 (GRPO), paired by seed, on the
  mean held-out accuracy over [0, H];
* not worse than the best static G: the two-sided 95% interval's lower end >= -0.03;
* better than every static G: Holm-resolved; and it beats SAGC.
Seeds 0-7 are the measured ones; nothing was tuned (settings tuned later go on seeds
>= 100 only).

Arms: static 4, 8, 16, SAGC (lambda from 0, the paper's start), ``sagc_warm`` (calibrate's
recommended ``initial_lambda`` at this tau and delta, 27) and ``signal_rate``. The
oracle-schedule arm is not trained: the replay oracle chose G = 4 on all 400 steps of
this trace (``python -m sagc_jax.experiments.oracle_schedule --trace
docs/data/signal_rate_mod10/warm_trace.jsonl``), so its arm is static 4.

Run: python -m sagc_jax.compare --config configs/compare_signal_rate_cpu.py \
  --workdir runs/compare_signal_rate
"""

import pathlib
import runpy

# calibrate --trace docs/data/signal_rate_mod10/warm_trace.jsonl: its printed overrides.
INITIAL_LAMBDA = 27.0
# The seed these runs used: the raw decode fit, whose per-row and learner terms count
# every token where signal_rate counts rows x the median length (calibrate now prints
# it converted, replay.costs.DecodeCost.cost_seed); worth cost_seed_steps = 4 steps.
COST_SEED = (0.0003485, 3.007e-05, 0.02421, 0.0001175)


def get_config():
  c = runpy.run_path(str(pathlib.Path(__file__).with_name(
      "compare_paper_regime_cpu.py")))["get_config"]()
  c.controller.cost_seed = COST_SEED
  c.compare.update(dict(algorithms=("grpo",), kinds=("signal_rate",),
                        named_arms={"sagc_warm": {"kind": "sagc",
                                                  "initial_lambda": INITIAL_LAMBDA}}))
  return c
