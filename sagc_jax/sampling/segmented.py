"""Segmented decoding: a sampler whose cost follows the work, not the caps.

The fused sampler (``Sampler`` with ``decode_segment=0``) prefills every row, then
runs one ``while_loop`` in which every decode step reads the whole static cache
(``prompt + max_new_tokens`` slots) for every row of the batch until the longest
row stops. Three things in that are waste, and this module removes them while
sampling the same tokens (both samplers trace ``decode.py``: same per-row keys,
same arithmetic up to float rounding):

1. **Prefill once per prompt.** The G rows of a group share their prompt: the
   distinct prompts are prefilled (``Pb`` rows) and each row's cache is gathered
   from its prompt's (``start`` executable). Prefill FLOPs drop by G.
2. **Span buckets.** Decoding runs in segments of ``L`` tokens. Segment j produces
   tokens ``[L(j-1), Lj)``, whose keys lie in cache slots ``< prompt + Lj`` (its
   *span*), and the cache it carries is exactly that long: a decode step reads
   (and costs) the filled span, not ``prompt + max_new_tokens``. Each segment
   program first grows the cache it receives (the previous span) to its own span:
   one copy per segment, not per step (slicing a full-size cache every step costs
   a copy per step on XLA:CPU).
3. **Live-row compaction.** Between segments the host reads which rows are done
   (R booleans). When the running rows fit a smaller size of the row ladder
   (``row_ladder``: the call's rows divided by 4 down to ``min_rows``), a
   ``compact`` executable gathers them (cache, tokens, log-probs, lengths, keys'
   row ids, output slots) into it; rows are scattered back to their original order
   on the host by ``slot``. A lone straggler finishes at ``min_rows`` rows, not at
   the full batch.

The per-group max / median host callback stays one in-jit ``io_callback`` per
call (``stats`` executable on the lengths in original row order). Every
executable is compiled by ``warmup`` (``executable_keys``): per (call rows, prompt
bucket) one ``start`` per prompt-row count of the group sizes served, a
``segment`` per (ladder rows, span), a ``compact`` per (larger, smaller ladder
rows, span before the last), and one ``stats``; the model runs only in ``start``
and ``segment``. The main job (``configs/tiny_cpu.py``: 3 row buckets, ladders of
2-3 sizes, 2 spans) has 20 of them, 13 with the model.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.runtime.distributed import to_host
from sagc_jax.models.sharding import abstract_like
from sagc_jax.runtime.compilation import WarmupJob
from sagc_jax.runtime.shapes import row_ladder
from sagc_jax.sampling import decode
from sagc_jax.sampling.listener import RolloutListener, wait_for
from sagc_jax.sampling.programs import DecoderPrograms


def _take_rows(cache, index: jax.Array):
  """The cache rows ``index`` (every per-row leaf; the write index is shared)."""
  take = lambda x: jnp.take(x, index, axis=0)
  return cache._replace(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)),
                        valid=take(cache.valid), next_pos=take(cache.next_pos))


def auto_segment(max_new_tokens: int) -> int:
  """Default segment length: 4 span buckets of at least 32 tokens each.

  Each segment boundary costs a host sync, the cache growth copy and, per ladder
  row count, two more compiled programs (segment and compaction). Below ~32 tokens
  those costs outweigh the reads they save: shorter segments did not shorten the
  main job's rollouts but compiled more programs (docs/results.md, "Decoding choices
  on XLA:CPU").
  """
  return max(32, -(-max_new_tokens // 4))


class SegmentedDecoder(DecoderPrograms):
  """The executables and host loop of segmented decoding for one model architecture.

  Args: those of ``programs.DecoderPrograms``, and
    segment: tokens per decode segment (> 0).
    compaction: gather the running rows into fewer between segments.
    min_rows: the smallest row count compaction goes down to (rounded up to 'data').
  """

  def __init__(self, *args, segment: int, compaction: bool, min_rows: int, **kwargs):
    super().__init__(*args, **kwargs)
    self.segment, self.compaction = segment, compaction
    self.data = 1 if self.mesh is None else self.mesh.shape.get("data", 1)
    self.min_rows = -(-min_rows // self.data) * self.data

  # ----------------------------------------------------------------- shapes
  def spans(self, prompt_len: int) -> tuple[int, ...]:
    """Cache slots of each segment: the prompt plus the tokens decoded by its end."""
    n_new = self.params.max_new_tokens
    count = -(-n_new // self.segment)
    return tuple(prompt_len + min(self.segment * j, n_new) for j in range(1, count + 1))

  def row_ladder(self, rows: int) -> tuple[int, ...]:
    """Row counts compaction may move to, largest (``rows``) first: ``rows`` divided
    by 4 while whole over 'data' and at least ``min_rows`` (a factor 4 keeps the
    executable count small; ``runtime.shapes.row_ladder``, the learner's ladder too)."""
    base = rows
    while (self.compaction and base % 4 == 0 and (base // 4) % self.data == 0
           and base // 4 >= self.min_rows):
      base //= 4
    return row_ladder(rows, base, factor=4)[::-1]

  def prompt_rows(self, rows: int, group_size: int) -> int:
    """Rows of the shared prefill: the call's prompts, whole over 'data'."""
    prompts = -(-rows // group_size)
    return min(-(-prompts // self.data) * self.data, rows)

  def executable_keys(self, rows: int, prompt_len: int, group_sizes: Sequence[int]
                      ) -> set[tuple]:
    """Every executable a call on ``rows`` rows may use (``warmup`` compiles them).

    A shared prefill per distinct prompt-row count of ``group_sizes``, a segment per
    (ladder rows, span), a compaction per (larger, smaller ladder rows, span after
    which it may run), and the stats program. Buckets share the entries of their
    common ladder sizes.
    """
    ladder, spans = self.row_ladder(rows), self.spans(prompt_len)
    keys = {("start", self.prompt_rows(rows, g), rows, prompt_len) for g in group_sizes}
    keys |= {("segment", r, prompt_len, span) for r in ladder for span in spans}
    keys |= {("compact", a, b, prompt_len, span) for i, a in enumerate(ladder)
             for b in ladder[i + 1:] for span in spans[:-1]}
    keys.add(("stats", rows))
    return keys

  def peak_keys(self, rows: int, prompt_len: int, group_sizes: Sequence[int]) -> list[tuple]:
    """The executables holding the most memory (for the AOT fit check): the shared
    prefill with the most prompt rows, the full-row segment at the last span (it
    holds the previous span's cache while growing it), and the first compaction out
    of the full rows at the longest span it runs at."""
    spans, ladder = self.spans(prompt_len), self.row_ladder(rows)
    keys = [("start", max(self.prompt_rows(rows, g) for g in group_sizes), rows, prompt_len),
            ("segment", rows, prompt_len, spans[-1])]
    if len(spans) > 1 and len(ladder) > 1:
      keys.append(("compact", rows, ladder[1], prompt_len, spans[-2]))
    return keys

  def compile(self, key: tuple, state):
    """The compiled executable of ``key`` (cached)."""
    return self.programs.get(key, state)

  # ------------------------------------------------------------ shardings
  def _abstract_carry(self, rows: int, length: int) -> dict[str, Any]:
    """The decode state of ``rows`` rows with a ``length``-slot cache."""
    n_new = self.params.max_new_tokens
    row1, row2 = ("data",), ("data", None)
    carry = dict(
        t=self._spec((), jnp.int32, ()), last=self._spec((rows,), jnp.int32, row1),
        tokens=self._spec((rows, n_new), jnp.int32, row2),
        logprobs=self._spec((rows, n_new), jnp.float32, row2),
        lengths=self._spec((rows,), jnp.int32, row1), done=self._spec((rows,), jnp.bool_, row1),
        row_ids=self._spec((rows,), jnp.int32, row1), slot=self._spec((rows,), jnp.int32, row1))
    carry["cache"] = decode.abstract_cache(self.cfg, rows, length, self.cache_dtype, self.mesh)
    return carry

  # ----------------------------------------------------------- executables
  def _lower_start(self, state, prompt_rows: int, rows: int, prompt_len: int):
    graphdef, params, cfg = self.graphdef, self.params, self.cfg
    max_len = self.spans(prompt_len)[0]
    options = self.options_for(prompt_rows)

    def sampler_start(state, prompt_tokens, prompt_mask, row_prompt, row_valid, row_ids,
                      seed):
      model = nnx.merge(graphdef, state)
      cache = decode.new_cache(cfg, prompt_rows, max_len, self.cache_dtype, self.mesh)
      logits, cache = decode.prefill(model, prompt_tokens, prompt_mask, cache, options)
      # Each row takes its prompt's cache and next-token logits.
      cache = decode.pin_cache(cfg, _take_rows(cache, row_prompt), self.mesh)
      first_logits = jnp.take(logits, row_prompt, axis=0)
      return decode.emit(decode.initial_carry(cache, row_valid, row_ids, params), first_logits,
                         seed, params)

    inputs = (abstract_like(state), *self._start_inputs(prompt_rows, rows, prompt_len),
              self._spec((), jnp.uint32, ()))
    return decode.lower(sampler_start, inputs, self._abstract_carry(rows, max_len))

  def _start_inputs(self, prompt_rows: int, rows: int, prompt_len: int) -> tuple:
    """Specs of the start program's host inputs: prompt tokens and mask (one row per
    prompt), each row's prompt index, row validity and row ids."""
    return (self._spec((prompt_rows, prompt_len), jnp.int32, ("data", None)),
            self._spec((prompt_rows, prompt_len), jnp.bool_, ("data", None)),
            self._spec((rows,), jnp.int32, ("data",)),
            self._spec((rows,), jnp.bool_, ("data",)),
            self._spec((rows,), jnp.int32, ("data",)))

  def _lower_segment(self, state, rows: int, prompt_len: int, span: int):
    """Grows the received cache to ``span`` slots, then decodes to token
    ``span - prompt_len``. The cache is passed apart from the other carry leaves so
    that it is donated exactly when its size stays (the first segment)."""
    graphdef, params = self.graphdef, self.params
    options = self.options_for(rows)
    # The cache received is the previous segment's span (the start program's for the first).
    spans = self.spans(prompt_len)
    extra = span - spans[max(spans.index(span) - 1, 0)]
    grow_kv = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))   # [B, KV, S, D]

    def sampler_segment(state, rest, cache, seed):
      if extra:
        cache = cache._replace(k=tuple(map(grow_kv, cache.k)), v=tuple(map(grow_kv, cache.v)),
                               valid=jnp.pad(cache.valid, ((0, 0), (0, extra))))
      model = nnx.merge(graphdef, state)
      return decode.decode_until(model, dict(rest, cache=cache), seed, params, options,
                                 t_end=span - prompt_len)

    rest = self._abstract_carry(rows, span - extra)
    cache = rest.pop("cache")
    return decode.lower(
        sampler_segment,
        (abstract_like(state), rest, cache, self._spec((), jnp.uint32, ())),
        self._abstract_carry(rows, span), donate=(1,) if extra else (1, 2))

  def _lower_compact(self, state, rows_from: int, rows_to: int, prompt_len: int, span: int):
    """Gathers the running rows (``index``) into ``rows_to`` rows; ``keep`` False
    marks padding rows, done from then on."""
    def sampler_compact(carry, index, keep):
      take = lambda x: jnp.take(x, index, axis=0)
      out = dict(carry, **{k: take(carry[k]) for k in decode.ROW_LEAVES})
      out["done"] = out["done"] | ~keep
      out["slot"] = jnp.where(keep, out["slot"], -1)
      out["cache"] = _take_rows(carry["cache"], index)
      return out

    return decode.lower(
        sampler_compact, (self._abstract_carry(rows_from, span),
                          self._spec((rows_to,), jnp.int32, ("data",)),
                          self._spec((rows_to,), jnp.bool_, ("data",))),
        self._abstract_carry(rows_to, span))

  def warmup_job(self, state, rows: int, prompt_len: int, group_sizes: Sequence[int]
                 ) -> WarmupJob:
    """The programs of ``executable_keys`` (for ``runtime.compilation.warm``)."""
    return WarmupJob(self.programs,
                     sorted(self.executable_keys(rows, prompt_len, group_sizes)), (state,))

  # ------------------------------------------------------------- host loop
  def run(self, state, rows: int, prompt_len: int, tokens: np.ndarray, mask: np.ndarray,
          row_valid: np.ndarray, group_ids: np.ndarray, row_ids: np.ndarray, seed: int,
          group_size: int, listener: RolloutListener | None = None,
          group_starts: np.ndarray | None = None) -> tuple[dict[str, Any], float, int]:
    """One call on ``rows`` rows (inputs padded to it); ``(outputs, seconds, slots)``;
    ``listener`` is lent the host while each segment decodes.

    ``outputs`` has the fused executable's fields (tokens, logprobs, lengths,
    decode_steps, stats); ``slots`` is the decode work actually done, the sum over
    segments of rows x steps. ``group_starts``: each group's first row when groups
    differ in size (the prefill row of every row is then its group id).
    """
    params = self.params
    n_new = params.max_new_tokens
    prompt_rows = self.prompt_rows(rows, group_size)
    if group_starts is None:
      first = np.arange(0, rows, group_size)[:prompt_rows]
      row_prompt = np.minimum(np.arange(rows) // group_size, prompt_rows - 1)
    else:           # groups of different sizes: group_size only keys the prefill program
      first = np.asarray(group_starts)
      row_prompt = np.where(row_valid, group_ids, 0)
      if len(first) > prompt_rows:
        raise ValueError(f"{len(first)} groups exceed the prefill's {prompt_rows} prompt rows")
    p_tokens = np.full((prompt_rows, prompt_len), params.pad_id, np.int32)
    p_mask = np.zeros((prompt_rows, prompt_len), bool)
    p_tokens[:len(first)], p_mask[:len(first)] = tokens[first], mask[first]
    row_prompt = row_prompt.astype(np.int32)
    start_exe = self.programs.get(("start", prompt_rows, rows, prompt_len), state)
    args = self._place((p_tokens, p_mask, row_prompt, row_valid, row_ids.astype(np.int32)),
                       self._start_inputs(prompt_rows, rows, prompt_len))
    seed_arr = decode.place(np.uint32(seed), self._spec((), jnp.uint32, ()).sharding)

    outputs = dict(tokens=np.full((rows, n_new), params.pad_id, np.int32),
                   logprobs=np.zeros((rows, n_new), np.float32), lengths=np.zeros(rows, np.int32))

    def harvest(carry):
      got = to_host({k: carry[k] for k in (*outputs, "slot")})
      real = got["slot"] >= 0
      for k, buf in outputs.items():
        buf[got["slot"][real]] = got[k][real]

    start = time.perf_counter()
    carry = start_exe(state, *args, seed_arr)
    current, t, slots_used = rows, 1, rows          # token 0 came from the prefill
    spans = self.spans(prompt_len)
    ladder = self.row_ladder(rows)
    for span in spans:
      rest = dict(carry)
      cache = rest.pop("cache")
      carry = self.programs.get(("segment", current, prompt_len, span), state)(
          state, rest, cache, seed_arr)
      info = wait_for({"t": carry["t"], "done": carry["done"]}, listener)
      t_now = int(info["t"])
      slots_used += current * (t_now - t)
      t = t_now
      live = int((~info["done"]).sum())
      if live == 0 or t >= n_new:
        break
      target = min((r for r in ladder if r >= live), default=current)
      if target == current:
        continue
      harvest(carry)                         # finished rows leave the batch here
      index = np.flatnonzero(~info["done"])
      keep = np.arange(target) < len(index)
      index = np.concatenate([index, np.full(target - len(index), index[0])])
      rows_on_data = self._spec((target,), jnp.int32, ("data",)).sharding
      carry = self.programs.get(("compact", current, target, prompt_len, span))(
          carry, decode.place(index.astype(np.int32), rows_on_data),
          decode.place(keep, rows_on_data))
      current = target
    harvest(carry)
    out = self._result(rows, **outputs, steps=t, group_ids=group_ids, row_valid=row_valid)
    return out, time.perf_counter() - start, slots_used
