"""Jitted GRPO / DAPO learner: advantages, clipped policy loss, optax updates.

One ``Learner.update(batch)`` consumes a step's rollouts:

1. ``prepare`` (jitted, per row bucket): the DAPO dynamic-sampling mask
   (rows of groups whose rewards are all equal get no loss; judged on the raw
   rewards), optional DAPO soft overlong punishment added to the rewards, and
   group-relative advantages (GRPO std normalisation or Dr. GRPO centring).
   Minibatches left with no real token are not updated at all.
2. GRPO only: log-probs of the frozen reference policy, once per batch.
3. ``epochs`` passes over the batch in ``mini_batches`` shuffled minibatches;
   each minibatch is one optimizer update, its gradient accumulated over
   ``grad_accum`` microbatches with ``lax.scan`` (the per-microbatch loss is
   rescaled so the accumulated gradient equals the full-minibatch gradient for
   every aggregation mode).
4. The update is applied only if the loss and the gradient norm are finite;
   otherwise the parameters and optimizer state are left untouched and the
   skip is counted.

Log-probs use ``logits / temperature``, the sampler's distribution, so the
sampler's log-probs are the PPO "old" log-probs.

Shapes: batches come padded to the sampler's row buckets; responses are cut
to the smallest *response bucket* that holds the longest response; the train
step is compiled ahead of time (``warmup``) for every (minibatch rows, prompt
bucket, response bucket), so whatever G the controller picks, no compilation
happens after warm-up. Parameters keep their nnx shardings; batch rows are
sharded on the mesh's ``'data'`` axis.

References: GRPO (Shao et al. 2024, DeepSeekMath), DAPO (Yu et al. 2025),
Dr. GRPO (Liu et al. 2025); see ``losses`` for the per-function citations.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sagc_jax.distributed import put_global, to_host
from sagc_jax.models import sharding as shd
from sagc_jax.models.transformer import ForwardOptions, Transformer
from sagc_jax.programs import ProgramCache, WarmupJob, warm
from sagc_jax.rl import losses
from sagc_jax.rl.chunked_logprobs import chunked_logprobs_entropy
from sagc_jax.rl.rollout import RolloutBatch

__all__ = ["ALGORITHM_PRESETS", "DERIVED_FIELDS", "Learner", "LearnerConfig"]

SCHEDULES = ("constant", "cosine")

# What ``algorithm`` stands for: the objective settings of the published recipes. The
# one source of truth: ``LearnerConfig.grpo/dapo`` and the training config's
# ``apply_algorithm`` (which adds DAPO's overlong buffer, sized from the response
# budget) both read it.
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    # GRPO (DeepSeekMath): symmetric clip, k3 KL to a frozen reference (beta 0.04),
    # per-sequence mean of the token means, std-normalised advantages.
    "grpo": dict(algorithm="grpo", clip_low=0.2, clip_high=0.2, kl_coef=0.04, kl_kind="k3",
                 agg="seq-mean-token-mean", normalize_std=True, dynamic_sampling=False,
                 overlong_buffer=0),
    # DAPO (Yu et al. 2025): clip-higher, token-level mean, no KL, dynamic sampling,
    # soft overlong punishment.
    "dapo": dict(algorithm="dapo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, kl_kind="k3",
                 agg="token-mean", normalize_std=True, dynamic_sampling=True,
                 overlong_factor=1.0),
}

# Fields a training config does not set: derived from other sections (the sampler's
# response budget and temperature, the run's number of optimizer updates).
DERIVED_FIELDS = ("max_response_len", "temperature", "total_steps")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """Learner settings; ``grpo()`` and ``dapo()`` give the published presets.

  Optimisation: AdamW (``lr``, ``b1``, ``b2``, ``eps``, ``weight_decay``) with a
  linear warm-up over ``warmup_steps`` then a ``constant`` or ``cosine`` (to
  ``min_lr_ratio * lr`` at ``total_steps``) schedule; global-norm clipping at
  ``max_grad_norm``. Steps count optimizer updates.

  Objective: ``clip_low``/``clip_high`` (and dual clip ``clip_c``), aggregation
  ``agg`` (with ``agg_scale`` for ``seq-mean-token-sum-norm``), KL to a frozen
  reference policy with ``kl_coef`` (0 = no reference model in memory) and
  estimator ``kl_kind``, advantages with ``normalize_std``.

  DAPO extras: ``overlong_buffer`` > 0 enables the soft overlong punishment
  over the last ``overlong_buffer`` tokens before ``max_response_len`` with
  ``overlong_factor``; ``dynamic_sampling`` drops zero-variance groups
  (``dynamic_max_rounds`` sampling rounds at most to refill the batch).

  Batching: ``mini_batches`` updates per pass, ``epochs`` passes per rollout
  batch, ``grad_accum`` microbatches per update.

  Memory and compile knobs (they change how, never what, is computed):
  ``remat`` (per-layer rematerialisation policy), ``scan_layers`` (one ``lax.scan``
  over the layers), ``attention`` / ``attention_block`` (``"blocked"``: query-blocked
  attention, O(block x T) memory; ``"splash"``: the fused Pallas kernel on TPU, no
  score tensor in HBM, tiles of ``attention_block``), ``logits_chunk`` (positions per chunk of the
  vocabulary projection; never a [rows, T, vocab] array), ``fsdp`` (float32 master
  weights, Adam moments and the reference model sharded over ``'data'`` as well as
  ``'model'``). See ``sagc_jax.models.transformer.ForwardOptions``.
  """
  algorithm: str = "grpo"
  lr: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  warmup_steps: int = 0
  schedule: str = "constant"
  total_steps: int = 1000
  min_lr_ratio: float = 0.0
  max_grad_norm: float = 1.0
  clip_low: float = 0.2
  clip_high: float = 0.2
  clip_c: float | None = None
  agg: str = "seq-mean-token-mean"
  agg_scale: float | None = None
  kl_coef: float = 0.04
  kl_kind: str = "k3"
  normalize_std: bool = True
  adv_eps: float = 1e-6
  temperature: float = 1.0
  mini_batches: int = 1
  epochs: int = 1
  grad_accum: int = 1
  overlong_buffer: int = 0
  overlong_factor: float = 1.0
  max_response_len: int = 0
  dynamic_sampling: bool = False
  dynamic_max_rounds: int = 3
  remat: str = "none"
  scan_layers: bool = False
  attention: str = "dense"
  attention_block: int = 512
  logits_chunk: int = 512
  fsdp: bool = False

  @classmethod
  def grpo(cls, **overrides) -> "LearnerConfig":
    """GRPO: std-normalised advantages, clip 0.2, k3 KL (beta 0.04), seq-mean-token-mean."""
    return cls(**{**ALGORITHM_PRESETS["grpo"], **overrides})

  @classmethod
  def dapo(cls, **overrides) -> "LearnerConfig":
    """DAPO: clip-higher 0.2/0.28, token-mean, no KL, dynamic sampling, overlong shaping."""
    return cls(**{**ALGORITHM_PRESETS["dapo"], **overrides})

  def __post_init__(self):
    def fail(key, why):
      raise ValueError(f"learner.{key}={getattr(self, key)!r} {why}")
    for key in ("lr", "eps", "max_grad_norm", "temperature", "adv_eps"):
      value = getattr(self, key)
      if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        fail(key, "must be a positive number")
    for key in ("b1", "b2"):
      if not 0 <= getattr(self, key) < 1:
        fail(key, "must be in [0, 1)")
    for key in ("weight_decay", "kl_coef", "clip_low", "clip_high", "overlong_factor"):
      if not getattr(self, key) >= 0:
        fail(key, "must be >= 0")
    if self.clip_low > 1:
      fail("clip_low", "must be <= 1")
    if self.clip_c is not None and not self.clip_c > 1:
      fail("clip_c", "must be > 1 (dual clip) or None")
    for key in ("mini_batches", "epochs", "grad_accum", "dynamic_max_rounds", "total_steps"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(key, "must be a positive int")
    for key in ("warmup_steps", "overlong_buffer", "max_response_len"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(key, "must be an int >= 0")
    if self.schedule not in SCHEDULES:
      fail("schedule", f"is not one of {SCHEDULES}")
    if not 0 <= self.min_lr_ratio <= 1:
      fail("min_lr_ratio", "must be in [0, 1]")
    if self.agg not in losses.AGG_MODES:
      fail("agg", f"is not one of {losses.AGG_MODES}")
    if self.agg_scale is not None and (self.agg != "seq-mean-token-sum-norm"
                                       or not self.agg_scale > 0):
      fail("agg_scale", "is only valid (> 0) with agg='seq-mean-token-sum-norm'")
    if self.kl_kind not in losses.KL_KINDS:
      fail("kl_kind", f"is not one of {losses.KL_KINDS}")
    if isinstance(self.logits_chunk, bool) or not isinstance(self.logits_chunk, int) \
        or self.logits_chunk < 1:
      fail("logits_chunk", "must be a positive int")
    for key in ("scan_layers", "fsdp"):
      if not isinstance(getattr(self, key), bool):
        fail(key, "must be True or False")
    try:
      self.forward_options()
    except ValueError as err:
      raise ValueError(f"learner.{err}") from None
    if self.overlong_buffer and self.overlong_buffer > self.max_response_len:
      fail("overlong_buffer", f"exceeds max_response_len={self.max_response_len} (set "
           "max_response_len to the sampler's max_new_tokens)")

  @classmethod
  def from_dict(cls, values: dict[str, Any]) -> "LearnerConfig":
    """Builds from a config section (``algorithm`` picks the preset defaults)."""
    values = dict(values)
    algorithm = values.get("algorithm", "grpo")
    presets = {"grpo": cls.grpo, "dapo": cls.dapo}
    if algorithm not in presets:
      raise ValueError(f"learner.algorithm={algorithm!r} is not one of {tuple(ALGORITHM_PRESETS)}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"learner.{unknown[0]} is not a learner setting "
                       f"(allowed: {', '.join(sorted(fields))})")
    return presets[algorithm](**values)

  def check_split(self, rows: int, what: str, data_ways: int = 1) -> None:
    """``rows`` must split into ``mini_batches`` x ``grad_accum`` equal microbatches of
    a multiple of ``data_ways`` rows (each minibatch a fixed set of whole rows, every
    microbatch spread over the mesh's 'data' axis); ``what`` names the rows."""
    micro, rem = divmod(rows, self.mini_batches * self.grad_accum)
    if rem or micro % data_ways:
      rows_of = (f" of a multiple of {data_ways} rows (the mesh 'data' axis)"
                 if data_ways > 1 else "")
      raise ValueError(
          f"{what} does not split into learner.mini_batches={self.mini_batches} x "
          f"learner.grad_accum={self.grad_accum} equal microbatches{rows_of}")

  def forward_options(self) -> ForwardOptions:
    """How the learner's forward passes are computed (remat, scan, attention)."""
    return ForwardOptions(attention=self.attention, attention_block=self.attention_block,
                          remat=self.remat, scan_layers=self.scan_layers)

  def learning_rate_schedule(self) -> optax.Schedule:
    """Learning rate as a function of the number of applied optimizer updates."""
    if self.schedule == "cosine":
      decay = optax.cosine_decay_schedule(self.lr, max(self.total_steps - self.warmup_steps, 1),
                                          alpha=self.min_lr_ratio)
    else:
      decay = optax.constant_schedule(self.lr)
    if not self.warmup_steps:
      return decay
    return optax.join_schedules([optax.linear_schedule(0.0, self.lr, self.warmup_steps), decay],
                                [self.warmup_steps])

  def optimizer(self) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(self.max_grad_norm),
                       optax.adamw(self.learning_rate_schedule(), b1=self.b1, b2=self.b2,
                                   eps=self.eps, weight_decay=self.weight_decay))


