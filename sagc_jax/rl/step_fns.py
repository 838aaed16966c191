"""The learner's jitted steps, as pure functions of explicit arguments.

Like nanodo's ``_train_step`` and MaxText's ``train_step``: every program the learner
compiles is a module-level function of its arrays (weights, optimizer state, gradient
accumulators, one ``LearnerBatch``) and of static settings passed as hashable
arguments, never a closure over a ``Learner``. What a program computes is therefore
visible from its signature, it can be traced, lowered or tested on its own, and two
learners with the same settings build the same programs. ``Learner``
(``rl/learner.py``) only adds shardings and donation to each (``jax.jit``), compiles
every bucket ahead of time and runs the update loop; the static arguments are the last
positional ones (``static_argnums``; ``jit`` refuses keyword arguments once
``in_shardings`` is given).

The static settings are the frozen ``LearnerConfig`` (hashed by value) and a
``PolicySpec``: the policy's graph, non-parameter state, compute dtype, forward options
and master weights' shapes and shardings (it holds arrays and sharding trees, so it is
hashed by identity: one per learner, as the closures it replaces were).

The steps of one ``Learner.update``:

* ``learner_prepare``: rewards -> DAPO's keep mask and shaped rewards -> advantages.
* ``learner_logprobs``: the frozen reference's (GRPO's KL) or the current policy's
  (PPO's "old") log-probs of a microbatch's targets, before the step's first update.
* ``learner_zeros`` then ``learner_grad`` per microbatch: the float32 gradient and the
  metric sums of a minibatch, accumulated into donated buffers.
* ``learner_apply``: one optimizer update, skipped when the loss or the gradient is not
  finite.
* ``cast_params``: the master weights cast to the model's dtype (and placed like it).

References: GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300); DAPO (Yu et al.
2025, arXiv:2503.14476); Dr. GRPO (Liu et al. 2025, arXiv:2503.20783).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sagc_jax.models.transformer import ForwardOptions
from sagc_jax.rl import losses
from sagc_jax.rl.chunked_logprobs import chunked_logprobs_entropy
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.optimizer import optimizer
from sagc_jax.rl.packing import LearnerBatch

__all__ = ["EXACT_SUMS", "MAX_SUMS", "PolicySpec", "cast_params", "forward_logprobs",
           "learner_apply", "learner_grad", "learner_logprobs", "learner_prepare",
           "learner_zeros", "metric_sums_shape", "microbatch_loss", "update_metrics"]

# Microbatch sums combined with max, not +, across a minibatch's microbatches.
MAX_SUMS = ("ratio_max", "mismatch_max")
# Sums that are already the minibatch's value (the loss and its parts); the rest are
# per-token sums, divided by the minibatch's real tokens.
EXACT_SUMS = ("loss", "pg_loss", "kl") + MAX_SUMS


@dataclasses.dataclass(frozen=True, eq=False)
class PolicySpec:
  """The static half of the policy: what the programs trace with, besides the weights.

  Hashed by identity (``eq=False``): ``rest`` holds arrays and ``param_shardings`` is a
  tree, neither hashable by value; each learner builds one.

  Attributes:
    graphdef: the model's nnx graph (``nnx.split(model, nnx.Param, ...)``).
    rest: its non-parameter state (constants of every program).
    compute_dtype: the model's parameter dtype; the forward and backward run in it.
    options: how the forward pass is computed (remat, scan, attention, row sharding).
    master: ShapeDtypeStructs of the float32 master weights (with their shardings).
    param_shardings: the master weights' shardings (FSDP or the model's); None
      without a mesh.
  """
  graphdef: Any
  rest: Any
  compute_dtype: Any
  options: ForwardOptions
  master: Any
  param_shardings: Any


def learner_prepare(scores, lengths, group_ids, row_valid, config: LearnerConfig):
  """(advantages, keep mask, shaped rewards) per row of a rollout batch.

  DAPO's dynamic sampling drops groups whose *rewards* are all equal (all right or all
  wrong: zero advantage, no gradient), judged before the soft overlong punishment, which
  must not make an all-wrong group look informative. Advantages are group-relative
  (GRPO), divided by the group's std unless ``normalize_std=False`` (Dr. GRPO). Group
  structure is data (``group_ids``), so the group size is no static shape.
  """
  cfg = config
  scores = scores.astype(jnp.float32)
  keep = (losses.dynamic_sampling_keep(scores, group_ids, mask=row_valid)
          if cfg.dynamic_sampling else row_valid)
  if cfg.overlong_buffer:
    scores = scores + losses.overlong_penalty(lengths, cfg.max_response_len,
                                              cfg.overlong_buffer, cfg.overlong_factor)
  scores = jnp.where(row_valid, scores, 0.0)
  adv = losses.group_advantages(scores, group_ids, normalize_std=cfg.normalize_std,
                                eps=cfg.adv_eps, mask=row_valid)
  return adv, keep, scores


def forward_logprobs(params, batch: LearnerBatch, config: LearnerConfig, policy: PolicySpec):
  """(log-probs [rows, N], entropy [rows, N]) of the batch's N target columns.

  Log-probs are of ``logits / temperature``, the sampler's distribution, so the
  sampler's log-probs are valid PPO "old" log-probs. ``params`` may be the float32
  master weights: they are cast to the compute dtype here, inside the differentiated
  function, so gradients arrive in float32.
  """
  params = jax.tree.map(lambda x: x.astype(policy.compute_dtype), params)
  model = nnx.merge(policy.graphdef, params, policy.rest)
  hidden, _ = model.hidden_states(batch.tokens, positions=batch.positions,
                                  segment_ids=batch.segment_ids, options=policy.options)
  _, t, n = batch.shape
  weight, transposed = model.head_weight()
  return chunked_logprobs_entropy(hidden[:, t - n - 1:-1], weight, transposed,
                                  batch.tokens[:, t - n:], temperature=config.temperature,
                                  chunk=config.logits_chunk)


def learner_logprobs(params, batch: LearnerBatch, config: LearnerConfig,
                     policy: PolicySpec):
  """Log-probs of the batch's loss tokens (0 elsewhere): the frozen reference's for
  GRPO's KL term, or the current policy's for ``recompute_old_logprobs``."""
  logp, _ = forward_logprobs(params, batch, config, policy)
  return jnp.where(batch.loss_mask, logp, 0.0)


def microbatch_loss(params, batch: LearnerBatch, config: LearnerConfig, policy: PolicySpec):
  """(loss, metric sums) of one microbatch: ``loss`` is its exact share of the
  minibatch objective, since ``loss_weight`` carries the aggregation (``packing``).

  The objective is PPO's clipped surrogate with DAPO's decoupled ``clip_low`` /
  ``clip_high`` (and an optional dual clip), plus ``kl_coef`` times GRPO's KL estimate
  to the frozen reference when ``kl_coef > 0``.
  """
  cfg = config
  logp, entropy = forward_logprobs(params, batch, config, policy)
  real = batch.loss_mask
  t = losses.ppo_token_terms(logp, batch.old_logp, batch.advantages, real, cfg.clip_low,
                             cfg.clip_high, cfg.clip_c)
  w = jnp.where(real, batch.loss_weight, 0.0)
  pg = jnp.sum(t["pg"] * w)
  loss = pg
  sg = jax.lax.stop_gradient
  f = real.astype(jnp.float32)
  ratio = sg(t["ratio"])
  sums = {"pg_loss": sg(pg), "tokens": jnp.sum(f),
          "entropy": jnp.sum(entropy * f),
          "clipfrac": jnp.sum(t["clipped"] * f), "clipfrac_lower": jnp.sum(t["dual"] * f),
          "clipfrac_ratio_high": jnp.sum((t["clipped"] & (t["adv"] > 0)) * f),
          "clipfrac_ratio_low": jnp.sum((t["clipped"] & (t["adv"] < 0)) * f),
          "approx_kl": sg(jnp.sum((t["old_logp"] - t["logp"]) * f)),
          "ratio_mean": jnp.sum(ratio * f),
          "mismatch_sum": sg(jnp.sum(jnp.abs(t["logp"] - t["old_logp"]) * f)),
          "ratio_max": jnp.max(jnp.where(real, ratio, 0.0)),
          "mismatch_max": sg(jnp.max(jnp.where(real, jnp.abs(t["logp"] - t["old_logp"]),
                                               0.0)))}
  if cfg.kl_coef > 0:
    ref = jnp.where(real, batch.ref_logp, 0.0)
    kl = jnp.sum(losses.kl_penalty(t["logp"], ref, cfg.kl_kind) * w)
    loss = loss + cfg.kl_coef * kl
    sums["kl"] = sg(kl)
  sums["loss"] = sg(loss)
  return loss, sums


def metric_sums_shape(config: LearnerConfig, policy: PolicySpec):
  """The structure of ``microbatch_loss``'s sums (traced abstractly, on the smallest
  batch): what a minibatch's accumulation starts from."""
  loss_fn = functools.partial(microbatch_loss, config=config, policy=policy)
  return jax.eval_shape(loss_fn, policy.master, LearnerBatch.abstract(1, 2, 1))[1]


