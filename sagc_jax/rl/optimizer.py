"""The optax optimizer of a ``LearnerConfig``: AdamW with global-norm clipping and a
linear warm-up into a constant or cosine schedule (steps count optimizer updates)."""

from __future__ import annotations

import optax

from sagc_jax.rl.config import LearnerConfig

__all__ = ["learning_rate_schedule", "optimizer"]


def learning_rate_schedule(config: LearnerConfig) -> optax.Schedule:
  """Learning rate as a function of the number of applied optimizer updates."""
  if config.schedule == "cosine":
    decay = optax.cosine_decay_schedule(config.lr,
                                        max(config.total_steps - config.warmup_steps, 1),
                                        alpha=config.min_lr_ratio)
  else:
    decay = optax.constant_schedule(config.lr)
  if not config.warmup_steps:
    return decay
  return optax.join_schedules(
      [optax.linear_schedule(0.0, config.lr, config.warmup_steps), decay],
      [config.warmup_steps])


def optimizer(config: LearnerConfig) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                     optax.adamw(learning_rate_schedule(config), b1=config.b1, b2=config.b2,
                                 eps=config.eps, weight_decay=config.weight_decay))