def _is_abstract(tree) -> bool:
  return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def _fsdp_names(names: tuple, shape: tuple[int, ...], mesh: Mesh) -> tuple:
  """Adds 'data' to the largest dimension not already sharded (FSDP / ZeRO-3).

  A dimension qualifies only if it divides by the 'data' axis; vectors (norm
  scales, biases) stay as they are: they are tiny and gathering them is waste.
  """
  data = mesh.shape.get("data", 1)
  if data == 1 or len(shape) < 2:
    return names
  free = [i for i, n in enumerate(names) if n is None and shape[i] % data == 0]
  if not free:
    return names
  i = max(free, key=lambda j: shape[j])
  return tuple("data" if j == i else n for j, n in enumerate(names))


class Learner:
  """Owns the optimizer state and the compiled train steps for one policy.

  Weights. The model may hold bfloat16 weights (what the sampler reads); the
  learner keeps **float32 master weights** and float32 Adam moments, computes the
  forward/backward in the model's dtype (the master weights are cast inside the
  step, so gradients arrive in float32 and accumulate in float32), and writes the
  updated weights back to the model cast to its dtype and sharding. At lr = 1e-6 a
  bfloat16 weight (8 mantissa bits) would absorb most updates unchanged; a float32
  master copy keeps every one. With a float32 model and no FSDP the model shares the
  master's buffers (nothing is cast or copied); with FSDP the master is a resharded
  copy and every sync reshards it.

  Sharding. The model keeps its tensor-parallel layout (heads / MLP units /
  vocabulary on 'model', replicated over 'data'), which the sampler wants. With
  ``fsdp`` the master weights, both Adam moments and the frozen reference are also
  split over 'data' (each chip holds 1 / (data x model) of them); the Adam moments
  always have exactly their parameter's sharding. Microbatches of the gradient
  accumulation are interleaved (row i goes to microbatch i mod grad_accum), so each
  microbatch keeps its rows spread over the 'data' axis.

  The model may be abstract (``abstract_model(..., mesh=)``: ShapeDtypeStruct leaves):
  then nothing is allocated and the learner can only ``lower`` / ``compile``, which
  is how ``sagc_jax.aot`` sizes a TPU pod from a CPU host.

  Args:
    model: the policy; its parameters are updated in place at the end of each
      ``update`` (so the sampler sees them).
    config: ``LearnerConfig``.
    row_buckets, prompt_buckets, response_buckets: the padded shapes batches
      can have (rows and prompts as in the sampler; responses are cut to the
      smallest response bucket holding the longest response).
    mesh: optional mesh; batch rows go on ``'data'``.
  """

  def __init__(self, model: Transformer, config: LearnerConfig, row_buckets: Sequence[int],
               prompt_buckets: Sequence[int], response_buckets: Sequence[int], *,
               mesh: Mesh | None = None):
    self.model = model
    self.config = config
    self.mesh = mesh
    # splash shards its kernel over the mesh itself (shard_map); the residual stream
    # keeps its rows on 'data' (microbatch rows are a multiple of it, checked below).
    rows_on_data = (None if mesh is None or mesh.shape.get("data", 1) == 1
                    else NamedSharding(mesh, P("data")))
    self.options = dataclasses.replace(config.forward_options(), mesh=mesh,
                                       row_sharding=rows_on_data)
    self.row_buckets = tuple(sorted(set(row_buckets)))
    self.prompt_buckets = tuple(sorted(set(prompt_buckets)))
    self.response_buckets = tuple(sorted(set(response_buckets)))
    data = 1 if mesh is None else mesh.shape.get("data", 1)
    for rows in self.row_buckets:
      config.check_split(rows, f"row bucket {rows}", data)
    self.graphdef, model_params, self.rest = nnx.split(model, nnx.Param, ...)
    self.abstract = _is_abstract(model_params)
    self.compute_dtype = jax.tree.leaves(model_params)[0].dtype
    self.tx = config.optimizer()
    self._schedule = config.learning_rate_schedule()

    self._model_shardings = (None if mesh is None else
                             jax.tree.map(lambda x: x.sharding, model_params))
    self._param_shardings = self._master_shardings(model_params)
    master = self._to_dtype(model_params, jnp.float32, self._param_shardings)
    self.params = master
    self._shares_master = master is model_params
    opt_shapes = jax.eval_shape(self.tx.init, self._abstract(master))
    self._opt_shardings = (None if mesh is None else
                           self._like_params(opt_shapes, self._param_shardings,
                                             NamedSharding(mesh, P())))
    if self.abstract:
      self.opt_state = jax.tree.map(
          lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), opt_shapes,
          self._opt_shardings) if mesh is not None else opt_shapes
    else:
      init = jax.jit(self.tx.init, **({} if mesh is None else
                                      dict(out_shardings=self._opt_shardings)))
      self.opt_state = init(master)
    self.reference = (self._to_dtype(master, self.compute_dtype, self._param_shardings,
                                     copy=True) if config.kl_coef > 0 else None)
    self.step = 0
    self.skipped_updates = 0
    state_sh = (None if mesh is None else (self._param_shardings, self._opt_shardings))
    self._state_shardings = state_sh
    self._train_step = jax.jit(self._make_train_step(), donate_argnums=(0, 1),
                               **self._jit_shardings(state_sh))
    self._ref_logprobs = jax.jit(self._make_ref_logprobs())
    self._prepare = jax.jit(self._make_prepare())
    self.programs = ProgramCache(self._lower)

  # ------------------------------------------------------------- weights
  def _master_shardings(self, model_params):
    """Shardings of the master weights: the model's, plus 'data' with ``fsdp``."""
    if self.mesh is None:
      return None
    if not self.config.fsdp:
      return self._model_shardings

    def fsdp(x):
      names = tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
      names = shd.fit_spec(x.shape, _fsdp_names(names, x.shape, self.mesh), self.mesh)
      return NamedSharding(self.mesh, P(*names))
    return jax.tree.map(fsdp, model_params)

  @staticmethod
  def _like_params(tree, param_shardings, default):
    """Shardings for an optax state: subtrees shaped like the params get theirs."""
    structure = jax.tree.structure(param_shardings)

    def is_param_tree(x):
      return jax.tree.structure(x) == structure
    return jax.tree.map(
        lambda x: param_shardings if is_param_tree(x) else
        jax.tree.map(lambda _: default, x), tree, is_leaf=is_param_tree)

  def _to_dtype(self, params, dtype, shardings, *, copy: bool = False):
    """``params`` cast to ``dtype`` and placed with ``shardings`` (abstract if the
    model is); ``params`` itself when nothing would change and ``copy`` is False."""
    leaves = jax.tree.leaves(params)
    same_sharding = shardings is None or all(
        getattr(x, "sharding", None) == s
        for x, s in zip(leaves, jax.tree.leaves(shardings)))
    if all(x.dtype == dtype for x in leaves) and same_sharding and not copy:
      return params
    if self.abstract:
      if shardings is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), params)
      return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, dtype, sharding=s),
                          params, shardings)
    return self._cast_fn(dtype, shardings)(params)

  def _cast_fn(self, dtype, shardings):
    """Jitted ``astype(dtype)`` of a params tree, output placed with ``shardings``."""
    return jax.jit(lambda p: jax.tree.map(lambda x: x.astype(dtype), p),
                   **({} if shardings is None else dict(out_shardings=shardings)))

  def _sync_executable(self):
    """The compiled master -> model cast (None when the model shares the master)."""
    if self._shares_master:
      return None
    return self.programs.get(("sync",))

  def sync_model(self) -> None:
    """Writes the current master weights into the model (its dtype and layout)."""
    cast = self._sync_executable()
    nnx.update(self.model, self.params if cast is None else cast(self.params))

  # ------------------------------------------------------------ jitted code
  def _make_prepare(self):
    cfg = self.config

    def learner_prepare(scores, lengths, group_ids, row_valid):
      scores = scores.astype(jnp.float32)
      # DAPO drops groups whose *rewards* are all equal (all right or all wrong);
      # the overlong penalty below must not make an all-wrong group look informative.
      keep = (losses.dynamic_sampling_keep(scores, group_ids, mask=row_valid)
              if cfg.dynamic_sampling else row_valid)
      if cfg.overlong_buffer:
        scores = scores + losses.overlong_penalty(lengths, cfg.max_response_len,
                                                  cfg.overlong_buffer, cfg.overlong_factor)
      scores = jnp.where(row_valid, scores, 0.0)
      adv = losses.group_advantages(scores, group_ids, normalize_std=cfg.normalize_std,
                                    eps=cfg.adv_eps, mask=row_valid)
      return adv, keep, scores

    return learner_prepare

  def _forward_logprobs(self, params, tokens, attn_mask, n_resp):
    """(log-probs [b, N], entropy [b, N]) of the response tokens.

    ``params`` may be the float32 master weights: they are cast to the model's
    dtype here, inside the differentiated function.
    """
    params = jax.tree.map(lambda x: x.astype(self.compute_dtype), params)
    model = nnx.merge(self.graphdef, params, self.rest)
    hidden, _ = model.hidden_states(tokens, attention_mask=attn_mask, options=self.options)
    prompt_len = tokens.shape[1] - n_resp
    weight, transposed = model.head_weight()
    return chunked_logprobs_entropy(hidden[:, prompt_len - 1:-1], weight, transposed,
                                    tokens[:, prompt_len:],
                                    temperature=self.config.temperature,
                                    chunk=self.config.logits_chunk)

  def _make_ref_logprobs(self):
    accum = self.config.grad_accum
    interleave = self._interleave

    def learner_ref_logprobs(ref_params, tokens, attn_mask, resp_mask):
      # Microbatches of the train step's size, one at a time (lax.map), so the
      # reference pass never holds more activations than a training microbatch.
      def one(micro):
        tok, am, rm = micro
        logp, _ = self._forward_logprobs(ref_params, tok, am, rm.shape[1])
        return jnp.where(rm, logp, 0.0)
      out = jax.lax.map(one, tuple(interleave(x) for x in (tokens, attn_mask, resp_mask)))
      return out.swapaxes(0, 1).reshape((-1,) + out.shape[2:]) if accum > 1 else out[0]
    return learner_ref_logprobs

  def _interleave(self, x: jax.Array) -> jax.Array:
    """[rows, ...] -> [grad_accum, rows / grad_accum, ...], row i in microbatch
    i mod grad_accum: each microbatch keeps its share of every 'data' shard."""
    a = self.config.grad_accum
    x = x.reshape((x.shape[0] // a, a) + x.shape[1:]).swapaxes(0, 1)
    if self.mesh is not None and x.ndim >= 2:
      x = jax.lax.with_sharding_constraint(
          x, NamedSharding(self.mesh, P(None, "data", *([None] * (x.ndim - 2)))))
    return x

  def _make_train_step(self):
    cfg = self.config
    tx = self.tx
    interleave = self._interleave
    param_shardings = self._param_shardings

    def pin_like_params(tree):
      """The float32 gradient sum keeps the master weights' (FSDP) sharding."""
      if param_shardings is None:
        return tree
      return jax.lax.with_sharding_constraint(tree, param_shardings)

    def micro_loss(params, micro, mb_count):
      tokens, attn_mask, resp_mask, old_logp, adv, ref_logp = micro
      logp, entropy = self._forward_logprobs(params, tokens, attn_mask, resp_mask.shape[1])
      share = losses.aggregate_count(resp_mask, cfg.agg) / mb_count
      fraction = jnp.where(mb_count > 0, share, 0.0)
      pg, metrics = losses.policy_loss(logp, old_logp, adv, resp_mask, clip_low=cfg.clip_low,
                                       clip_high=cfg.clip_high, clip_c=cfg.clip_c,
                                       agg=cfg.agg, scale=cfg.agg_scale)
      loss = pg * fraction
      if cfg.kl_coef > 0:
        kl = losses.aggregate(losses.kl_penalty(logp, ref_logp, cfg.kl_kind), resp_mask,
                              cfg.agg, cfg.agg_scale)
        loss = loss + cfg.kl_coef * kl * fraction
        metrics["kl"] = jax.lax.stop_gradient(kl)
      w = resp_mask.astype(jnp.float32)
      metrics["entropy"] = jnp.sum(entropy * w) / jnp.maximum(jnp.sum(w), 1.0)
      metrics["tokens"] = jnp.sum(w)
      return loss, metrics

    def learner_train_step(params, opt_state, tokens, attn_mask, resp_mask, old_logp, adv,
                           ref_logp):
      mb_count = losses.aggregate_count(resp_mask, cfg.agg)
      micro = jax.tree.map(interleave, (tokens, attn_mask, resp_mask, old_logp, adv, ref_logp))
      grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

      def accumulate(carry, batch):
        (loss, metrics), grads = grad_fn(params, batch, mb_count)
        carry_grads, carry_loss, carry_metrics = carry
        weight = metrics["tokens"]
        metrics = {k: v * weight for k, v in metrics.items() if k != "tokens"}
        grads = pin_like_params(jax.tree.map(lambda g: g.astype(jnp.float32), grads))
        return (jax.tree.map(jnp.add, carry_grads, grads), carry_loss + loss,
                jax.tree.map(jnp.add, carry_metrics, {**metrics, "tokens": weight})), None

      zero_metrics = jax.eval_shape(lambda: micro_loss(params, jax.tree.map(
          lambda x: x[0], micro), mb_count)[1])
      zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_metrics)
      zero_grads = pin_like_params(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32),
                                                params))
      init = (zero_grads, jnp.float32(0), zero_metrics)
      (grads, loss, sums), _ = jax.lax.scan(accumulate, init, micro)
      tokens_total = sums.pop("tokens")
      metrics = {k: v / jnp.maximum(tokens_total, 1.0) for k, v in sums.items()}
      grad_norm = optax.tree.norm(grads)
      finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

      def apply(_):
        updates, new_opt = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt

      new_params, new_opt = jax.lax.cond(finite, apply, lambda _: (params, opt_state), None)
      metrics.update(loss=loss, grad_norm=grad_norm, skipped=(~finite).astype(jnp.float32),
                     tokens=tokens_total)
      return new_params, new_opt, metrics

    return learner_train_step

  # --------------------------------------------------------- shapes, compile
  def _row_sharding(self, ndim: int):
    if self.mesh is None:
      return None
    return NamedSharding(self.mesh, P("data", *([None] * (ndim - 1))))

  def _jit_shardings(self, state_sh) -> dict[str, Any]:
    if state_sh is None:
      return {}
    rows = [self._row_sharding(n) for n in (2, 2, 2, 2, 1, 2)]
    repl = NamedSharding(self.mesh, P())
    return dict(in_shardings=(state_sh[0], state_sh[1], *rows),
                out_shardings=(state_sh[0], state_sh[1], repl))

  def _abstract_batch(self, rows: int, prompt_len: int, n_resp: int) -> tuple:
    seq = prompt_len + n_resp
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype,
                                                     sharding=self._row_sharding(len(shape)))
    return (spec((rows, seq), jnp.int32), spec((rows, seq), jnp.bool_),
            spec((rows, n_resp), jnp.bool_), spec((rows, n_resp), jnp.float32),
            spec((rows,), jnp.float32), spec((rows, n_resp), jnp.float32))

  @staticmethod
  def _abstract(tree):
    return shd.abstract_like(tree)

  def _lower(self, key: tuple):
    """The lowered program of ``key``: ``("sync",)``, ``("prepare", rows)``, or
    ``("train" | "ref", minibatch rows, prompt bucket, response bucket)``."""
    kind, *shape = key
    if kind == "sync":
      cast = self._cast_fn(self.compute_dtype, self._model_shardings)
      return cast.lower(self._abstract(self.params))
    if kind == "prepare":
      (rows,) = shape
      return self._prepare.lower(jax.ShapeDtypeStruct((rows,), jnp.float32),
                                 jax.ShapeDtypeStruct((rows,), jnp.int32),
                                 jax.ShapeDtypeStruct((rows,), jnp.int32),
                                 jax.ShapeDtypeStruct((rows,), jnp.bool_))
    batch = self._abstract_batch(*shape)
    if kind == "train":
      return self._train_step.lower(self._abstract(self.params),
                                    self._abstract(self.opt_state), *batch)
    return self._ref_logprobs.lower(self._abstract(self.reference), *batch[:3])

  def compile_train(self, rows: int, prompt_len: int, n_resp: int):
    """The train step for minibatches of ``rows`` rows (cached)."""
    return self.programs.get(("train", rows, prompt_len, n_resp))

  def compile_reference(self, rows: int, prompt_len: int, n_resp: int):
    """The reference log-prob pass (None without a KL term), cached."""
    if self.reference is None:
      return None
    return self.programs.get(("ref", rows, prompt_len, n_resp))

  def compile_prepare(self, rows: int):
    return self._prepare_executable(rows)

  def compile_sync(self):
    """The master -> model weight cast (None when the model shares the master)."""
    return self._sync_executable()

  def _executables(self, rows: int, prompt_len: int, n_resp: int):
    """(train step, reference log-probs) compiled for one minibatch shape."""
    return (self.compile_train(rows, prompt_len, n_resp),
            self.compile_reference(rows, prompt_len, n_resp))

  def _prepare_executable(self, rows: int):
    return self.programs.get(("prepare", rows))

  def minibatch_rows(self, rows: int) -> int:
    return rows // self.config.mini_batches

  def warmup(self) -> int:
    """Compiles every shape a batch from the buckets can take; returns how many."""
    return warm(self.warmup_jobs())

  def warmup_jobs(self) -> list[WarmupJob]:
    """The programs ``warmup`` compiles, for ``programs.warm``."""
    # The logged learning rate evaluates the optax schedule eagerly: its scalar ops
    # compile on first use, so that happens here and not in the first step.
    self._learning_rate()
    keys = [] if self._shares_master else [("sync",)]
    for rows in self.row_buckets:
      keys.append(("prepare", rows))
      for prompt_len in self.prompt_buckets:
        for n_resp in self.response_buckets:
          shape = (self.minibatch_rows(rows), prompt_len, n_resp)
          keys.append(("train", *shape))
          if self.reference is not None:
            keys.append(("ref", *shape))
    return [WarmupJob(self.programs, keys)]

  @property
  def num_executables(self) -> int:
    return len(self.programs)

  def response_bucket(self, longest: int) -> int:
    for bucket in self.response_buckets:
      if longest <= bucket:
        return bucket
    raise ValueError(f"longest response {longest} exceeds the largest response bucket "
                     f"{self.response_buckets[-1]}")

  # ---------------------------------------------------------------- update
  def prepare(self, batch: RolloutBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(advantages, keep mask, shaped rewards) per row, computed in the jitted prepare."""
    rows = batch.num_rows
    if rows not in self.row_buckets:
      raise ValueError(f"batch has {rows} rows; learner row buckets are {self.row_buckets}")
    adv, keep, shaped = self._prepare_executable(rows)(
        batch.scores.astype(np.float32), batch.lengths.astype(np.int32),
        batch.group_ids.astype(np.int32), batch.row_valid)
    return np.asarray(adv), np.asarray(keep), np.asarray(shaped)

  def _device(self, arrays: tuple) -> tuple:
    if self.mesh is None:
      return arrays
    return tuple(put_global(a, self._row_sharding(a.ndim)) for a in arrays)

  def update(self, batch: RolloutBatch, seed: int = 0) -> dict[str, float]:
    """Trains on one rollout batch; returns metrics averaged over its updates."""
    start = time.perf_counter()
    cfg = self.config
    adv, keep, shaped = self.prepare(batch)
    longest = int(batch.lengths.max()) if batch.row_valid.any() else 1
    n_resp = self.response_bucket(max(longest, 1))
    prompt_len = batch.prompt_tokens.shape[1]
    resp_mask = batch.response_mask[:, :n_resp] & keep[:, None]
    tokens = np.concatenate([batch.prompt_tokens, batch.response_tokens[:, :n_resp]], axis=1)
    attn_mask = np.concatenate([batch.prompt_mask, batch.response_mask[:, :n_resp]], axis=1)
    old_logp = batch.old_logprobs[:, :n_resp].astype(np.float32)
    mb_rows = self.minibatch_rows(batch.num_rows)
    train, ref = self._executables(mb_rows, prompt_len, n_resp)

    ref_logp = np.zeros_like(old_logp)
    if ref is not None:
      for lo in range(0, batch.num_rows, mb_rows):
        sl = slice(lo, lo + mb_rows)
        ref_logp[sl] = to_host(ref(self.reference, *self._device(
            (tokens[sl], attn_mask[sl], resp_mask[sl]))))

    rng = np.random.default_rng([seed, self.step])
    history = []
    empty_minibatches = 0
    for _ in range(cfg.epochs):
      order = rng.permutation(batch.num_rows)
      for lo in range(0, batch.num_rows, mb_rows):
        idx = order[lo:lo + mb_rows]
        if not resp_mask[idx].any():
          # Only padding / filtered rows: no gradient, and an AdamW step would still
          # move the weights (momentum, decay), so there is no update at all.
          empty_minibatches += 1
          continue
        inputs = self._device((tokens[idx], attn_mask[idx], resp_mask[idx], old_logp[idx],
                               adv[idx].astype(np.float32), ref_logp[idx]))
        self.params, self.opt_state, metrics = train(self.params, self.opt_state, *inputs)
        history.append(metrics)
        self.step += 1
    history = to_host(history)
    if not history:
      self.sync_model()
      return {"updates": 0.0, "skipped_updates": 0.0, "empty_minibatches": float(
          empty_minibatches), "total_skipped_updates": float(self.skipped_updates),
              "kept_rows": float(keep.sum()), "real_rows": float(batch.row_valid.sum()),
              "learner_seconds": time.perf_counter() - start,
              "lr": float(self._learning_rate())}
    skipped = int(sum(m["skipped"] for m in history))
    self.skipped_updates += skipped
    self.sync_model()
    out = {k: float(np.mean([m[k] for m in history])) for k in history[0]
           if k not in ("skipped", "tokens")}
    real_tokens = float(resp_mask.sum())
    out.update(
        updates=float(len(history)), skipped_updates=float(skipped),
        empty_minibatches=float(empty_minibatches),
        total_skipped_updates=float(self.skipped_updates),
        kept_rows=float(keep.sum()), real_rows=float(batch.row_valid.sum()),
        adv_abs_mean=float(np.abs(adv[keep]).mean()) if keep.any() else 0.0,
        shaped_reward_mean=float(shaped[batch.row_valid].mean()) if batch.row_valid.any()
        else 0.0,
        response_tokens=real_tokens,
        padded_tokens=float(tokens.shape[0] * tokens.shape[1]),
        response_bucket=float(n_resp), learner_seconds=time.perf_counter() - start,
        lr=float(self._learning_rate()))
    return out

  def _learning_rate(self) -> float:
    """Current learning rate (for logging): the schedule at the number of applied
    updates (skipped non-finite updates leave optax's count unchanged)."""
    applied = self.step - self.skipped_updates
    return float(self._schedule(applied))
