"""Refill decoding: a fixed number of decode slots over a paged KV cache, refilled from
the step's queue of rows until it is empty (continuous batching, still synchronous).

Why. The dense samplers give a call's rows ``prompt + max_new_tokens`` cache slots
each, so at long responses a step's rollouts no longer fit one call and run as
sub-calls in sequence (``Sampler(max_rows_per_call=...)``), and **each sub-call waits
for its own straggler**: the waste SAGC exists to cut, made again by the sampler. Here
every row of the step is queued; ``slots`` rows decode at once; when a row stops, its
pages return to the pool and the next queued row takes its slot at the next segment
boundary. The step still ends when its last row ends (on-policy, no partial
rollouts), but it waits for one straggler, not one per sub-call, and the memory it
holds follows the live tokens (``models.paged_cache``).

Same tokens. Every row keeps its global row id and draws token t with the key of
``decode.draw``, so a row samples the fused sampler's tokens wherever and whenever it
runs (up to float rounding: the attention reads the same keys in another order).

One call (``RefillDecoder.run``): at each segment boundary the host schedule
(``refill_schedule.RefillSchedule``) releases the stopped rows' pages, reserves the
running rows' next segment (evicting the youngest when a pool is short) and admits
queued rows into idle slots; then the device

1. **prefills** the admitted rows' new prompts once per lane (every prompt token but
   the last, whose key each row computes itself in its first decode step), straight
   into pages;
2. **decodes** one segment: a ``while_loop`` of up to ``segment`` steps over the slots
   against the paged cache, reading ``W`` logical pages per slot (the smallest page
   bucket holding the longest running row). It also returns each slot's row of the
   outputs: the rows that stopped in it reach the caller's ``RolloutListener`` before
   the next segment is dispatched, and are scored while it decodes (the scoring
   overlaps the tail). The program is the same with or without a listener.

Programs (all compiled by ``warmup``): ``prefill`` per (prompt-row rung, prompt
bucket), ``segment`` per (page bucket, row bucket), and per row bucket ``stats`` and
``outputs`` (the call's output buffers, filled on device). The
per-group max / median reach the controller through the ``stats`` program's in-jit
host callback, once per call, as with the other samplers.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sagc_jax.models.paged_cache import SCRATCH_PAGE
from sagc_jax.runtime.compilation import WarmupJob
from sagc_jax.runtime.distributed import to_host
from sagc_jax.sampling.decode import place
from sagc_jax.sampling.listener import RolloutListener, wait_for
from sagc_jax.sampling.refill_programs import RefillPrograms
from sagc_jax.sampling.refill_schedule import RefillSchedule

__all__ = ["RefillDecoder", "auto_refill_segment"]


def auto_refill_segment(max_new_tokens: int) -> int:
  """Default decode steps between refills: 1/32 of the response cap, within [8, 64].

  A slot whose row stops waits for the boundary to take a queued row, so a segment
  costs up to its length in idle slot-steps per finished row; each boundary costs a
  host sync (a few small transfers). 512-token responses: 16 steps.
  """
  return min(64, max(8, max_new_tokens // 32))


class RefillDecoder(RefillPrograms):
  """The host loop of refill decoding over its programs (``RefillPrograms``, whose
  arguments it takes)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.evictions = 0            # rows restarted because the pool ran short (all calls)

  def with_slots(self, slots: int) -> "RefillDecoder":
    """The same decoder on ``slots`` slots with the default pool (the AOT tool's slot
    search compiles a few and keeps the fastest that fits)."""
    return RefillDecoder(self.graphdef, self.params, self.cfg, cache_dtype=self.cache_dtype,
                         options_for=self.options_for, sink=self.sink, slots=slots,
                         page_size=self.page_size, num_pages=None, segment=self.segment,
                         prompt_buckets=self.prompt_buckets, mesh=self.mesh)

  def warmup_job(self, state, row_buckets: Sequence[int]) -> WarmupJob:
    self._ensure_pools()                 # allocated once, before the first call
    keys = set().union(*(self.executable_keys(r) for r in row_buckets))
    return WarmupJob(self.programs, sorted(keys), (state,))

  # ------------------------------------------------------------- host loop
  def _ensure_pools(self):
    if self._pools is None:
      zeros = lambda spec: jnp.zeros(spec.shape, spec.dtype)
      specs = self._abstract_pools()
      shardings = None if self.mesh is None else jax.tree.map(lambda s: s.sharding, specs)
      self._pools = jax.jit(lambda: jax.tree.map(zeros, specs), out_shardings=shardings)()
    return self._pools

  def run(self, state, rows: int, prompts: Sequence[Sequence[int]], group_size: int,
          row_ids: np.ndarray, group_ids: np.ndarray, row_valid: np.ndarray, seed: int,
          listener: RolloutListener | None = None) -> tuple[dict[str, Any], float, int]:
    """All ``len(prompts) * group_size`` rows of one call (outputs padded to ``rows``);
    ``(outputs, seconds, slots)`` like the other samplers' calls: tokens, logprobs,
    lengths, decode_steps (steps run) and stats; ``slots`` = slots x steps run.

    ``listener`` receives the rows that stopped in a segment while the next one
    decodes, and is lent the host while each segment runs."""
    n_new = self.params.max_new_tokens
    for p in prompts:
      if len(p) > max(self.prompt_buckets):
        raise ValueError(f"a {len(p)}-token prompt exceeds the largest prompt bucket "
                         f"{max(self.prompt_buckets)}")
    sched = RefillSchedule(prompts, group_size, lanes=self.lanes,
                           slots_per_lane=self.slots_per_lane, num_pages=self.num_pages,
                           page_size=self.page_size, segment=self.segment,
                           max_new_tokens=n_new)
    pools = self._ensure_pools()
    self._pools = None                   # donated below; restored when the call ends
    out = self.programs.get(("outputs", rows))()
    seed_arr = np.uint32(seed)
    steps = slots_used = 0
    start = time.perf_counter()
    try:
      for new_prompts, copies in sched.boundaries():
        if any(new_prompts):
          pools = self._prefill(state, pools, [[sched.prompts[p] for p in lane_prompts]
                                               for lane_prompts in new_prompts])
        pools, got, out, ran, slot_tokens = self._segment(state, pools, sched, copies, out,
                                                          rows, row_ids, seed_arr)
        got, ran = wait_for((got, ran), listener)
        steps += int(ran)
        slots_used += self.slots * int(ran)
        sched.advance(got["own_len"], got["last"], got["done"])
        stopped = [(i, s.row, s.own_len) for i, s in enumerate(sched.slots)
                   if s.row >= 0 and s.done]
        if listener is not None and stopped:   # before the next dispatch: on several
          self._deliver(listener, slot_tokens, stopped)   # processes the fetch is a program
    except BaseException:
      self._pools = None                 # possibly donated to a failed program: rebuilt
      raise
    finally:
      self.evictions += sched.evictions
    self._pools = pools
    if sched.held:
      raise RuntimeError(f"refill: {sched.held} pages still held after the call (a leak)")
    result = to_host(out)
    lengths, lane = (np.pad(x, (0, rows - len(x))) for x in (sched.lengths, sched.final_lane))
    tokens, logprobs = (result[k][lane, np.arange(rows)] for k in ("tokens", "logprobs"))
    # An evicted row restarts and rewrites its tokens; columns past its final length
    # (left by an earlier, longer attempt, were rounding to change it) are cleared.
    past = np.arange(n_new)[None, :] >= lengths[:, None]
    tokens[past], logprobs[past] = self.params.pad_id, 0.0
    out = self._result(rows, tokens, logprobs, lengths, steps, group_ids, row_valid)
    return out, time.perf_counter() - start, slots_used

  def _prefill(self, state, pools, prompts: list[list[Any]]):
    """Prefills each lane's new prompts (``prompts[lane]``) in one program."""
    every = [p for lane_prompts in prompts for p in lane_prompts]
    bucket = min(b for b in self.prompt_buckets if b >= max(p.kv_len for p in every))
    rung = min(r for r in self.prompt_rungs() if r >= max(map(len, prompts)))
    length = self._prefill_len(bucket)
    lanes = self.lanes
    tokens = np.full((lanes, rung, length), self.params.pad_id, np.int32)
    mask = np.zeros((lanes, rung, length), bool)
    page_ids = np.full((lanes, rung, length // self.page_size), SCRATCH_PAGE, np.int32)
    for lane, lane_prompts in enumerate(prompts):
      for i, prompt in enumerate(lane_prompts):
        tokens[lane, i, :prompt.kv_len] = prompt.tokens[:-1]
        mask[lane, i, :prompt.kv_len] = True
        page_ids[lane, i, :len(prompt.pages[lane])] = prompt.pages[lane]
    program = self.programs.get(("prefill", rung, bucket), state)
    inputs = (tokens.reshape(lanes * rung, length), mask.reshape(lanes * rung, length),
              page_ids)
    return program(state, pools, *self._place(
        inputs, [self._spec(x.shape, x.dtype, ("data",)) for x in inputs]))

  def _segment(self, state, pools, sched: RefillSchedule, copies: dict[int, tuple[int, int]],
               out, rows: int, row_ids: np.ndarray, seed):
    page, prompt_of = self.page_size, sched.prompts
    longest = max(prompt_of[s.prompt].kv_len // page + len(s.pages) for s in sched.running)
    width = min(w for w in self.page_buckets() if w >= longest)
    table = np.full((self.slots, width), SCRATCH_PAGE, np.int32)
    host = {k: np.zeros(self.slots, np.int32) for k in ("prompt_len", "own_len", "last",
                                                        "row_ids", "copy_src", "copy_dst")}
    host["out_row"] = np.full(self.slots, rows, np.int32)
    done = np.ones(self.slots, bool)
    for i, s in enumerate(sched.slots):
      if s.row < 0:
        continue
      prompt = prompt_of[s.prompt]
      shared = prompt.pages[s.lane][:prompt.kv_len // page]
      table[i, :len(shared) + len(s.pages)] = shared + s.pages
      host["prompt_len"][i], host["own_len"][i], host["last"][i] = (
          prompt.kv_len, s.own_len, s.last)
      host["row_ids"][i], host["out_row"][i] = row_ids[s.row], s.row
      done[i] = s.done
    for i, (src, dst) in copies.items():
      host["copy_src"][i], host["copy_dst"][i] = src, dst
    specs = self._slot_specs(width)
    slot_inputs = {k: place(v, specs[k].sharding)
                   for k, v in dict(host, page_table=table, done=done).items()}
    return self.programs.get(("segment", width, rows), state)(
        state, pools, slot_inputs, out, place(seed, self._spec((), jnp.uint32).sharding))

  @staticmethod
  def _deliver(listener: RolloutListener, slot_tokens: jax.Array,
               stopped: list[tuple[int, int, int]]) -> None:
    """Rows that stopped in a segment (final: a stopped row is never evicted), with
    their tokens from the segment's per-slot copy of the outputs."""
    slot_index, rows, lengths = (np.asarray(x, np.int64) for x in zip(*stopped))
    listener.rows_done(rows, to_host(slot_tokens)[slot_index], lengths.astype(np.int32))

