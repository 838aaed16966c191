"""GRPO / DAPO learner: weights, buckets, ahead-of-time compilation, the update loop.

The jitted steps themselves are pure functions in ``rl/step_fns.py``; ``Learner`` owns
the state they are applied to (float32 master weights, optimizer state, the frozen
reference), jits each with its shardings and donated buffers, compiles every bucket
ahead of time and runs them. One ``Learner.update(batch)`` consumes a step's rollouts:

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

References: GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300), DAPO (Yu et al.
2025, arXiv:2503.14476), Dr. GRPO (Liu et al. 2025, arXiv:2503.20783); see ``losses``
for the per-function citations.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sagc_jax.runtime.distributed import put_global, to_host
from sagc_jax.models import sharding as shd
from sagc_jax.models.transformer import Transformer
from sagc_jax.runtime.compilation import ProgramCache, WarmupJob, warm
from sagc_jax.runtime.shapes import row_ladder, smallest_bucket
from sagc_jax.rl import step_fns, weights
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.optimizer import learning_rate_schedule, optimizer
from sagc_jax.rl.packing import LearnerBatch, StepSequences, pack_minibatch, pad_minibatch
from sagc_jax.rl.rollout import RolloutBatch

__all__ = ["Learner"]


class Learner:
  """Owns the weights, the optimizer state and the compiled steps (``step_fns``, jitted
  with this learner's shardings, one program per bucket) for one policy.

  Weights. The model may hold bfloat16 weights (what the sampler reads); the
  learner keeps **float32 master weights** and float32 Adam moments, computes the
  forward/backward in the model's dtype (the master weights are cast inside the
  step, so gradients arrive in float32 and accumulate in float32), and writes the
  updated weights back to the model cast to its dtype and sharding. At lr = 1e-6 a
  bfloat16 weight (8 mantissa bits) would absorb most updates unchanged; a float32
  master copy keeps every one. With a float32 model and no FSDP the model shares the
  master's buffers (``shares_master``: nothing is cast or copied); with FSDP the
  master is a resharded copy and every sync reshards it.

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
    graphdef, model_params, rest = nnx.split(model, nnx.Param, ...)
    self.compute_dtype = jax.tree.leaves(model_params)[0].dtype
    self.tx = optimizer(config)
    self._schedule = learning_rate_schedule(config)

    self._model_shardings = (None if mesh is None else
                             jax.tree.map(lambda x: x.sharding, model_params))
    self._param_shardings = weights.master_shardings(model_params, mesh, config.fsdp)
    master = weights.to_dtype(model_params, jnp.float32, self._param_shardings)
    self.params = master
    # True when the model's buffers are the master's (float32 model, no FSDP).
    self.shares_master = master is model_params
    self.policy = step_fns.PolicySpec(graphdef, rest, self.compute_dtype, self.options,
                                      shd.abstract_like(master), self._param_shardings)
    self.opt_state, self._opt_shardings = weights.optimizer_state(
        self.tx, master, self._param_shardings, mesh)
    self.reference = (weights.to_dtype(master, self.compute_dtype, self._param_shardings,
                                       copy=True) if config.kl_coef > 0 else None)
    self.step = 0
    self.skipped_updates = 0
    # Packed microbatches: rows of a pack length holding a prompt bucket plus a response
    # bucket; row counts from doubling the 'data' axis up to the padded layout's
    # microbatch (so a packed microbatch never holds more tokens than a padded one).
    self.pack_lengths = tuple(sorted({self.prompt_buckets[-1] + n
                                      for n in self.response_buckets}))
    self.row_ladder = row_ladder(
        self.row_buckets[-1] // config.mini_batches // config.grad_accum, data)
    self._build_programs()
    self.programs = ProgramCache(self._lower)

  # ------------------------------------------------------------- weights
  def sync_model(self) -> None:
    """Writes the current master weights into the model (its dtype and layout)."""
    cast = self.compile_sync()
    nnx.update(self.model, self.params if cast is None else cast(self.params))

  # --------------------------------------------------------- shapes, compile
  def _row_sharding(self, ndim: int):
    if self.mesh is None:
      return None
    return NamedSharding(self.mesh, P("data", *([None] * (ndim - 1))))

  def _build_programs(self) -> None:
    """The steps of ``step_fns`` jitted with this learner's shardings and donations;
    their trailing arguments (config, policy) are static."""
    repl = None if self.mesh is None else NamedSharding(self.mesh, P())
    params_sh, opt_sh = self._param_shardings, self._opt_shardings
    batch_sh = jax.tree.map(lambda _: self._row_sharding(2), LearnerBatch.abstract(1, 2, 1))

    def jit(fn, static, ins=None, outs=None, donate=()):
      shardings = {} if self.mesh is None or outs is None else dict(in_shardings=ins,
                                                                    out_shardings=outs)
      return jax.jit(fn, static_argnums=static, donate_argnums=donate, **shardings)
    self._zeros = jit(step_fns.learner_zeros, (0, 1), (), (params_sh, repl))
    self._grad_step = jit(step_fns.learner_grad, (4, 5),
                          (params_sh, params_sh, repl, batch_sh),
                          (params_sh, repl), donate=(1, 2))
    self._apply = jit(step_fns.learner_apply, (4,), (params_sh, opt_sh, params_sh, repl),
                      (params_sh, opt_sh, repl), donate=(0, 1))
    self._logprobs = jit(step_fns.learner_logprobs, (2, 3))
    self._prepare = jit(step_fns.learner_prepare, (4,))

  @functools.cached_property
  def _sums_shape(self):
    """The structure of the metric sums (traced once, on the smallest batch)."""
    return step_fns.metric_sums_shape(self.config, self.policy)

  def _abstract_batch(self, rows: int, seq_len: int, targets: int) -> LearnerBatch:
    return LearnerBatch.abstract(rows, seq_len, targets, self._row_sharding)

  def _lower(self, key: tuple):
    """The lowered program of ``key``: ``("sync",)``, ``("prepare", rows)``, ``("zeros",)``,
    ``("apply",)``, ``("grad", rows, T, N)`` or ``("logp", "ref" | "policy", rows, T, N)``."""
    kind, *shape = key
    cfg, policy, params = self.config, self.policy, shd.abstract_like(self.params)
    if kind == "sync":
      return weights.cast_program(self._model_shardings).lower(params, self.compute_dtype)
    if kind == "prepare":
      vectors = [jax.ShapeDtypeStruct(tuple(shape), dtype)
                 for dtype in (jnp.float32, jnp.int32, jnp.int32, jnp.bool_)]
      return self._prepare.lower(*vectors, cfg)
    if kind == "zeros":
      return self._zeros.lower(cfg, policy)
    sums = self._sums_shape
    if kind == "apply":
      return self._apply.lower(params, shd.abstract_like(self.opt_state), params, sums["loss"],
                               cfg)
    if kind == "grad":
      return self._grad_step.lower(params, params, sums, self._abstract_batch(*shape), cfg,
                                   policy)
    source, *shape = shape
    if source == "ref":
      params = shd.abstract_like(self.reference)
    return self._logprobs.lower(params, self._abstract_batch(*shape), cfg, policy)

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """Every (rows, T, N) a microbatch can have: with packing, each pack length with
    each rung of the row ladder; without, each (row bucket, prompt bucket, response
    bucket)'s microbatch."""
    if self.config.packing:
      return [(rows, length, length - 1) for length in self.pack_lengths
              for rows in self.row_ladder]
    return [(rows // self.config.mini_batches // self.config.grad_accum, p + n, n)
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
    return None if self.shares_master else self.programs.get(("sync",))

  def warmup(self) -> int:
    """Compiles every shape a batch from the buckets can take; returns how many."""
    return warm(self.warmup_jobs())

  def warmup_jobs(self) -> list[WarmupJob]:
    """The programs ``warmup`` compiles, for ``runtime.compilation.warm``."""
    # The logged learning rate evaluates the optax schedule eagerly: its scalar ops
    # compile on first use, so that happens here and not in the first step.
    self._learning_rate()
    keys = [] if self.shares_master else [("sync",)]
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
      pack_len = smallest_bucket(longest, self.pack_lengths, "longest sequence",
                                 "pack length")
      return pack_minibatch(seqs, rows, pack_len, self.row_ladder, cfg.agg, scale)
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
    n_resp = smallest_bucket(max(longest, 1), self.response_buckets, "longest response",
                             "response bucket")
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
    metrics = step_fns.update_metrics([(sums, {"grad_norm": norm})])
    return grads, {k: v[0] for k, v in metrics.items()}

  def update(self, batch: RolloutBatch, seed: int = 0) -> dict[str, float]:
    """Trains on one rollout batch; returns metrics averaged over its updates."""
    start = time.perf_counter()
    cfg = self.config
    (adv, keep, shaped), seqs, n_resp, layout = self._step_sequences(batch)
    sampler_logp = seqs.old_logp
    mb_rows = batch.num_rows // cfg.mini_batches
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
      out.update({k: float(np.mean(v)) for k, v in step_fns.update_metrics(history).items()})
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
