"""GRPO/DAPO objective pieces: group advantages, clipped policy loss, KL, shaping.

Everything here is a pure ``jax.numpy`` function of arrays plus a few static
Python arguments (strings, clip constants, the number of groups), so the
learner can call it inside one jitted train step. There is no Python control
flow on traced values.

Design choices and where they come from:

* **Group-relative advantages** (GRPO, Shao et al. 2024, "DeepSeekMath"): every
  response is scored against the other responses to the same prompt,
  ``A_i = (s_i - mean_g) / (std_g + eps)``; no value network. Dr. GRPO (Liu et
  al. 2025, "Understanding R1-Zero-like Training: A Critical Perspective")
  shows the std division up-weights too-easy/too-hard prompts and drops it
  (``normalize_std=False``). Groups are described by integer ids per row and
  reduced with segment ops, so the group size G is *not* a static shape: the
  SAGC controller changes G between steps and a padded batch of any layout
  still compiles once per batch shape. Padding rows (``mask`` False) are left
  out of the statistics and get advantage 0.
* **Clipped surrogate** (PPO) with **decoupled clip ranges** ``clip_low`` /
  ``clip_high`` (DAPO "clip-higher", Yu et al. 2025: a larger upper range keeps
  low-probability tokens explorable and delays entropy collapse) and optional
  **dual clip** (Ye et al. 2020, "Mastering Complex Control in MOBA Games with
  Deep RL"): for negative advantages the loss is capped at ``-A * clip_c``, so a
  huge ratio on a stale/off-policy token cannot produce an unbounded update.
* **Loss aggregation** modes (names as in verl): ``token-mean`` is DAPO's
  token-level loss (every token counts equally, long responses are not
  down-weighted); ``seq-mean-token-mean`` is the original GRPO sample-level
  average; ``seq-mean-token-sum-norm`` divides per-sequence token sums by a
  constant (Dr. GRPO's fix for the response-length bias of the per-sequence
  mean).
* **KL estimators** (Schulman 2020, "Approximating KL Divergence"): ``k1`` is
  the unbiased log-ratio, ``k2`` the low-variance squared log-ratio, ``k3`` the
  unbiased, always non-negative ``r - log r - 1`` (the one GRPO uses), clamped
  for numerical safety as in common implementations.
* **Dynamic sampling** and **soft overlong punishment** (DAPO): groups whose
  scores are all equal produce zero advantages and hence no gradient, so the
  sampler can drop them; responses within ``buffer`` tokens of the length cap
  receive a linearly growing negative reward.

Masks may be bool or 0/1 floats. Values at masked (padding) positions never
reach a result or a gradient: they are replaced with ``jnp.where`` before any
arithmetic, so a NaN/-inf log-prob in padding cannot poison the step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from sagc_jax.rl.config import AGG_MODES, KL_KINDS

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


# Log-ratio clamp of the importance ratio and of the k3 estimator: exp(20) is
# ~5e8, far past any clip range, and still finite in float32.
_LOG_RATIO_CLAMP = 20.0
_K3_VALUE_CLAMP = 10.0

Array = jax.Array
ArrayLike = Any


# ------------------------------------------------------------------ helpers
def _float_dtype(x: Array) -> Any:
  """Float dtype for computing on ``x``: its own if floating, else float32."""
  return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _is_static_number(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _safe_div(num: Array, den: Array) -> Array:
  """``num / den`` where ``den > 0``, else 0 (NaN-free value and gradient)."""
  ok = den > 0
  return jnp.where(ok, num / jnp.where(ok, den, 1), 0)


def _row_inputs(name: str, scores: ArrayLike, group_ids: ArrayLike, mask: ArrayLike | None,
                num_groups: int | None) -> tuple[Array, Array, Array, int]:
  """Validates the per-row inputs of the group functions (static checks only)."""
  scores = jnp.asarray(scores)
  group_ids = jnp.asarray(group_ids)
  if scores.ndim != 1:
    raise ValueError(f"{name}: scores must be 1-D [rows], got shape {scores.shape}")
  if group_ids.shape != scores.shape:
    raise ValueError(f"{name}: group_ids shape {group_ids.shape} differs from "
                     f"scores shape {scores.shape}")
  if not jnp.issubdtype(group_ids.dtype, jnp.integer):
    raise ValueError(f"{name}: group_ids must be integers, got dtype {group_ids.dtype}")
  if mask is None:
    real = jnp.ones(scores.shape, bool)
  else:
    mask = jnp.asarray(mask)
    if mask.shape != scores.shape:
      raise ValueError(f"{name}: mask shape {mask.shape} differs from scores shape "
                       f"{scores.shape}")
    real = mask.astype(bool)
  if num_groups is None:
    num_groups = max(int(scores.shape[0]), 1)
  elif (isinstance(num_groups, bool) or not isinstance(num_groups, int)
        or num_groups <= 0):
    raise ValueError(f"{name}: num_groups must be a positive Python int (static), "
                     f"got {num_groups!r}")
  # Ids of padding rows may be anything (e.g. -1); clipping keeps the gathers
  # in range, and their contributions are zeroed by `real` anyway.
  ids = jnp.clip(group_ids, 0, num_groups - 1)
  return scores, ids, real, num_groups


def _check_mask_2d(name: str, x: Array, mask: ArrayLike) -> Array:
  mask = jnp.asarray(mask)
  if x.ndim != 2:
    raise ValueError(f"{name}: expected a [batch, T] array, got shape {x.shape}")
  if mask.shape != x.shape:
    raise ValueError(f"{name}: mask shape {mask.shape} differs from {x.shape}")
  return mask


# --------------------------------------------------------------- advantages
def group_advantages(scores: ArrayLike, group_ids: ArrayLike, normalize_std: bool = True,
                     eps: float = 1e-6, mask: ArrayLike | None = None,
                     num_groups: int | None = None) -> Array:
  """GRPO / Dr. GRPO group-relative advantages, one per row.

  Args:
    scores: [rows] rewards.
    group_ids: [rows] int group (prompt) of each row; any ids in
      ``[0, num_groups)``, in any order, need not be contiguous.
    normalize_std: divide by the group's unbiased (n-1) std + ``eps`` (GRPO);
      False gives ``s - mean_g`` (Dr. GRPO).
    eps: added to the std.
    mask: [rows] bool, False for padding rows (excluded from the group
      statistics, advantage 0). Default: all rows real.
    num_groups: static upper bound on the ids (segment count); default the
      number of rows. Ids of real rows outside the range are not checked
      (they cannot be under jit) and yield wrong statistics.

  Returns:
    [rows] advantages, float. A group with a single real row has advantage 0
    (its std is taken as 0 and ``s - mean = 0``).
  """
  scores, ids, real, n = _row_inputs("group_advantages", scores, group_ids, mask,
                                     num_groups)
  s = jnp.where(real, scores.astype(_float_dtype(scores)), 0)
  w = real.astype(s.dtype)
  count = jax.ops.segment_sum(w, ids, num_segments=n)
  mean = _safe_div(jax.ops.segment_sum(s, ids, num_segments=n), count)
  centered = jnp.where(real, s - mean[ids], 0)   # two-pass: no cancellation
  if not normalize_std:
    return centered
  sq = jax.ops.segment_sum(centered * centered, ids, num_segments=n)
  var = _safe_div(sq, count - 1)                  # 0 for groups of <= 1 real row
  std = jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1)), 0)
  return jnp.where(real, centered / (std[ids] + eps), 0)


def dynamic_sampling_keep(scores: ArrayLike, group_ids: ArrayLike,
                          mask: ArrayLike | None = None,
                          num_groups: int | None = None) -> Array:
  """DAPO dynamic sampling: True for real rows of groups with non-equal scores.

  A group whose (real) scores are all equal, e.g. all correct or all wrong,
  has zero advantages and contributes no policy gradient, so DAPO over-samples
  and drops it. Equality is exact (``max == min`` over the group's real rows);
  padding rows are always False. Arguments as in ``group_advantages``.
  """
  scores, ids, real, n = _row_inputs("dynamic_sampling_keep", scores, group_ids, mask,
                                     num_groups)
  if jnp.issubdtype(scores.dtype, jnp.integer):
    info = jnp.iinfo(scores.dtype)
    low, high = info.min, info.max
  elif scores.dtype == jnp.bool_:
    scores = scores.astype(jnp.int32)
    low, high = 0, 1
  else:
    low, high = -jnp.inf, jnp.inf
  gmax = jax.ops.segment_max(jnp.where(real, scores, low), ids, num_segments=n)
  gmin = jax.ops.segment_min(jnp.where(real, scores, high), ids, num_segments=n)
  return real & (gmax[ids] > gmin[ids])


def overlong_penalty(lengths: ArrayLike, max_len: int, buffer: int,
                     factor: float = 1.0) -> Array:
  """DAPO soft overlong punishment, to be added to the reward.

  0 for ``length <= max_len - buffer``; ``((max_len - buffer) - length) /
  buffer * factor`` for ``max_len - buffer < length <= max_len`` (linear down
  to ``-factor`` at ``max_len``); ``-factor`` beyond ``max_len``.
  """
  if _is_static_number(buffer) and buffer <= 0:
    raise ValueError(f"overlong_penalty: buffer must be > 0, got {buffer!r}")
  if _is_static_number(max_len) and _is_static_number(buffer) and buffer > max_len:
    raise ValueError(f"overlong_penalty: buffer={buffer!r} exceeds max_len={max_len!r}")
  lengths = jnp.asarray(lengths)
  x = lengths.astype(_float_dtype(lengths))
  start = max_len - buffer
  ramp = (start - x) / buffer * factor
  return jnp.where(x <= start, jnp.zeros_like(x),
                   jnp.where(x <= max_len, ramp, jnp.full_like(x, -factor)))


# ----------------------------------------------------------- per-token terms
def kl_penalty(logp: ArrayLike, ref_logp: ArrayLike, kind: str) -> Array:
  """Per-token KL(pi || pi_ref) estimator from sampled-token log-probs.

  ``kind``: ``k1`` = logp - ref (unbiased, can be negative); ``abs`` =
  |logp - ref|; ``k2`` = 0.5 (logp - ref)^2; ``k3`` = exp(ref - logp) -
  (ref - logp) - 1 (unbiased, >= 0), with the log-ratio clamped to [-20, 20]
  and the value to [-10, 10] (Schulman 2020).
  """
  if kind not in KL_KINDS:
    raise ValueError(f"kl_penalty: unknown kind {kind!r}; expected one of {KL_KINDS}")
  logp = jnp.asarray(logp)
  ref_logp = jnp.asarray(ref_logp)
  diff = logp - ref_logp
  if kind == "k1":
    return diff
  if kind == "abs":
    return jnp.abs(diff)
  if kind == "k2":
    return 0.5 * diff * diff
  log_ratio = jnp.clip(ref_logp - logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  value = jnp.exp(log_ratio) - log_ratio - 1
  return jnp.clip(value, -_K3_VALUE_CLAMP, _K3_VALUE_CLAMP)


def entropy_from_logits(logits: ArrayLike) -> Array:
  """Entropy of ``softmax(logits)`` over the last axis (nats), per position.

  ``H = logsumexp(z) - sum_v p_v z_v``, computed in at least float32 (bf16
  logits are upcast). Entries of -inf (masked vocabulary) contribute 0.
  """
  logits = jnp.asarray(logits)
  z = logits.astype(jnp.promote_types(_float_dtype(logits), jnp.float32))
  logz = jax.nn.logsumexp(z, axis=-1)
  p = jax.nn.softmax(z, axis=-1)
  expected = jnp.sum(p * jnp.where(p > 0, z, 0), axis=-1)
  return logz - expected


def token_logprobs(logits: ArrayLike, tokens: ArrayLike) -> Array:
  """``log softmax(logits)[..., tokens]``: [..., V] logits, [...] int tokens.

  Gathers the token logit and subtracts the logsumexp instead of
  materialising a full [..., V] log-softmax. Computed in at least float32.
  """
  logits = jnp.asarray(logits)
  tokens = jnp.asarray(tokens)
  if logits.shape[:-1] != tokens.shape:
    raise ValueError(f"token_logprobs: logits shape {logits.shape} does not match "
                     f"tokens shape {tokens.shape} + [vocab]")
  z = logits.astype(jnp.promote_types(_float_dtype(logits), jnp.float32))
  picked = jnp.take_along_axis(z, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(z, axis=-1)


# -------------------------------------------------------------- aggregation
def aggregate(loss_mat: ArrayLike, mask: ArrayLike, mode: str,
              scale: ArrayLike | None = None) -> Array:
  """Reduces a [batch, T] per-token loss to a scalar.

  Modes (``n_i`` = real tokens of sequence i; "sequences" are those with
  ``n_i > 0``):

  * ``token-mean``: sum(mask * L) / sum(mask)  (DAPO);
  * ``token-sum``: sum(mask * L);
  * ``seq-mean-token-mean``: mean_i of sum_t(mask * L) / n_i  (GRPO);
  * ``seq-mean-token-sum``: mean_i of sum_t(mask * L);
  * ``seq-mean-token-sum-norm``: ``seq-mean-token-sum / scale`` with ``scale``
    defaulting to the padded length T (Dr. GRPO passes the max response
    length).

  ``scale`` is only meaningful for ``seq-mean-token-sum-norm`` and is rejected
  for other modes. Every mode returns 0 for an all-zero mask.
  """
  if mode not in AGG_MODES:
    raise ValueError(f"aggregate: unknown mode {mode!r}; expected one of {AGG_MODES}")
  if scale is not None and mode != "seq-mean-token-sum-norm":
    raise ValueError(f"aggregate: scale is only used by 'seq-mean-token-sum-norm', "
                     f"got scale={scale!r} with mode {mode!r}")
  if _is_static_number(scale) and not scale > 0:
    raise ValueError(f"aggregate: scale must be > 0, got {scale!r}")
  loss_mat = jnp.asarray(loss_mat)
  mask = _check_mask_2d("aggregate", loss_mat, mask)
  dtype = _float_dtype(loss_mat)
  w = mask.astype(dtype)
  weighted = jnp.where(w != 0, loss_mat.astype(dtype), 0) * w
  count = aggregate_count(w, mode)
  if mode == "token-mean":
    return _safe_div(jnp.sum(weighted), count)
  if mode == "token-sum":
    return jnp.sum(weighted)
  seq_sum = jnp.sum(weighted, axis=-1)
  n_tok = jnp.sum(w, axis=-1)
  if mode == "seq-mean-token-mean":
    return _safe_div(jnp.sum(_safe_div(seq_sum, n_tok)), count)
  seq_mean = _safe_div(jnp.sum(jnp.where(n_tok > 0, seq_sum, 0)), count)
  if mode == "seq-mean-token-sum":
    return seq_mean
  if scale is None:
    scale = loss_mat.shape[-1]
  return seq_mean / scale


def aggregate_count(mask: ArrayLike, mode: str) -> Array:
  """What ``aggregate`` divides the masked loss sum by, for ``mode``: the real tokens
  (``token-mean``), 1 (``token-sum``) or the sequences with a real token
  (``seq-mean-*``). Gradient accumulation weights each microbatch by its share of
  the minibatch's count, so the accumulated gradient is the minibatch's."""
  if mode not in AGG_MODES:
    raise ValueError(f"aggregate_count: unknown mode {mode!r}; expected one of {AGG_MODES}")
  mask = jnp.asarray(mask)
  w = mask.astype(mask.dtype if jnp.issubdtype(mask.dtype, jnp.floating) else jnp.float32)
  if mode == "token-mean":
    return jnp.sum(w)
  if mode == "token-sum":
    return jnp.ones((), w.dtype)
  return jnp.sum((jnp.sum(w, axis=-1) > 0).astype(w.dtype))


# -------------------------------------------------------------- policy loss
def ppo_token_terms(logp: Array, old_logp: Array, advantages: Array, real: Array,
                    clip_low: float, clip_high: float, clip_c: float | None) -> dict[str, Array]:
  """Per-token pieces of the clipped surrogate (see ``policy_loss``), same shape as
  ``logp``: ``pg`` (the loss per token), ``ratio``, ``clipped`` / ``dual`` (which
  branch is active) and the sanitised ``logp``, ``old_logp``, ``adv``. Tokens outside
  ``real`` are zeroed before any arithmetic (NaN-free values and gradients).
  ``advantages`` must already broadcast against ``logp``."""
  dtype = _float_dtype(logp)
  logp = jnp.where(real, logp, 0).astype(dtype)
  old_logp = jnp.where(real, old_logp, 0).astype(dtype)
  adv = jnp.where(real, advantages, 0).astype(dtype)
  log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1 - clip_low, 1 + clip_high)
  pg_unclipped = -adv * ratio
  pg_clipped = -adv * clipped_ratio
  pg = jnp.maximum(pg_unclipped, pg_clipped)
  clipped = pg_clipped > pg_unclipped
  if clip_c is not None:
    cap = -adv * clip_c
    dual = (adv < 0) & (pg > cap)
    pg = jnp.where(dual, cap, pg)
  else:
    dual = jnp.zeros_like(real)
  return dict(pg=pg, ratio=ratio, clipped=clipped, dual=dual, adv=adv, logp=logp,
              old_logp=old_logp)


def policy_loss(logp: ArrayLike, old_logp: ArrayLike, advantages: ArrayLike,
                mask: ArrayLike, clip_low: float = 0.2, clip_high: float = 0.2,
                clip_c: float | None = None, agg: str = "token-mean",
                scale: ArrayLike | None = None) -> tuple[Array, dict[str, Array]]:
  """PPO clipped surrogate with decoupled clip ranges and optional dual clip.

  Per token, with ``r = exp(clamp(logp - old_logp, -20, 20))``:
  ``L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, and with
  ``clip_c`` (> 1) for ``A < 0``: ``L = min(L, -A clip_c)``. ``L`` is reduced
  with ``aggregate(L, mask, agg, scale)``.

  Args:
    logp: [batch, T] log-probs of the sampled tokens under the current policy
      (the only argument gradients are meant to flow through).
    old_logp: [batch, T] log-probs under the behaviour policy.
    advantages: [batch] (one per sequence, broadcast over tokens) or
      [batch, T] (per token).
    mask: [batch, T] real response tokens.
    clip_low, clip_high: clip range ``[1 - clip_low, 1 + clip_high]``.
    clip_c: dual-clip constant (> 1) or None.
    agg, scale: see ``aggregate``.

  Returns:
    ``(loss, metrics)``; metrics are scalars over real tokens (gradient
    stopped): ``clipfrac`` (clipped branch active), ``clipfrac_lower`` (dual
    clip active), ``clipfrac_ratio_high`` / ``clipfrac_ratio_low`` (clipped at
    the upper bound with A > 0 / at the lower bound with A < 0),
    ``approx_kl`` (mean of old_logp - logp), ``ratio_mean``, ``ratio_max``,
    ``pg_loss``.
  """
  for name, value in (("clip_low", clip_low), ("clip_high", clip_high)):
    if _is_static_number(value) and not 0 <= value:
      raise ValueError(f"policy_loss: {name} must be >= 0, got {value!r}")
  if _is_static_number(clip_low) and not clip_low <= 1:
    raise ValueError(f"policy_loss: clip_low must be <= 1, got {clip_low!r}")
  if clip_c is not None and (not _is_static_number(clip_c) or not clip_c > 1):
    raise ValueError(f"policy_loss: dual-clip clip_c must be a number > 1 or None, "
                     f"got {clip_c!r}")
  if agg not in AGG_MODES:
    raise ValueError(f"policy_loss: unknown agg mode {agg!r}; expected one of {AGG_MODES}")
  logp = jnp.asarray(logp)
  old_logp = jnp.asarray(old_logp)
  mask = _check_mask_2d("policy_loss", logp, mask)
  if old_logp.shape != logp.shape:
    raise ValueError(f"policy_loss: old_logp shape {old_logp.shape} differs from logp "
                     f"shape {logp.shape}")
  advantages = jnp.asarray(advantages)
  if advantages.shape == logp.shape[:1]:
    advantages = advantages[:, None]
  elif advantages.shape != logp.shape:
    raise ValueError(f"policy_loss: advantages must be [batch] {logp.shape[:1]} or "
                     f"[batch, T] {logp.shape}, got {advantages.shape}")
  dtype = _float_dtype(logp)
  real = mask.astype(bool)
  w = mask.astype(dtype)
  terms = ppo_token_terms(logp, old_logp, advantages, real, clip_low, clip_high, clip_c)
  pg, ratio, clipped, dual, adv = (terms[k] for k in ("pg", "ratio", "clipped", "dual", "adv"))
  logp, old_logp = terms["logp"], terms["old_logp"]
  loss = aggregate(pg, mask, agg, scale)

  def masked_mean(x: Array) -> Array:
    return _safe_div(jnp.sum(jnp.where(real, x.astype(dtype), 0) * w), jnp.sum(w))

  sg = jax.lax.stop_gradient
  metrics = {
      "pg_loss": sg(loss),
      "clipfrac": sg(masked_mean(clipped)),
      "clipfrac_lower": sg(masked_mean(dual)),
      "clipfrac_ratio_high": sg(masked_mean(clipped & (adv > 0))),
      "clipfrac_ratio_low": sg(masked_mean(clipped & (adv < 0))),
      "approx_kl": sg(masked_mean(old_logp - logp)),
      "ratio_mean": sg(masked_mean(ratio)),
      "ratio_max": sg(jnp.max(jnp.where(real, ratio, 0))),
  }
  return loss, metrics
