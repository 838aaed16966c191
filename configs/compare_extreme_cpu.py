"""Where group size pays: prompts at extreme pass rates, in both budget modes.

The SAGC paper and the adaptive-allocation methods are about prompts at extreme pass
rates: a group of G responses to a prompt of pass rate p is informative (its rewards
vary) with probability 1 - p^G - (1-p)^G, 0.19 at G = 4 and 0.56 at G = 16 for
p = 0.05. The paper's regime on CPU (configs/compare_paper_regime_cpu.py) starts near
p = 0.2, where a smaller G is both the cheaper step and the better learner. This
workload starts where most held-out prompts sit at 0 < p <= 0.1:

* ``data.synthetic.modulus=20``: the answer is a running value mod 20, so a bare
  guess scores about 1/20 (mod 10 lets a guess score about 0.1);
* a guess-heavy warm start (``sft.guess_stage_prob=0.97`` for 200 steps): the policy
  rarely writes its work, so a prompt's pass rate is near the guess rate, and RL
  raises it by writing the work more often;
* ``rollout.prompts_per_step=2`` under ``hold_prompts``: a G = 4 step is 8 rows, so
  the step's fixed cost (a learner call, the sampler's decode steps) weighs more and
  a G = 16 step costs less than 4x a G = 4 step on CPU.

Accepted (docs/results.md, "Where group size pays: extreme pass rates") because its
warm-start trace (``python -m sagc_jax.calibrate --config configs/compare_extreme_cpu.py
--out WARM``) puts at least half of the 64 held-out prompts at 0 < p <= 0.1, and the
replay of that trace under calibrate's measured CPU cost and ``hold_prompts`` predicts
by ``informative_groups`` that a larger G beats G = 4 for GRPO.

Two budget modes, one config (the argument after the file name):

* ``hold_prompts`` (default): 2 prompts per step at every G; GRPO and DAPO.
* ``hold_rollouts``: 32 rows per step (a G = 16 step's rows under hold_prompts), so a
  G = 4 step covers 8 prompts and a G = 16 step 2; GRPO only.

Measured on its warm start (calibrate, 64 held-out prompts x 32 responses): 70% of
the prompts at 0 < p <= 0.1 and 25% at p = 0 (pass rate 0.044); a training step at
G = 4 / 8 / 16 took 0.084 / 0.133 / 0.190 s (sampler and learner), so a G = 16 step
costs 2.3x a G = 4 step here, against the 3.5x of 8 prompts per step. The pilot (one
seed of GRPO, every arm, 3 evaluations) learns within H: held-out sampled accuracy
0.062 before RL, 0.23-0.24 at H.

Fixed before the runs: H = 30 s of step time (as the paper-regime workloads), 5
evaluation points, 6 seeds, and the targets 0.12 and 0.18, about 2x and 3x the warm
start's sampled accuracy (0.062).

Run: python -m sagc_jax.compare --config configs/compare_extreme_cpu.py \\
  --workdir runs/compare_extreme_prompts
     python -m sagc_jax.compare --config configs/compare_extreme_cpu.py:hold_rollouts \\
  --workdir runs/compare_extreme_rollouts
"""

import pathlib
import runpy

import ml_collections

MODES = ("hold_prompts", "hold_rollouts")


def get_config(mode: str = "hold_prompts"):
  if mode not in MODES:
    raise ValueError(f"configs/compare_extreme_cpu.py:{mode}: the mode must be one of {MODES}")
  c = runpy.run_path(str(pathlib.Path(__file__).with_name("tiny_cpu.py")))["get_config"]()
  c.data.synthetic.modulus = 20
  c.sft.update(dict(guess_stage_steps=200, guess_stage_prob=0.97))
  c.rollout.update(dict(mode=mode, prompts_per_step=2, rollouts_per_step=32))
  c.train.update(dict(steps=1000, eval_every=1000, checkpoint_every=100))
  algorithms = ("grpo", "dapo") if mode == "hold_prompts" else ("grpo",)
  c.compare = ml_collections.ConfigDict(dict(algorithms=algorithms, seeds=6,
                                             time_budget_s=30.0, eval_points=5,
                                             targets=(0.12, 0.18)))
  return c
