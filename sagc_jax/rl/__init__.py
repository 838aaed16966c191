"""RL objective pieces for GRPO/DAPO (advantages, clipped policy loss, KL, shaping)."""

from sagc_jax.rl.losses import (AGG_MODES, KL_KINDS, aggregate, aggregate_count,
                                dynamic_sampling_keep, entropy_from_logits, group_advantages,
                                kl_penalty, overlong_penalty, policy_loss, ppo_token_terms,
                                token_logprobs)

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "aggregate",
    "aggregate_count",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "group_advantages",
    "kl_penalty",
    "overlong_penalty",
    "policy_loss",
    "ppo_token_terms",
    "token_logprobs",
]
