"""Jitted GRPO / DAPO learner: advantages, clipped policy loss, optax updates.

One ``Learner.update(batch)`` consumes a step's rollouts:

1. ``prepare`` (jitted, per row bucket): the DAPO dynamic-sampling mask
   (rows of groups whose rewards are all equal get no loss; judged on the raw
   rewards), optional DAPO soft overlong punishment added to the rewards, and
   group-relative advantages (GRPO std normalisation or Dr. GRPO centring).
   Minibatches left with no real token are not updated at all.
2. Before the first update: log-probs of the frozen reference policy (GRPO's KL) and,
   with ``recompute_old_logprobs``, the current policy's own (the PPO "old" log-probs,
   instead of the sampler's), each in one forward pass per microbatch before the
   first update.
3. ``epochs`` passes over the batch in ``mini_batches`` shuffled minibatches (sets of
   whole sequences); each minibatch is one optimizer update, its gradient accumulated
   over its microbatches by the host (one compiled gradient step per microbatch shape,
   summing into a donated float32 buffer, then one compiled update). Each token carries
   its sequence's aggregation weight (``packing.sequence_weights``), so the accumulated
   loss and gradient are the minibatch's exactly, for every aggregation mode.
4. The update is applied only if the loss and the gradient norm are finite;
   otherwise the parameters and optimizer state are left untouched and the
   skip is counted.

Log-probs use ``logits / temperature``, the sampler's distribution, so the
sampler's log-probs are the PPO "old" log-probs (``logprob_mismatch_mean`` /
``_max`` report how far the learner's forward pass is from them, every step).

Layouts (``rl/packing.py``). Packed (default): each minibatch's sequences are packed
first-fit-decreasing into rows of the smallest pack length (largest prompt bucket +
a response bucket) holding its longest sequence, attention stays inside a sequence
(segment ids) and RoPE positions restart per sequence; the rows run as microbatches of
row counts from a ladder (the 'data' axis doubled up to the padded microbatch).
Padded (``packing=False``, the reference): one left-padded row per sequence,
responses cut to the smallest response bucket holding the longest response,
``grad_accum`` microbatches per minibatch. Every shape is
compiled ahead of time (``warmup``), so whatever G the controller picks and whatever
the lengths, no compilation happens after warm-up. Parameters keep their nnx
shardings; batch rows are sharded on the mesh's ``'data'`` axis.

References: GRPO (Shao et al. 2024, DeepSeekMath), DAPO (Yu et al. 2025),
Dr. GRPO (Liu et al. 2025); see ``losses`` for the per-function citations.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sagc_jax.runtime.distributed import put_global, to_host
from sagc_jax.models import sharding as shd
from sagc_jax.models.transformer import Transformer
from sagc_jax.runtime.compilation import ProgramCache, WarmupJob, warm
from sagc_jax.rl import losses
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.chunked_logprobs import chunked_logprobs_entropy
from sagc_jax.rl.packing import (LearnerBatch, StepSequences, pack_minibatch, pad_minibatch,
                                 row_ladder)
from sagc_jax.rl.rollout import RolloutBatch

__all__ = ["Learner"]

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


# Microbatch sums combined with max, not +, across a minibatch's microbatches.
_MAX_SUMS = ("ratio_max", "mismatch_max")
# Sums that are already the minibatch's value (the loss and its parts); the rest are
# per-token sums, divided by the minibatch's real tokens.
_EXACT_SUMS = ("loss", "pg_loss", "kl") + _MAX_SUMS


def _smallest_holding(value: int, sizes: Sequence[int], what: str, kind: str) -> int:
  """The smallest of the sorted ``sizes`` that is >= ``value``; else a ValueError naming
  ``what`` and the largest ``kind``."""
  for size in sizes:
    if value <= size:
      return size
  raise ValueError(f"{what} exceeds the largest {kind} {sizes[-1]}")


def _update_metrics(history: list) -> dict[str, list[float]]:
  """Per-update metrics from (sums, apply info) pairs: exact minibatch values (a
  token-mean over the minibatch, not a mean of microbatch means)."""
  out: dict[str, list[float]] = {}
  for sums, info in history:
    tokens = max(float(sums["tokens"]), 1.0)
    for key, value in sums.items():
      if key in ("tokens", "mismatch_sum", "mismatch_max"):
        continue
      out.setdefault(key, []).append(float(value) if key in _EXACT_SUMS
                                     else float(value) / tokens)
    out.setdefault("grad_norm", []).append(float(info["grad_norm"]))
  return out


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
    # Packed microbatches: rows of a pack length holding a prompt bucket plus a response
    # bucket; row counts from doubling the 'data' axis up to the padded layout's
    # microbatch (so a packed microbatch never holds more tokens than a padded one).
    self.pack_lengths = tuple(sorted({self.prompt_buckets[-1] + n
                                      for n in self.response_buckets}))
    self.row_ladder = row_ladder(
        self.minibatch_rows(self.row_buckets[-1]) // config.grad_accum, data)
    self._build_programs()
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

  def _forward_logprobs(self, params, batch: LearnerBatch):
    """(log-probs [rows, N], entropy [rows, N]) of the batch's N target columns.

    ``params`` may be the float32 master weights: they are cast to the model's
    dtype here, inside the differentiated function.
    """
    params = jax.tree.map(lambda x: x.astype(self.compute_dtype), params)
    model = nnx.merge(self.graphdef, params, self.rest)
    hidden, _ = model.hidden_states(batch.tokens, positions=batch.positions,
                                    segment_ids=batch.segment_ids, options=self.options)
    _, t, n = batch.shape
    weight, transposed = model.head_weight()
    return chunked_logprobs_entropy(hidden[:, t - n - 1:-1], weight, transposed,
                                    batch.tokens[:, t - n:],
                                    temperature=self.config.temperature,
                                    chunk=self.config.logits_chunk)

  def _make_logprobs(self):
    def learner_logprobs(params, batch: LearnerBatch):
      logp, _ = self._forward_logprobs(params, batch)
      return jnp.where(batch.loss_mask, logp, 0.0)
    return learner_logprobs

  def _pin_like_params(self, tree):
    """Float32 gradients keep the master weights' (FSDP) sharding."""
    if self._param_shardings is None:
      return tree
    return jax.lax.with_sharding_constraint(tree, self._param_shardings)

  def _microbatch_loss(self, params, batch: LearnerBatch):
    """(loss, token sums) of one microbatch: ``loss`` is its exact share of the
    minibatch objective (``loss_weight`` carries the aggregation, ``packing``)."""
    cfg = self.config
    logp, entropy = self._forward_logprobs(params, batch)
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

  @functools.cached_property
  def _sums_shape(self):
    """The structure of the metric sums (traced once, on the smallest batch)."""
    return jax.eval_shape(self._microbatch_loss, self._abstract(self.params),
                          LearnerBatch.abstract(1, 2, 1))[1]

  def _zero_state(self):
    """(float32 zero gradients, zero sums): what a minibatch's accumulation starts from."""
    return (self._pin_like_params(jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32),
                                               self.params)),
            jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self._sums_shape))

  def _make_grad_step(self):
    grad_fn = jax.value_and_grad(self._microbatch_loss, has_aux=True)

    def learner_grad(params, grads, sums, batch: LearnerBatch):
      (_, micro), g = grad_fn(params, batch)
      g = self._pin_like_params(jax.tree.map(lambda x: x.astype(jnp.float32), g))
      merged = {k: (jnp.maximum(sums[k], v) if k in _MAX_SUMS else sums[k] + v)
                for k, v in micro.items()}
      return jax.tree.map(jnp.add, grads, g), merged
    return learner_grad

  def _make_apply(self):
    tx = self.tx

    def learner_apply(params, opt_state, grads, loss):
      grad_norm = optax.tree.norm(grads)
      finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

      def apply(_):
        updates, new_opt = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt

      new_params, new_opt = jax.lax.cond(finite, apply, lambda _: (params, opt_state), None)
      return new_params, new_opt, {"grad_norm": grad_norm,
                                   "skipped": (~finite).astype(jnp.float32)}
    return learner_apply

  # --------------------------------------------------------- shapes, compile
  def _row_sharding(self, ndim: int):
    if self.mesh is None:
      return None
    return NamedSharding(self.mesh, P("data", *([None] * (ndim - 1))))

  def _batch_shardings(self):
    if self.mesh is None:
      return None
    return jax.tree.map(lambda _: self._row_sharding(2), LearnerBatch.abstract(1, 2, 1))

  def _build_programs(self) -> None:
    repl = None if self.mesh is None else NamedSharding(self.mesh, P())
    params_sh = self._param_shardings
    batch_sh = self._batch_shardings()

    def shardings(ins, outs):
      return {} if self.mesh is None else dict(in_shardings=ins, out_shardings=outs)
    self._zeros = jax.jit(self._zero_state, **shardings((), (params_sh, repl)))
    self._grad_step = jax.jit(self._make_grad_step(), donate_argnums=(1, 2),
                              **shardings((params_sh, params_sh, repl, batch_sh),
                                          (params_sh, repl)))
    self._apply = jax.jit(self._make_apply(), donate_argnums=(0, 1),
                          **shardings((params_sh, self._opt_shardings, params_sh, repl),
                                      (params_sh, self._opt_shardings, repl)))
    self._logprobs = jax.jit(self._make_logprobs())
    self._prepare = jax.jit(self._make_prepare())

  def _abstract_batch(self, rows: int, seq_len: int, targets: int) -> LearnerBatch:
    return LearnerBatch.abstract(rows, seq_len, targets, self._row_sharding)

  @staticmethod
  def _abstract(tree):
    return shd.abstract_like(tree)

  def _lower(self, key: tuple):
    """The lowered program of ``key``: ``("sync",)``, ``("prepare", rows)``, ``("zeros",)``,
    ``("apply",)``, ``("grad", rows, T, N)`` or ``("logp", "ref" | "policy", rows, T, N)``."""
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
    if kind == "zeros":
      return self._zeros.lower()
    sums = self._sums_shape
    if kind == "apply":
      return self._apply.lower(self._abstract(self.params), self._abstract(self.opt_state),
                               self._abstract(self.params), sums["loss"])
    if kind == "grad":
      return self._grad_step.lower(self._abstract(self.params), self._abstract(self.params),
                                   sums, self._abstract_batch(*shape))
    source, *shape = shape
    params = self.reference if source == "ref" else self.params
    return self._logprobs.lower(self._abstract(params), self._abstract_batch(*shape))

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """Every (rows, T, N) a microbatch can have: with packing, each pack length with
    each rung of the row ladder; without, each (row bucket, prompt bucket, response
    bucket)'s microbatch."""
    if self.config.packing:
      return [(rows, length, length - 1) for length in self.pack_lengths
              for rows in self.row_ladder]
    return [(self.minibatch_rows(rows) // self.config.grad_accum, p + n, n)
            for rows in self.row_buckets for p in self.prompt_buckets
            for n in self.response_buckets]

  def compile_train(self, rows: int, seq_len: int, targets: int):
    """The gradient step of one (rows, T, N) microbatch (cached)."""
    return self.programs.get(("grad", rows, seq_len, targets))

  def compile_reference(self, rows: int, seq_len: int, targets: int):
    """The reference log-prob pass of one microbatch (None without a KL term), cached."""
    if self.reference is None:
      return None
    return self.programs.get(("logp", "ref", rows, seq_len, targets))

  def compile_apply(self):
    """The optimizer update (gradient norm, finite check, AdamW), cached."""
    return self.programs.get(("apply",))

  def compile_prepare(self, rows: int):
    return self.programs.get(("prepare", rows))

  def compile_sync(self):
    """The master -> model weight cast (None when the model shares the master)."""
    return self._sync_executable()

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
    keys += [("prepare", rows) for rows in self.row_buckets] + [("zeros",), ("apply",)]
    for shape in self.batch_shapes():
      keys.append(("grad", *shape))
      if self.reference is not None:
        keys.append(("logp", "ref", *shape))
      if self.config.recompute_old_logprobs:
        keys.append(("logp", "policy", *shape))
    return [WarmupJob(self.programs, keys)]

  @property
  def num_executables(self) -> int:
    return len(self.programs)

  def response_bucket(self, longest: int) -> int:
    """The smallest response bucket holding a response of ``longest`` tokens."""
    return _smallest_holding(longest, self.response_buckets,
                             f"longest response {longest}", "response bucket")

  def pack_length(self, longest_sequence: int) -> int:
    """The smallest pack length holding a sequence of ``longest_sequence`` tokens."""
    return _smallest_holding(longest_sequence, self.pack_lengths,
                             f"a sequence of {longest_sequence} tokens", "pack length")

  # ---------------------------------------------------------------- update
  def prepare(self, batch: RolloutBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(advantages, keep mask, shaped rewards) per row, computed in the jitted prepare."""
    rows = batch.num_rows
    if rows not in self.row_buckets:
      raise ValueError(f"batch has {rows} rows; learner row buckets are {self.row_buckets}")
    adv, keep, shaped = self.programs.get(("prepare", rows))(
        batch.scores.astype(np.float32), batch.lengths.astype(np.int32),
        batch.group_ids.astype(np.int32), batch.row_valid)
    return np.asarray(adv), np.asarray(keep), np.asarray(shaped)

  def _device(self, batch: LearnerBatch) -> LearnerBatch:
    if self.mesh is None:
      return batch
    return jax.tree.map(lambda a: put_global(a, self._row_sharding(a.ndim)), batch)

  def _layout(self, seqs: StepSequences, n_resp: int):
    """rows of a minibatch -> its microbatches, in the configured layout."""
    cfg = self.config
    scale = (cfg.agg_scale if cfg.agg_scale is not None
             else float(cfg.max_response_len or self.response_buckets[-1]))
    if not cfg.packing:
      return lambda rows: pad_minibatch(seqs, rows, n_resp, cfg.grad_accum, cfg.agg, scale)
    lengths = seqs.sequence_lengths()

    def packed(rows):
      trained = seqs.trained(rows)
      longest = int(lengths[trained].max()) if trained.size else 1
      return pack_minibatch(seqs, rows, self.pack_length(longest), self.row_ladder, cfg.agg,
                            scale)
    return packed

  def _logprob_passes(self, seqs: StepSequences, minibatches: list) -> None:
    """Reference log-probs (KL) and, with ``recompute_old_logprobs``, the current
    policy's log-probs of every trained token, one forward pass per microbatch, before
    the first update; written into ``seqs`` in response positions."""
    recompute = self.config.recompute_old_logprobs
    if self.reference is None and not recompute:
      return
    policy = np.zeros_like(seqs.old_logp)
    pending = []                 # every pass is dispatched before any result is fetched
    for m in (m for micro in minibatches for m in micro):
      batch = self._device(m.batch)
      if self.reference is not None:
        ref = self.programs.get(("logp", "ref", *m.batch.shape))
        pending.append((m, seqs.ref_logp, ref(self.reference, batch)))
      if recompute:
        current = self.programs.get(("logp", "policy", *m.batch.shape))
        pending.append((m, policy, current(self.params, batch)))
    for (m, out, _), values in zip(pending, to_host([p[2] for p in pending])):
      m.scatter(values, out)
    if recompute:
      seqs.old_logp = policy

  def _step_sequences(self, batch: RolloutBatch):
    """(prepare's outputs, the step's sequences, response bucket, layout function)."""
    adv, keep, shaped = self.prepare(batch)
    longest = int(batch.lengths.max()) if batch.row_valid.any() else 1
    n_resp = self.response_bucket(max(longest, 1))
    seqs = StepSequences.of(batch, adv, keep)
    return (adv, keep, shaped), seqs, n_resp, self._layout(seqs, n_resp)

  def _accumulate(self, micro: list) -> tuple[Any, dict, int]:
    """(float32 gradient, sums, token slots computed) of one minibatch's microbatches."""
    grads, sums = self.programs.get(("zeros",))()
    computed = 0
    for m in micro:
      grads, sums = self.programs.get(("grad", *m.batch.shape))(
          self.params, grads, sums, self._device(m.batch))
      computed += int(np.prod(m.batch.tokens.shape))
    return grads, sums, computed

  def gradients(self, batch: RolloutBatch, rows: np.ndarray | None = None
                ) -> tuple[Any, dict[str, float]]:
    """(float32 gradient, metrics) of the minibatch ``rows`` (default: every row) of
    ``batch`` at the current weights, without updating anything: what one update of
    that minibatch would apply before clipping (for checks and debugging)."""
    _, seqs, _, layout = self._step_sequences(batch)
    rows = np.arange(batch.num_rows) if rows is None else np.asarray(rows)
    self._logprob_passes(seqs, [layout(rows)])
    grads, sums, _ = self._accumulate(layout(rows))
    grads, sums = to_host((grads, sums))
    norm = float(np.sqrt(sum(np.sum(np.square(g)) for g in jax.tree.leaves(grads))))
    metrics = _update_metrics([(sums, {"grad_norm": norm})])
    return grads, {k: v[0] for k, v in metrics.items()}

  def update(self, batch: RolloutBatch, seed: int = 0) -> dict[str, float]:
    """Trains on one rollout batch; returns metrics averaged over its updates."""
    start = time.perf_counter()
    cfg = self.config
    (adv, keep, shaped), seqs, n_resp, layout = self._step_sequences(batch)
    sampler_logp = seqs.old_logp
    mb_rows = self.minibatch_rows(batch.num_rows)
    rng = np.random.default_rng([seed, self.step])
    orders = [rng.permutation(batch.num_rows) for _ in range(cfg.epochs)]
    minibatches = [[order[lo:lo + mb_rows] for lo in range(0, batch.num_rows, mb_rows)]
                   for order in orders]
    self._logprob_passes(seqs, [layout(rows) for rows in minibatches[0]])

    history, mismatch = [], None
    empty_minibatches = 0
    computed = sequence_tokens = 0
    lengths = seqs.sequence_lengths()
    for rows in (rows for epoch in minibatches for rows in epoch):
      trained = seqs.trained(rows)
      if not trained.size:
        # Only padding / filtered rows: no gradient, and an AdamW step would still
        # move the weights (momentum, decay), so there is no update at all.
        empty_minibatches += 1
        continue
      grads, sums, slots = self._accumulate(layout(rows))
      computed += slots
      sequence_tokens += int(lengths[trained].sum())
      if mismatch is None:
        mismatch = sums        # the first update's forward: the policy that sampled
      self.params, self.opt_state, info = self.programs.get(("apply",))(
          self.params, self.opt_state, grads, sums["loss"])
      history.append((sums, info))
      self.step += 1
    history = to_host(history)
    real_tokens = float(seqs.loss_mask.sum())
    out = {"empty_minibatches": float(empty_minibatches), "kept_rows": float(keep.sum()),
           "real_rows": float(batch.row_valid.sum()), "response_tokens": real_tokens,
           "response_bucket": float(n_resp), "padded_tokens": float(computed),
           "sequence_tokens": float(sequence_tokens),
           "padding_efficiency": sequence_tokens / computed if computed else 0.0}
    out.update(self._mismatch(seqs, sampler_logp, mismatch))
    skipped = int(sum(info["skipped"] for _, info in history))
    self.skipped_updates += skipped
    self.sync_model()
    out.update(updates=float(len(history)), skipped_updates=float(skipped),
               total_skipped_updates=float(self.skipped_updates))
    if history:
      out.update({k: float(np.mean(v)) for k, v in _update_metrics(history).items()})
      out.update(adv_abs_mean=float(np.abs(adv[keep]).mean()) if keep.any() else 0.0,
                 shaped_reward_mean=float(shaped[batch.row_valid].mean())
                 if batch.row_valid.any() else 0.0)
    out.update(learner_seconds=time.perf_counter() - start, lr=float(self._learning_rate()))
    return out

  def _mismatch(self, seqs: StepSequences, sampler_logp: np.ndarray,
                first_update) -> dict[str, float]:
    """|sampler log-prob - learner log-prob| over the step's trained tokens: from the
    recomputation pass when there is one (every token), else from the first update's
    forward pass (the tokens of the first minibatch, the only one the policy has not
    yet moved for)."""
    if self.config.recompute_old_logprobs:
      diff = np.abs(sampler_logp - seqs.old_logp)[seqs.loss_mask]
      return {"logprob_mismatch_mean": float(diff.mean()) if diff.size else 0.0,
              "logprob_mismatch_max": float(diff.max()) if diff.size else 0.0}
    if first_update is None:
      return {"logprob_mismatch_mean": 0.0, "logprob_mismatch_max": 0.0}
    sums = to_host(first_update)
    return {"logprob_mismatch_mean": float(sums["mismatch_sum"] / max(sums["tokens"], 1.0)),
            "logprob_mismatch_max": float(sums["mismatch_max"])}

  def _learning_rate(self) -> float:
    """Current learning rate (for logging): the schedule at the number of applied
    updates (skipped non-finite updates leave optax's count unchanged)."""
    applied = self.step - self.skipped_updates
    return float(self._schedule(applied))
