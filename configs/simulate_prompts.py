"""Simulator config with prompt heterogeneity: static G, SAGC, prompt_aware, per_prompt.

Run: ``python -m sagc_jax.simulate --config configs/simulate_prompts.py`` (add
``--claims_seeds 3`` for the multi-seed tables of docs/results.md, "Simulator: prompt
heterogeneity"). A pool of prompts recurs every epoch; each has its own length
distribution, tail weight, pass rate and token length, tied to a latent difficulty
and drifting with training (the replay engine's prompt-pool world, ``sagc_jax.replay.worlds``). Every other
setting is configs/simulate.py's: the length schedule (here: of the average prompt), the
cost model, the rollout budget and the controller section, which serves every arm.
"""

import pathlib
import runpy

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  base = runpy.run_path(str(pathlib.Path(__file__).with_name("simulate.py")))
  config = base["get_config"]()
  # prompt_aware / per_prompt settings: the schema's defaults.
  config.controller.update(dict(tail_edges=(0.8, 1.25), length_edges=(1.0,),
                                cell_prior_strength=2.0, history_size=20000,
                                history_forgetting=0.7))
  # sim.prompt_len is the pool's median prompt length; sim.prompt_sigma the spread of
  # the prompts' median response lengths.
  config.pool = ml_collections.ConfigDict(dict(
      size=2000,                      # prompts; an epoch is size / prompts-per-step steps
      prompt_len_sigma=0.5,           # spread of prompt token lengths
      sigma_spread=0.2,               # spread of the prompts' body sigma
      tail_spread=1.5,                # s.d. of the prompts' tail-probability logits
      median_difficulty_corr=0.5,     # harder prompts: longer responses ...
      tail_difficulty_corr=0.5,       # ... more re-check tails ...
      prompt_len_difficulty_corr=0.3, # ... and somewhat longer prompts
      pass_logit_mean=0.0,            # pass rate = sigmoid(mean - scale * d + gain * x)
      pass_logit_scale=2.0,
      pass_logit_gain=2.0,            # every prompt gets easier over training
  ))
  return config