def _pin_like_params(tree, policy: PolicySpec):
  """Float32 gradients keep the master weights' (FSDP) sharding."""
  if policy.param_shardings is None:
    return tree
  return jax.lax.with_sharding_constraint(tree, policy.param_shardings)


def learner_zeros(config: LearnerConfig, policy: PolicySpec):
  """(float32 zero gradients, zero sums): a minibatch's accumulators, made on device so
  that ``learner_grad`` can donate them."""
  return (_pin_like_params(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32),
                                        policy.master), policy),
          jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                       metric_sums_shape(config, policy)))


def learner_grad(params, grads, sums, batch: LearnerBatch, config: LearnerConfig,
                 policy: PolicySpec):
  """One microbatch of the gradient accumulation: ``(grads, sums)`` plus this
  microbatch's float32 gradient and metric sums.

  Each token's ``loss_weight`` is its sequence's share of the minibatch aggregation, so
  the accumulated gradient is the minibatch's exactly, for every aggregation mode
  (DAPO's token-mean, GRPO's sequence mean, Dr. GRPO's constant normaliser).
  """
  loss_fn = functools.partial(microbatch_loss, config=config, policy=policy)
  (_, micro), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
  g = _pin_like_params(jax.tree.map(lambda x: x.astype(jnp.float32), g), policy)
  merged = {k: (jnp.maximum(sums[k], v) if k in MAX_SUMS else sums[k] + v)
            for k, v in micro.items()}
  return jax.tree.map(jnp.add, grads, g), merged


