"""Simulator config: SAGC vs static G on a drifting heavy-tailed length process.

Run: ``python -m sagc_jax.simulate --config configs/simulate.py``; override any
key, e.g. ``--config.controller.delta=0.15 --config.sim.mode=hold_rollouts``.
The cost constants are rough figures for a ~3B policy on a small TPU slice;
they only set the relative weight of decode, prefill and learner time.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  config.controller = ml_collections.ConfigDict(dict(
      kind="sagc",
      candidates=(4, 8, 16),
      tau=2.0,            # straggler: group max length > tau * group median
      delta=0.25,         # target long-run straggler rate (of `event`)
      event="group",      # "group": fraction of groups; "step": any group straggles (S_t)
      eta=1.0,            # dual step size
      lambda_max=50.0,    # projection bound of the multiplier
      forgetting=0.99,    # per-step discount of posterior evidence
      prior_alpha=1.0,
      prior_beta=1.0,
      initial_g=ml_collections.config_dict.placeholder(int),   # None = smallest candidate
      seed=0,
  ))

  config.sim = ml_collections.ConfigDict(dict(
      steps=1000,
      mode="hold_prompts",      # or "hold_rollouts"
      prompts_per_step=32,      # hold_prompts: rows = prompts * G
      rollouts_per_step=256,    # hold_rollouts: prompts = rollouts / G
      prompt_len=256,
      max_len=4096,
      median_start=400.0,       # response lengths grow over training ...
      median_end=1200.0,
      sigma_start=0.25,         # ... and so does their spread
      sigma_end=0.40,
      tail_prob_start=0.01,     # chance a response re-checks its work
      tail_prob_end=0.05,
      tail_factor_min=2.0,
      tail_factor_max=5.0,
      prompt_sigma=0.5,         # prompt difficulty spread (shared by a group)
  ))

  config.cost = ml_collections.ConfigDict(dict(
      prefill_s_per_token=2e-6,
      decode_s_per_iter=0.02,
      decode_s_per_row_iter=5e-5,
      learner_s_per_token=2e-5,
      step_overhead_s=2.0,
  ))
  return config
