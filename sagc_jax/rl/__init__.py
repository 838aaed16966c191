"""RL objective pieces for GRPO/DAPO (advantages, clipped policy loss, KL, shaping).

The names of ``rl.losses`` are exported here on first use: importing a JAX-free
module of this package (``rl.config``, the learner settings the training config
holds) must not import JAX.
"""

import importlib

_LOSSES = ("AGG_MODES", "KL_KINDS", "aggregate", "aggregate_count", "dynamic_sampling_keep",
           "entropy_from_logits", "group_advantages", "kl_penalty", "overlong_penalty",
           "policy_loss", "ppo_token_terms", "token_logprobs")

__all__ = list(_LOSSES)


def __getattr__(name: str):
  if name in _LOSSES:
    return getattr(importlib.import_module("sagc_jax.rl.losses"), name)
  raise AttributeError(f"module 'sagc_jax.rl' has no attribute {name!r}")
