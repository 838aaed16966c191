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

One call (``RefillDecoder.run``), on the host:

1. **Release**: rows that stopped in the last segment give back their own pages; a
   prompt's pages go back when its last row has finished.
2. **Reserve**: each running row gets the pages it can fill in the next segment
   (``segment`` tokens), so no page is allocated inside a program. When the pool is
   short, the youngest running rows are evicted (their pages freed, the rows queued
   again at the front: they restart from token 0 and sample the same tokens).
3. **Admit**: queued rows take idle slots, in order, while the pool holds their
   prompt (unless resident) and their first segment's pages.
4. **Prefill** the admitted rows' new prompts once each (every prompt token but the
   last, whose key each row computes itself in its first decode step), straight into
   pages.
5. **Decode** one segment: a ``while_loop`` of up to ``segment`` steps over the slots
   against the paged cache, reading ``W`` logical pages per slot (the smallest page
   bucket holding the longest running row).

Programs (all compiled by ``warmup``): ``prefill`` per (prompt-row rung, prompt
bucket), ``segment`` per (page bucket, row bucket) and ``stats`` per row bucket. The
per-group max / median reach the controller through the ``stats`` program's in-jit
host callback, once per call, as with the other samplers.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.paged_cache import (SCRATCH_PAGE, PagedKVCache, SlotKVCache, abstract_pool,
                                         gather_slots, init_pool, scatter_slots)
from sagc_jax.models.sharding import abstract_like
from sagc_jax.models.transformer import ForwardOptions
from sagc_jax.runtime.compilation import ProgramCache, WarmupJob
from sagc_jax.runtime.distributed import to_host
from sagc_jax.sampling import decode
from sagc_jax.sampling.group_stats import LengthStatsSink, lower_stats
from sagc_jax.sampling.params import SamplingParams

__all__ = ["PagePool", "RefillDecoder", "auto_pages", "auto_refill_segment"]


