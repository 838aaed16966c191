"""Mesh-sharded group sampler with bucketed shapes and host length stats.

One call generates G responses for each of P prompts (rows of a group are
contiguous) through one of three decoders, each its own module: the fused one
(``fused.py``: one ``while_loop`` over a static cache for every row until the longest
stops), the segmented one (``segmented.py``: shared prefill, span-sized caches,
live-row compaction) or the refill one (``refill.py``: a paged cache whose slots take
queued rows). The per-group max and median response lengths reach a
``LengthStatsSink`` that feeds the controller through a small stats program's host
callback, never from a program that runs the model: JAX never writes a program with a
host callback to the persistent compilation cache, so a restarted run reads the model
programs from it and compiles only the stats ones.

Shapes and compilation. Row counts are padded to a small set of *row
buckets* (one per candidate G: ``P(G) * G`` rounded up to the data-axis size)
and prompt lengths to *prompt buckets*; padding rows are masked everywhere
(they are "done" from the start, never count in stats and get no tokens).
Group structure is data (``group_ids``), so G is never a static value and G's
sharing a row bucket share an executable. ``warmup()`` compiles every
(row bucket, prompt bucket) pair, and the stats program of every row bucket, ahead
of time with ``jit(...).lower().compile()``;
``generate`` then only looks executables up, so after warm-up the number of
XLA compilations is zero whatever sequence of G the controller produces.

Randomness and log-probabilities are those of ``decode.py`` (the token rule every
decoder shares): row r's token t depends on the seed and the row's global index only,
so one device and 8 devices sample identical tokens, and ``logprobs`` is the
log-probability under the unfiltered temperature-scaled distribution, the learner's
PPO "old" log-prob.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sagc_jax.models.kv_cache import KVCache, cache_row_axes, cache_sharding
from sagc_jax.models.tokenizer import pad_prompts
from sagc_jax.models.transformer import ForwardOptions, Transformer, decode_cache_read_for
from sagc_jax.runtime.compilation import WarmupJob, warm
from sagc_jax.runtime.shapes import smallest_bucket
from sagc_jax.sampling.batch import SampleBatch, rows_per_prompt
from sagc_jax.sampling.fused import FusedDecoder
from sagc_jax.sampling.params import SamplingParams
from sagc_jax.sampling.group_stats import LengthStatsSink
from sagc_jax.sampling.listener import RolloutListener
from sagc_jax.sampling.refill import RefillDecoder, auto_refill_segment
from sagc_jax.sampling.segmented import SegmentedDecoder, auto_segment

__all__ = ["SampleBatch", "Sampler", "SamplingParams", "row_buckets_for"]


def row_buckets_for(candidates: Sequence[int], prompts_for: Callable[[int], int],
                    multiple_of: int = 1) -> tuple[int, ...]:
  """One padded row count per candidate G: ``prompts_for(G) * G`` rounded up.

  ``prompts_for`` is the trainer's P(G), the prompts per sampling round at group
  size G (``sagc_jax.control.budget.prompts_for``). Rounding up to
  ``multiple_of`` (the data-axis size) lets the rows shard evenly. Several G with
  the same count share one bucket (docs/architecture.md, "Shapes and compilation").
  """
  buckets = set()
  for g in candidates:
    p = prompts_for(g)
    if p <= 0:
      raise ValueError(f"prompts_for({g})={p}: need at least one prompt per round")
    buckets.add(-(-p * g // multiple_of) * multiple_of)
  return tuple(sorted(buckets))


class Sampler:
  """Bucketed, AOT-compiled generation for one model architecture.

  Args:
    model: the policy (its graph is fixed here; its parameters are passed on
      every ``generate`` call, so learner updates are picked up without
      recompiling).
    params: ``SamplingParams``.
    row_buckets: allowed padded row counts (see ``row_buckets_for``).
    prompt_buckets: allowed padded prompt lengths.
    mesh: optional mesh; rows go on its ``'data'`` axis, parameters keep their
      own (nnx-annotated) shardings.
    sink: host sink for the per-group length stats (default: a new one,
      ``self.sink``).
    cache_dtype: KV cache dtype (default: the model's parameter dtype).
    options: ``ForwardOptions`` of the prefill and decode passes. Default: query-blocked
      prefill attention, decode attention that reads the cache in its own dtype
      (``einsum``, see ``models/attention.py``), and the cache read order whose
      one-slot write XLA keeps in place on the devices' platform
      (``decode_cache_read_for``; options passed here are used as given).
      The cache layout (rows on 'data', KV heads on 'model', or rows over both axes
      when the heads do not divide 'model') is set per row bucket
      (``cache_row_axes``) and pinned with sharding constraints.
    max_rows_per_call: split a bucket with more rows into sequential calls of this many
      rows (whole groups each; None = never). Bounds the KV cache per call when a
      step's rollouts do not fit the accelerator at once; each row keeps its global
      row id, so the tokens are those of an unsplit call.
    decode_segment: tokens per decode segment of the segmented sampler (``segmented.py``:
      prefill once per prompt, span-bucketed cache reads, live-row compaction);
      None = ``auto_segment(max_new_tokens)``, 0 = the fused sampler (one while loop
      over the whole cache for every row until the longest stops).
    compaction: gather the rows still running into a smaller row count between
      segments (segmented sampler only).
    min_compact_rows: the smallest row count compaction goes down to.
    group_sizes: the group sizes ``warmup`` compiles a shared prefill for (the
      controller's candidates; other sizes compile on first use).
    prompts_for: optional callable giving the prompts per ``generate`` call at each
      group size (the trainer's P(G), ``control.budget.prompts_for``). With it
      ``warmup`` compiles a group size's shared prefill only for the call rows of
      ``P(G) * G`` prompts (in ``hold_prompts`` mode one G per row bucket, not every
      G in every bucket); a call with another prompt count compiles its prefill on
      first use.
    refill_slots: decode with a paged KV cache on this many slots, refilled from a
      queue of every row of the call (``refill.py``); 0 = off. The call then never
      splits into sub-calls (``max_rows_per_call`` does not apply) and waits for one
      straggler, not one per sub-call.
    page_size: tokens per KV page (refill only).
    kv_pages: pages per layer pool, the scratch page included (refill only; None:
      every slot can hold a row of the longest length at once).
    refill_segment: decode steps between refills (refill only; None:
      ``refill.auto_refill_segment``).
    paged_kernel: the paged decode attention (``ForwardOptions.paged_kernel``: "xla"
      or "pallas"); None keeps ``options``'.

  The model may be abstract (ShapeDtypeStruct leaves with shardings): the sampler can
  then only compile (``warmup``), which is what ``sagc_jax.aot`` does.
  """

  def __init__(self, model: Transformer, params: SamplingParams, row_buckets: Sequence[int],
               prompt_buckets: Sequence[int], *, mesh: Mesh | None = None,
               sink: LengthStatsSink | None = None, cache_dtype: Any = None,
               options: ForwardOptions | None = None, max_rows_per_call: int | None = None,
               decode_segment: int | None = None, compaction: bool = True,
               min_compact_rows: int = 8, group_sizes: Sequence[int] = (1,),
               prompts_for: Callable[[int], int] | None = None, refill_slots: int = 0,
               page_size: int = 16, kv_pages: int | None = None,
               refill_segment: int | None = None, paged_kernel: str | None = None):
    # The settings' types and ranges are checked where a run reads them
    # (``config.sections.RolloutConfig``); what is checked here is their fit to ``mesh``.
    self.params = params
    self.row_buckets = tuple(sorted(set(int(b) for b in row_buckets)))
    self.prompt_buckets = tuple(sorted(set(int(b) for b in prompt_buckets)))
    self.mesh = mesh
    self.max_rows_per_call = max_rows_per_call
    if mesh is not None:
      data = mesh.shape.get("data", 1)
      if max_rows_per_call is not None and max_rows_per_call % data:
        raise ValueError(f"max_rows_per_call={max_rows_per_call} does not divide evenly over "
                         f"the mesh 'data' axis of size {data}")
      bad = [b for b in self.row_buckets if b % data]
      if bad:
        raise ValueError(f"row buckets {bad} do not divide evenly over the mesh 'data' "
                         f"axis of size {data}")
    self.sink = sink if sink is not None else LengthStatsSink()
    self.cfg = model.cfg
    self._graphdef, state = nnx.split(model)
    self.cache_dtype = cache_dtype or jax.tree.leaves(state)[0].dtype
    if options is None:
      # einsum decode attention everywhere: bandwidth-optimal on TPU/GPU, and with the
      # segmented sampler's span-sized caches at least as fast as "reduce" on XLA:CPU
      # (docs/results.md, "Decoding choices on XLA:CPU"). The cache a decode
      # step reads is the one whose write this platform's XLA keeps in place.
      platform = (jax.default_backend() if mesh is None
                  else mesh.devices.flat[0].platform)
      options = ForwardOptions(attention="blocked", decode_attention="einsum",
                               decode_cache_read=decode_cache_read_for(platform))
    if paged_kernel is not None:
      options = dataclasses.replace(options, paged_kernel=paged_kernel)
    self.options = options
    self.group_sizes = tuple(sorted(set(int(g) for g in group_sizes)))
    self.prompts_for = prompts_for
    common = dict(cache_dtype=self.cache_dtype, mesh=mesh, options_for=self._options_for,
                  sink=self.sink)
    self.fused = FusedDecoder(self._graphdef, params, self.cfg, **common)
    self.refill = None
    if refill_slots:
      self.refill = RefillDecoder(
          self._graphdef, params, self.cfg, slots=refill_slots, page_size=page_size,
          num_pages=kv_pages, prompt_buckets=self.prompt_buckets,
          segment=refill_segment or auto_refill_segment(params.max_new_tokens), **common)
    if decode_segment is None:
      decode_segment = auto_segment(params.max_new_tokens)
    self.segmented = None
    if decode_segment:
      self.segmented = SegmentedDecoder(self._graphdef, params, self.cfg, segment=decode_segment,
                                        compaction=compaction, min_rows=min_compact_rows,
                                        **common)

  def _options_for(self, rows: int) -> ForwardOptions:
    """The forward options with the cache layout of a ``rows``-row bucket pinned."""
    if self.mesh is None:
      return self.options
    # The cache's own (fitted) spec: axes the mesh lacks or cannot split are dropped.
    spec = cache_sharding(self.cfg, rows, 1, self.mesh).k[0].spec
    kv = NamedSharding(self.mesh, spec)
    if "model" not in cache_row_axes(self.cfg, rows, self.mesh):
      return dataclasses.replace(self.options, kv_sharding=kv)
    heads = "model" if self.cfg.num_heads % self.mesh.shape["model"] == 0 else None
    head_spec = NamedSharding(self.mesh, P("data", None, heads, None))
    return dataclasses.replace(self.options, kv_sharding=kv, query_sharding=kv,
                               head_sharding=head_spec)

  # -------------------------------------------------------------- compile
  def compile(self, model: Transformer, rows: int, prompt_len: int):
    """The compiled fused generate executable of one (row bucket, prompt bucket)."""
    return self.fused.compile(nnx.state(model), rows, prompt_len)

  def compile_decode_step(self, model: Transformer, rows: int, prompt_len: int):
    """One decode step compiled on its own, for its cost (``FusedDecoder``)."""
    return self.fused.compile_decode_step(nnx.state(model), rows, prompt_len)

  def abstract_cache(self, rows: int, prompt_len: int) -> KVCache:
    """The fused program's KV cache of one call, abstract (``FusedDecoder``)."""
    return self.fused.abstract_cache(rows, prompt_len)

  def warmup(self, model: Transformer) -> int:
    """Compiles every executable a ``generate`` call can use; returns how many were new.

    Fused: a generate program per (call rows, prompt bucket) and a stats program per
    call rows. Segmented: per (call rows, prompt
    bucket) a shared prefill per group size, a segment per (ladder rows, span), a
    compaction per ladder pair and the stats program (``SegmentedDecoder``).
    """
    return warm(self.warmup_jobs(model))

  def warmup_jobs(self, model: Transformer) -> list[WarmupJob]:
    """The programs ``warmup`` compiles, for ``runtime.compilation.warm`` (one pool for a run's
    components)."""
    state = nnx.state(model)
    if self.refill is not None:
      return [self.refill.warmup_job(state, self.row_buckets)]
    jobs = []
    for rows in sorted({self.call_rows(r) for r in self.row_buckets}):
      group_sizes = self.group_sizes_for(rows)
      if not group_sizes:
        continue                                  # no call of ``prompts_for`` lands here
      for prompt_len in self.prompt_buckets:
        if self.segmented is None:
          jobs.append(self.fused.warmup_job(state, rows, prompt_len))
        else:
          jobs.append(self.segmented.warmup_job(state, rows, prompt_len, group_sizes))
    return jobs

  def group_sizes_for(self, call_rows: int) -> tuple[int, ...]:
    """The group sizes whose calls run on ``call_rows`` rows: every candidate, or with
    ``prompts_for`` those whose ``P(G) * G`` rows are served by calls of this size."""
    if self.prompts_for is None:
      return self.group_sizes
    return tuple(g for g in self.group_sizes if self.call_rows(
        self.row_bucket_for(self.prompts_for(g) * g)) == call_rows)

  # ------------------------------------------------------------- generate
  def generate(self, model: Transformer, prompts: Sequence[Sequence[int]], group_size: int,
               seed: int, listener: RolloutListener | None = None,
               group_sizes: Sequence[int] | None = None) -> SampleBatch:
    """Samples ``group_size`` responses for each prompt (token id lists).

    Rows ``[i*G, (i+1)*G)`` belong to prompt i (group id i). The per-group
    length stats reach ``self.sink`` through the in-jit host callback; ``generate``
    takes this call's deliveries from it and returns them as ``group_max`` /
    ``group_median``, so the sink is empty again when it returns.

    ``listener`` (``listener.RolloutListener``) receives rows as they finish (at
    refill boundaries, after each sub-call) and is lent the host while the device
    decodes the rest: the caller's scoring of finished rows overlaps the tail.

    ``group_sizes`` (a controller plan with a size per prompt): prompt i gets
    ``group_sizes[i]`` rows instead, consecutive in prompt order; ``group_size`` is
    then the step's base size, which picks the compiled programs (the fused or the
    segmented sampler in one call; group structure is data, so the programs are the
    uniform calls'). The refill sampler and sub-calls take one size per call.
    """
    if group_size <= 0:
      raise ValueError(f"group_size={group_size} must be positive")
    if not 0 <= int(seed) < 2**32:
      raise ValueError(f"seed={seed} must be in [0, 2**32)")
    if not prompts:
      raise ValueError("prompts is empty")
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ValueError(f"prompt {i} is empty: a prompt needs at least one token")
    num_prompts = len(prompts)
    sizes = rows_per_prompt(num_prompts, group_size, group_sizes)
    starts = np.cumsum(sizes) - sizes
    real_rows = int(sizes.sum())
    rows = self.row_bucket_for(real_rows)
    prompt_len = smallest_bucket(max(len(p) for p in prompts), self.prompt_buckets,
                                 "prompt length")
    # Each prompt once per row of its group, left-padded; padding rows are empty.
    tokens, mask = pad_prompts([p for p, n in zip(prompts, sizes) for _ in range(n)]
                               + [[]] * (rows - real_rows), self.params.pad_id, prompt_len)
    row_valid = np.arange(rows) < real_rows
    group_ids = np.zeros(rows, np.int32)
    group_ids[:real_rows] = np.repeat(np.arange(num_prompts), sizes)
    state = nnx.state(model)
    mixed = group_sizes is not None
    if mixed and (self.refill is not None or self.call_rows(rows) < rows):
      raise ValueError("group_sizes (one size per prompt) needs one fused or segmented "
                       "sampler call: rollout.refill_slots=0 and no sub-calls "
                       f"(rollout.max_rows_per_call=0 or >= {rows})")
    if mixed and self.segmented is not None:
      # The shared prefill's program is keyed by its prompt rows: take a warmed size
      # whose prefill holds every prompt of the call (the data says which row is whose).
      fits = [g for g in self.group_sizes_for(rows)
              if self.segmented.prompt_rows(rows, g) >= num_prompts]
      if not fits:
        raise ValueError(f"{num_prompts} prompts with group_sizes summing to {real_rows} "
                         f"have no warmed shared prefill on {rows} rows (group sizes "
                         f"{self.group_sizes_for(rows)})")
      group_size = max(fits)
    try:
      if self.refill is not None:       # every row of the call in one queue
        out, seconds, decode_slots = self.refill.run(
            state, rows, prompts, group_size, np.arange(rows, dtype=np.int32), group_ids,
            row_valid, seed, listener)
        decode_steps = int(out["decode_steps"])
      else:
        out, seconds, decode_steps, decode_slots = self._sub_calls(
            state, rows, real_rows, prompt_len, tokens, mask, row_valid, group_ids, seed,
            group_size, listener, starts if mixed else None)
    except BaseException:
      self.sink.pop()        # a failed call's deliveries must not reach the next call
      raise
    # This call's per-group stats as the in-jit host callback delivered them (one
    # delivery per sub-call): the controller's observations, handed back with the
    # call's result instead of left in a sink for the caller to drain.
    group_max, group_median = self.sink.pop()
    lengths = out["lengths"]
    return SampleBatch(
        prompt_tokens=tokens, prompt_mask=mask, response_tokens=out["tokens"],
        response_logprobs=out["logprobs"],
        response_mask=np.arange(self.params.max_new_tokens)[None, :] < lengths[:, None],
        lengths=lengths, row_valid=row_valid, group_ids=group_ids,
        group_max=group_max, group_median=group_median,
        group_size=group_size, num_prompts=num_prompts,
        decode_steps=decode_steps, decode_slots=decode_slots, seconds=seconds,
        group_sizes=sizes if mixed else None)

  def _sub_calls(self, state, rows: int, real_rows: int, prompt_len: int, tokens, mask,
                 row_valid, group_ids, seed: int, group_size: int,
                 listener: RolloutListener | None, group_starts: np.ndarray | None
                 ) -> tuple[dict[str, np.ndarray], float, int, int]:
    """The call's rows through the fused or segmented decoder, in sub-calls of whole
    groups when a bucket exceeds ``max_rows_per_call``: (outputs joined over the
    ``rows``-row bucket, seconds, decode steps, decode slots); ``listener`` works while
    each runs. ``group_starts``: each group's first row, for groups of different sizes."""
    call_rows = self.call_rows(rows)
    if call_rows < group_size:
      raise ValueError(f"max_rows_per_call={self.max_rows_per_call} is smaller than "
                       f"group_size={group_size}: a group must fit in one sampler call")
    # Sub-calls of whole groups; every row keeps its global row id (its random stream),
    # so a split rollout samples the tokens of an unsplit one (up to float rounding).
    per_call = rows if call_rows == rows else (call_rows // group_size) * group_size

    def pad(x, value=0, size=call_rows):    # rows padded to the executable's (or the bucket)
      out = np.full((size,) + x.shape[1:], value, x.dtype)
      out[:len(x)] = x
      return out
    pieces, seconds, decode_steps, decode_slots = [], 0.0, 0, 0
    for lo in range(0, max(real_rows, 1), per_call):
      hi = min(lo + per_call, rows)
      padded = (pad(tokens[lo:hi], self.params.pad_id), pad(mask[lo:hi]),
                pad(row_valid[lo:hi]), pad(group_ids[lo:hi] - group_ids[lo]),
                pad(np.arange(lo, hi, dtype=np.int32)))
      if self.segmented is None:
        out, took, slots = self.fused.run(state, call_rows, prompt_len, *padded, seed, listener)
      else:
        out, took, slots = self.segmented.run(state, call_rows, prompt_len, *padded, seed,
                                              group_size, listener, group_starts=group_starts)
      pieces.append((hi - lo, out))
      if listener is not None:        # these rows are final: the next sub-call hides them
        real = min(hi, real_rows) - lo
        listener.rows_done(np.arange(lo, lo + real), np.asarray(out["tokens"])[:real],
                           np.asarray(out["lengths"])[:real])
      seconds += took
      decode_steps = max(decode_steps, int(out["decode_steps"]))
      decode_slots += slots

    def joined(field, fill=0):
      return pad(np.concatenate([np.asarray(out[field])[:n] for n, out in pieces]), fill, rows)
    out = dict(lengths=joined("lengths"), tokens=joined("tokens", self.params.pad_id),
               logprobs=joined("logprobs"))
    return out, seconds, decode_steps, decode_slots

  def call_rows(self, rows: int) -> int:
    """Rows of the executable that serves a ``rows``-row bucket (``max_rows_per_call``)."""
    if self.max_rows_per_call is None or rows <= self.max_rows_per_call:
      return rows
    return self.max_rows_per_call

  def row_bucket_for(self, rows: int) -> int:
    """The padded row count a call with ``rows`` real rows uses."""
    return smallest_bucket(rows, self.row_buckets, "rows (prompts x group_size)")

  @property
  def num_executables(self) -> int:
    return sum(len(d.programs) for d in (self.fused, self.segmented, self.refill)
               if d is not None)
