"""Per-prompt sizes and skipping per hour: static 4, static 4 with skipping only and
``signal_rate_per_prompt`` (GRPO, 8 seeds) on the paper regime's task, RL drawing only the
first 200 training prompts (``data.train_prompts``), so each prompt recurs about 3-4 times
within H = 30 s (at about 90 steps of 8 prompts for static 4) and its posterior can say
"always" or "never solved" (on 20,000 prompts almost none recur). The warm start is the
paper regime's (fine-tuned on all 20,000: a warm start fine-tuned on the 200 alone solved
them at a pass rate of 0.985, with 62% always solved). SAGC runs too (every comparison has
it).

Arms: ``static4``; ``static4_skip`` (``signal_rate_per_prompt`` with the one candidate
4: skipping and re-testing only); ``signal_rate_per_prompt`` (sizes per prompt from
{4, 8, 16} and skipping). Its goal and the replay's prediction are committed before its
first run (docs/data/signal_rate_per_prompt/goal.md).

Run: python -m sagc_jax.compare --config configs/compare_signal_rate_per_prompt_cpu.py \
  --workdir runs/compare_signal_rate_per_prompt
"""

import pathlib
import runpy

# calibrate --config.data.eval_split=train (64 of the 200 prompts):
# docs/data/signal_rate_per_prompt/calibrate, its printed cost seed.
# The seed these runs used: the raw decode fit, whose per-row and learner terms count
# every token where signal_rate counts rows x the median length (calibrate now prints
# it converted, replay.costs.DecodeCost.cost_seed); worth cost_seed_steps = 4 steps.
COST_SEED = (0.0002708, 2.756e-05, 0.06072, 9.492e-05)


def get_config():
  c = runpy.run_path(str(pathlib.Path(__file__).with_name(
      "compare_paper_regime_cpu.py")))["get_config"]()
  c.data.train_prompts = 200
  c.controller.cost_seed = COST_SEED
  c.compare.update(dict(algorithms=("grpo",), static_sizes=(4,),
                        kinds=("signal_rate_per_prompt",),
                        named_arms={"static4_skip": {"kind": "signal_rate_per_prompt",
                                                     "candidates": (4,)}}))
  return c