def _pages(tokens: int, page_size: int) -> int:
  return -(-tokens // page_size)


class PagePool:
  """The host's free list of a paged cache's pages; page 0 (scratch) is never handed out.

  Every page is either free or held, never both: ``give`` refuses a page that is not
  held, so a double free or a leak shows as an error or as ``held`` not returning to
  0 after a call (both tested).
  """

  def __init__(self, num_pages: int):
    if num_pages < 2:
      raise ValueError(f"PagePool: num_pages={num_pages} must be >= 2 (page 0 is scratch)")
    self.num_pages = num_pages
    self._free = list(range(num_pages - 1, SCRATCH_PAGE, -1))     # pops low pages first
    self._held: set[int] = set()

  @property
  def free(self) -> int:
    return len(self._free)

  @property
  def held(self) -> int:
    return len(self._held)

  def take(self, n: int) -> list[int]:
    if n > len(self._free):
      raise RuntimeError(f"PagePool: {n} pages asked, {len(self._free)} free")
    pages = [self._free.pop() for _ in range(n)]
    self._held.update(pages)
    return pages

  def give(self, pages: Sequence[int]) -> None:
    for page in pages:
      if page not in self._held:
        raise RuntimeError(f"PagePool: page {page} given back but not held")
      self._held.remove(page)
      self._free.append(page)


def auto_refill_segment(max_new_tokens: int) -> int:
  """Default decode steps between refills: 1/32 of the response cap, within [8, 64].

  A slot whose row stops waits for the boundary to take a queued row, so a segment
  costs up to its length in idle slot-steps per finished row; each boundary costs a
  host sync (a few small transfers). 512-token responses: 16 steps.
  """
  return min(64, max(8, max_new_tokens // 32))


def auto_pages(slots: int, pages_per_row: int) -> int:
  """Default pool: every slot can hold a row of the longest length at once (no
  eviction ever), plus the scratch page. The AOT tool sizes pools from HBM instead."""
  return slots * pages_per_row + 1


@dataclasses.dataclass
class _Slot:
  row: int = -1                 # row of the call (-1: idle)
  prompt: int = -1
  pages: list = dataclasses.field(default_factory=list)    # own pages, in order
  own_len: int = 0
  last: int = 0
  done: bool = True


@dataclasses.dataclass
class _Prompt:
  tokens: list
  unfinished: int               # rows of the prompt not finished yet
  pages: list = dataclasses.field(default_factory=list)    # resident pages (prefilled)

  @property
  def kv_len(self) -> int:      # keys the prompt shares: every token but the last
    return len(self.tokens) - 1


class RefillDecoder:
  """The programs and host loop of refill decoding for one model architecture.

  Args:
    graphdef: the model's graph (``nnx.split``); parameters come with every call.
    params: ``SamplingParams`` (the fused sampler's: same tokens).
    cfg: the model config.
    cache_dtype: KV pool dtype.
    options: ``ForwardOptions`` of the prefill and decode passes (``paged_kernel``:
      ``"xla"`` or ``"pallas"``).
    sink: host sink of the per-group length stats.
    slots: rows decoding at once.
    page_size: tokens per page.
    num_pages: pages per layer pool, the scratch page included (None: ``auto_pages``).
    segment: decode steps between refills (host syncs).
    prompt_buckets: padded prompt lengths (as the fused sampler's).
    mesh: a one-device mesh the programs are placed on (e.g. one abstract TPU chip, for
      ahead-of-time compilation), or None.
  """

  def __init__(self, graphdef: nnx.GraphDef, params: SamplingParams, cfg: ModelConfig, *,
               cache_dtype: Any, options: ForwardOptions, sink: LengthStatsSink,
               slots: int, page_size: int, num_pages: int | None, segment: int,
               prompt_buckets: Sequence[int], mesh: Mesh | None = None):
    for name, value in (("refill_slots", slots), ("page_size", page_size),
                        ("refill_segment", segment)):
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
    self.graphdef, self.params, self.cfg = graphdef, params, cfg
    self.cache_dtype, self.options, self.sink = cache_dtype, options, sink
    self.slots, self.page_size, self.segment = slots, page_size, segment
    self.prompt_buckets = tuple(sorted(set(prompt_buckets)))
    # The longest row: every prompt key but the last token's, then one own key per
    # response token.
    self.pages_per_row = _pages(max(self.prompt_buckets) - 1 + params.max_new_tokens,
                                page_size)
    self.num_pages = auto_pages(slots, self.pages_per_row) if num_pages is None else num_pages
    if (isinstance(self.num_pages, bool) or not isinstance(self.num_pages, int)
        or self.num_pages < self.pages_per_row + 1):
      raise ValueError(
          f"kv_pages={num_pages!r}: the pool must hold at least one row of the longest "
          f"length ({self.pages_per_row} pages of {page_size} tokens for a "
          f"{max(self.prompt_buckets)}-token prompt bucket and {params.max_new_tokens} new "
          f"tokens) plus the scratch page: >= {self.pages_per_row + 1}")
    if mesh is not None and mesh.size > 1:
      raise ValueError(f"the refill decoder runs on one device so far; the mesh has "
                       f"{mesh.size}")
    self.mesh = mesh
    self.programs = ProgramCache(self._lower)
    self._pools = None
    self.evictions = 0            # rows restarted because the pool ran short (all calls)

  # ----------------------------------------------------------------- shapes
  def page_buckets(self) -> tuple[int, ...]:
    """Logical pages a segment program reads per slot: doubling from one segment
    past the shortest prompt bucket up to ``pages_per_row``."""
    first = min(self.pages_per_row,
                _pages(min(self.prompt_buckets) - 1 + self.segment, self.page_size))
    buckets, w = {self.pages_per_row}, max(first, 1)
    while w < self.pages_per_row:
      buckets.add(w)
      w *= 2
    return tuple(sorted(buckets))

  def prompt_rungs(self) -> tuple[int, ...]:
    """Prompt rows of a prefill: 1, 2, 4, ... up to ``slots`` (at most one new prompt
    per admitted row)."""
    rungs, r = {self.slots}, 1
    while r < self.slots:
      rungs.add(r)
      r *= 2
    return tuple(sorted(rungs))

  def _prefill_len(self, prompt_bucket: int) -> int:
    """Token columns of a prefill (the bucket, whole pages)."""
    return _pages(prompt_bucket, self.page_size) * self.page_size

  def executable_keys(self, rows: int) -> set[tuple]:
    keys = {("prefill", p, b) for p in self.prompt_rungs() for b in self.prompt_buckets}
    keys |= {("segment", w, rows) for w in self.page_buckets()}
    keys.add(("stats", rows))
    return keys

  def warmup_job(self, state, row_buckets: Sequence[int]) -> WarmupJob:
    self._ensure_pools()                 # allocated once, before the first call
    keys = set().union(*(self.executable_keys(r) for r in row_buckets))
    return WarmupJob(self.programs, sorted(keys), (state,))

  @property
  def num_executables(self) -> int:
    return len(self.programs)

  # ----------------------------------------------------------- executables
  def _spec(self, shape, dtype, names=()):
    return decode.sharded_spec(self.mesh, shape, dtype, ())    # one device: replicated

  def _jit(self, fn, in_specs: tuple, out_spec: Any = None, donate: tuple[int, ...] = ()):
    return jax.jit(fn, donate_argnums=donate).lower(*in_specs)

  def _abstract_pools(self):
    pools = abstract_pool(self.cfg, self.num_pages, self.page_size, self.cache_dtype)
    return jax.tree.map(lambda x: self._spec(x.shape, x.dtype), pools)

  def _lower(self, key: tuple, state=None):
    kind, *shape = key
    if kind == "stats":
      return lower_stats(self.sink, shape[0], self._spec, self._jit)
    return getattr(self, f"_lower_{kind}")(state, *shape)

  def _lower_prefill(self, state, prompt_rows: int, prompt_bucket: int):
    """Prefills ``prompt_rows`` right-padded prompts into a dense cache and copies it
    into their pages (``page_ids``; 0, the scratch page, where a prompt has none)."""
    graphdef, cfg, options = self.graphdef, self.cfg, self.options
    length, page = self._prefill_len(prompt_bucket), self.page_size

    def sampler_prefill(state, pools, tokens, mask, page_ids):
      model = nnx.merge(graphdef, state)
      cache = decode.new_cache(cfg, prompt_rows, length, self.cache_dtype, None)
      _, cache = decode.prefill(model, tokens, mask, cache, options)

      def into_pages(pool, dense):        # [P, KV, T, D] -> pool pages
        p, kv, _, d = dense.shape
        paged = dense.reshape(p, kv, length // page, page, d).swapaxes(0, 1)
        return pool.at[:, page_ids.reshape(-1)].set(
            paged.reshape(kv, -1, page, d).astype(pool.dtype))

      return (tuple(map(into_pages, pools[0], cache.k)),
              tuple(map(into_pages, pools[1], cache.v)))

    inputs = (abstract_like(state), self._abstract_pools(),
              self._spec((prompt_rows, length), jnp.int32, ()),
              self._spec((prompt_rows, length), jnp.bool_, ()),
              self._spec((prompt_rows, length // page), jnp.int32, ()))
    return self._jit(sampler_prefill, inputs, donate=(1,))

  def _slot_specs(self, pages: int) -> dict[str, Any]:
    s = self.slots
    one = lambda dtype: self._spec((s,), dtype, ())
    return dict(page_table=self._spec((s, pages), jnp.int32, ()), prompt_len=one(jnp.int32),
                own_len=one(jnp.int32), last=one(jnp.int32), done=one(jnp.bool_),
                row_ids=one(jnp.int32), out_row=one(jnp.int32), copy_src=one(jnp.int32),
                copy_dst=one(jnp.int32))

  def _out_specs(self, rows: int) -> dict[str, Any]:
    n_new = self.params.max_new_tokens
    return dict(tokens=self._spec((rows + 1, n_new), jnp.int32, ()),
                logprobs=self._spec((rows + 1, n_new), jnp.float32, ()))

  def _lower_segment(self, state, pages: int, rows: int):
    """Up to ``segment`` decode steps of every running slot against the pools; a new
    row's copy-on-write page (``copy_src`` -> ``copy_dst``) is copied first. Tokens
    and log-probs go to row ``out_row`` of the call's outputs (row ``rows``: a
    discard row for idle slots).

    With ``paged_kernel="xla"`` the slots' pages are gathered into contiguous views
    once, the segment decodes against the views, and they are scattered back at the
    end (``models.paged_cache``: a per-step gather would copy every page each step);
    the Pallas kernel reads the pools every step."""
    graphdef, params, options = self.graphdef, self.params, self.options
    n_new, segment = params.max_new_tokens, self.segment
    views = options.paged_kernel == "xla"

    def sampler_refill_segment(state, pools, slots, out, seed):
      model = nnx.merge(graphdef, state)
      table = slots["page_table"]
      copy = lambda pool: pool.at[:, slots["copy_dst"]].set(pool[:, slots["copy_src"]])
      k_pools, v_pools = tuple(map(copy, pools[0])), tuple(map(copy, pools[1]))
      if views:
        k_run = tuple(gather_slots(p, table) for p in k_pools)
        v_run = tuple(gather_slots(p, table) for p in v_pools)
      else:
        k_run, v_run = k_pools, v_pools
      carry = dict(i=jnp.int32(0), k=k_run, v=v_run,
                   own_len=slots["own_len"], last=slots["last"], done=slots["done"], **out)

      def keep_going(c):
        return (c["i"] < segment) & jnp.any(~c["done"])

      def step(c):
        alive = ~c["done"]
        cache = (SlotKVCache(c["k"], c["v"], slots["prompt_len"], c["own_len"]) if views else
                 PagedKVCache(c["k"], c["v"], table, slots["prompt_len"], c["own_len"]))
        logits, cache = model(c["last"][:, None], attention_mask=alive[:, None], cache=cache,
                              options=options)
        t = c["own_len"]                               # the token each slot samples now
        tokens, logp, hit_stop = decode.draw(logits[:, -1], seed, slots["row_ids"], t, alive,
                                             params)
        row = jnp.where(alive, slots["out_row"], rows)
        col = jnp.minimum(t, n_new - 1)
        return dict(c, i=c["i"] + 1, k=cache.k, v=cache.v, own_len=cache.own_len,
                    last=jnp.where(alive, tokens, c["last"]),
                    done=c["done"] | hit_stop | (cache.own_len >= n_new),
                    tokens=c["tokens"].at[row, col].set(tokens),
                    logprobs=c["logprobs"].at[row, col].set(logp))

      c = jax.lax.while_loop(keep_going, step, carry)
      k_out, v_out = c["k"], c["v"]
      if views:
        k_out = tuple(scatter_slots(p, table, view) for p, view in zip(k_pools, k_out))
        v_out = tuple(scatter_slots(p, table, view) for p, view in zip(v_pools, v_out))
      return ((k_out, v_out), dict(own_len=c["own_len"], last=c["last"], done=c["done"]),
              dict(tokens=c["tokens"], logprobs=c["logprobs"]), c["i"])

    inputs = (abstract_like(state), self._abstract_pools(), self._slot_specs(pages),
              self._out_specs(rows), self._spec((), jnp.uint32, ()))
    return self._jit(sampler_refill_segment, inputs, donate=(1, 3))

  # ------------------------------------------------------------- host loop
  def _ensure_pools(self):
    if self._pools is None:
      self._pools = init_pool(self.cfg, self.num_pages, self.page_size, self.cache_dtype)
    return self._pools

  def run(self, state, rows: int, prompts: Sequence[Sequence[int]], group_size: int,
          row_ids: np.ndarray, group_ids: np.ndarray, row_valid: np.ndarray, seed: int
          ) -> tuple[dict[str, Any], float, int]:
    """All ``len(prompts) * group_size`` rows of one call (outputs padded to ``rows``);
    ``(outputs, seconds, slots)`` like the other samplers' calls: tokens, logprobs,
    lengths, decode_steps (steps run) and stats; ``slots`` = slots x steps run."""
    params, page = self.params, self.page_size
    n_new, real_rows = params.max_new_tokens, len(prompts) * group_size
    for p in prompts:
      if len(p) > max(self.prompt_buckets):
        raise ValueError(f"a {len(p)}-token prompt exceeds the largest prompt bucket "
                         f"{max(self.prompt_buckets)}")
    prompt_of = [_Prompt(list(map(int, p)), unfinished=group_size) for p in prompts]
    queue = collections.deque(range(real_rows))
    slots = [_Slot() for _ in range(self.slots)]
    pool = PagePool(self.num_pages)
    lengths = np.zeros(rows, np.int32)
    pools = self._ensure_pools()
    self._pools = None                   # donated below; restored when the call ends
    out = dict(tokens=np.full((rows + 1, n_new), params.pad_id, np.int32),
               logprobs=np.zeros((rows + 1, n_new), np.float32))
    seed_arr = np.uint32(seed)
    steps = slots_used = 0
    start = time.perf_counter()

    def own_pages_needed(slot: _Slot, prompt: _Prompt) -> int:
      """Own pages a slot needs to run the next segment (shared prompt pages aside)."""
      upto = prompt.kv_len + min(slot.own_len + self.segment, n_new)
      return _pages(upto, page) - prompt.kv_len // page

    def free_prompt(prompt: _Prompt) -> None:
      pool.give(prompt.pages)
      prompt.pages = []

    def evict_youngest() -> bool:
      running = [i for i, s in enumerate(slots) if s.row >= 0]
      if len(running) <= 1:
        return False
      index = min(running, key=lambda i: (slots[i].own_len, -slots[i].row))
      victim = slots[index]
      pool.give(victim.pages)
      queue.appendleft(victim.row)
      slots[index] = _Slot()
      self.evictions += 1
      if not any(s.row >= 0 and s.prompt == victim.prompt for s in slots):
        free_prompt(prompt_of[victim.prompt])   # prefilled again when a row of it restarts
      return True

    try:
      while True:
        # 1. Release the rows that stopped.
        for index, s in enumerate(slots):
          if s.row >= 0 and s.done:
            lengths[s.row] = s.own_len
            pool.give(s.pages)
            prompt = prompt_of[s.prompt]
            prompt.unfinished -= 1
            if prompt.unfinished == 0:
              free_prompt(prompt)
            slots[index] = _Slot()
        # 2. Reserve the running rows' next segment, evicting the youngest if short.
        def shortfall() -> int:
          need = sum(max(own_pages_needed(s, prompt_of[s.prompt]) - len(s.pages), 0)
                     for s in slots if s.row >= 0)
          return need - pool.free
        while shortfall() > 0:
          if not evict_youngest():
            raise RuntimeError("refill: the pool cannot hold one running row "
                               "(kv_pages is checked against this at construction)")
        # 3. Admit queued rows into idle slots, in order.
        spare = -shortfall()
        new_prompts: list[int] = []
        copies: dict[int, tuple[int, int]] = {}
        for index, s in enumerate(slots):
          if s.row >= 0 or not queue:
            continue
          row = queue[0]
          p = row // group_size
          prompt = prompt_of[p]
          resident = bool(prompt.pages) or p in new_prompts
          cost = own_pages_needed(_Slot(), prompt) + (
              0 if resident else _pages(prompt.kv_len, page))
          if cost > spare:
            break
          queue.popleft()
          spare -= cost
          if not resident:
            new_prompts.append(p)
            prompt.pages = pool.take(_pages(prompt.kv_len, page))
          s.row, s.prompt, s.own_len, s.done = row, p, 0, False
          s.last = prompt.tokens[-1]
          s.pages = pool.take(own_pages_needed(s, prompt))
          if prompt.kv_len % page:                 # copy on write of the partial page
            copies[index] = (prompt.pages[prompt.kv_len // page], s.pages[0])
        running = [s for s in slots if s.row >= 0]
        if not running:
          if queue:
            raise RuntimeError("refill: no queued row fits the empty pool")
          break
        for s in running:                          # pages for the segment
          extra = own_pages_needed(s, prompt_of[s.prompt]) - len(s.pages)
          if extra > 0:
            s.pages += pool.take(extra)
        # 4. Prefill the new prompts.
        if new_prompts:
          pools = self._prefill(state, pools, [prompt_of[p] for p in new_prompts])
        # 5. One segment.
        pools, got, out, ran = self._segment(state, pools, slots, prompt_of, copies, out,
                                             rows, row_ids, seed_arr)
        steps += ran
        slots_used += self.slots * ran
        for s, own_len, last, done in zip(slots, got["own_len"], got["last"], got["done"]):
          if s.row >= 0:
            s.own_len, s.last, s.done = int(own_len), int(last), bool(done)
    except BaseException:
      self._pools = None                 # possibly donated to a failed program: rebuilt
      raise
    self._pools = pools
    if pool.held:
      raise RuntimeError(f"refill: {pool.held} pages still held after the call (a leak)")
    result = to_host(out)
    tokens, logprobs = result["tokens"][:rows].copy(), result["logprobs"][:rows].copy()
    # An evicted row restarts and rewrites its tokens; columns past its final length
    # (left by an earlier, longer attempt, were rounding to change it) are cleared.
    past = np.arange(n_new)[None, :] >= lengths[:, None]
    tokens[past], logprobs[past] = params.pad_id, 0.0
    stats = to_host(self.programs.get(("stats", rows))(lengths, group_ids, row_valid))
    return (dict(tokens=tokens, logprobs=logprobs, lengths=lengths,
                 decode_steps=np.int32(steps), stats=stats),
            time.perf_counter() - start, slots_used)

  def _prefill(self, state, pools, prompts: list[_Prompt]):
    bucket = min(b for b in self.prompt_buckets if b >= max(p.kv_len for p in prompts))
    rung = min(r for r in self.prompt_rungs() if r >= len(prompts))
    length = self._prefill_len(bucket)
    tokens = np.full((rung, length), self.params.pad_id, np.int32)
    mask = np.zeros((rung, length), bool)
    page_ids = np.full((rung, length // self.page_size), SCRATCH_PAGE, np.int32)
    for i, prompt in enumerate(prompts):
      tokens[i, :prompt.kv_len] = prompt.tokens[:-1]
      mask[i, :prompt.kv_len] = True
      page_ids[i, :len(prompt.pages)] = prompt.pages
    return self.programs.get(("prefill", rung, bucket), state)(state, pools, tokens, mask,
                                                               page_ids)

  def _segment(self, state, pools, slots: list[_Slot], prompt_of: list[_Prompt],
               copies: dict[int, tuple[int, int]], out, rows: int, row_ids: np.ndarray, seed):
    page = self.page_size
    s_count = self.slots
    longest = max(prompt_of[s.prompt].kv_len // page + len(s.pages)
                  for s in slots if s.row >= 0)
    width = min(w for w in self.page_buckets() if w >= longest)
    table = np.full((s_count, width), SCRATCH_PAGE, np.int32)
    host = {k: np.zeros(s_count, np.int32) for k in ("prompt_len", "own_len", "last",
                                                     "row_ids", "copy_src", "copy_dst")}
    host["out_row"] = np.full(s_count, rows, np.int32)
    done = np.ones(s_count, bool)
    for i, s in enumerate(slots):
      if s.row < 0:
        continue
      prompt = prompt_of[s.prompt]
      shared = prompt.pages[:prompt.kv_len // page]
      table[i, :len(shared) + len(s.pages)] = shared + s.pages
      host["prompt_len"][i], host["own_len"][i], host["last"][i] = (
          prompt.kv_len, s.own_len, s.last)
      host["row_ids"][i], host["out_row"][i] = row_ids[s.row], s.row
      done[i] = s.done
    for i, (src, dst) in copies.items():
      host["copy_src"][i], host["copy_dst"][i] = src, dst
    slot_inputs = dict(host, page_table=table, done=done)
    pools, got, out, ran = self.programs.get(("segment", width, rows), state)(
        state, pools, slot_inputs, out, seed)
    return pools, to_host(got), out, int(ran)