def learner_apply(params, opt_state, grads, loss, config: LearnerConfig):
  """(params, optimizer state, info) after one update of ``rl.optimizer.optimizer(config)``.

  The update is applied only if the loss and the gradient norm are finite; otherwise the
  parameters and the optimizer state come back unchanged (``info["skipped"]`` = 1).
  """
  tx = optimizer(config)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  def apply(_):
    updates, new_opt = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt

  new_params, new_opt = jax.lax.cond(finite, apply, lambda _: (params, opt_state), None)
  return new_params, new_opt, {"grad_norm": grad_norm,
                               "skipped": (~finite).astype(jnp.float32)}


def cast_params(params, dtype):
  """``params`` cast to ``dtype`` (the master -> model sync, the reference copy)."""
  return jax.tree.map(lambda x: x.astype(dtype), params)


def update_metrics(history: list) -> dict[str, list[float]]:
  """Per-update metrics from host (sums, apply info) pairs: exact minibatch values (a
  token-mean over the minibatch, not a mean of microbatch means)."""
  out: dict[str, list[float]] = {}
  for sums, info in history:
    tokens = max(float(sums["tokens"]), 1.0)
    for key, value in sums.items():
      if key in ("tokens", "mismatch_sum", "mismatch_max"):
        continue
      out.setdefault(key, []).append(float(value) if key in EXACT_SUMS
                                     else float(value) / tokens)
    out.setdefault("grad_norm", []).append(float(info["grad_norm"]))
  return out
