"""The programs of refill decoding (``refill.py``): their shapes, lanes and lowering.

Programs (all compiled by ``warmup``): ``prefill`` per (prompt-row rung, prompt
bucket), ``segment`` per (page bucket, row bucket), and per row bucket ``stats`` and
``outputs`` (the call's output buffers, filled on device).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sagc_jax.models.paged_cache import (POOL_AXES, PagedKVCache, SlotKVCache, gather_slots,
                                         pool_shape, repeat_heads, scatter_slots)
from sagc_jax.models.sharding import abstract_like, named_sharding
from sagc_jax.models.splash import head_layout
from sagc_jax.runtime.compilation import ProgramCache
from sagc_jax.runtime.shapes import row_ladder
from sagc_jax.sampling import decode
from sagc_jax.sampling.programs import DecoderPrograms
from sagc_jax.sampling.refill_schedule import pages_for

__all__ = ["RefillPrograms"]


class RefillPrograms(DecoderPrograms):
  """The programs of refill decoding for one model architecture, keyed by shape.

  On a mesh, the slots and the pools are split over its ``'data'`` axis into *lanes*:
  lane ``l`` holds slots ``[l * S/L, (l + 1) * S/L)`` and its own pool of ``num_pages``
  pages (page ids are lane-local), so every gather, write and scatter of the cache is
  local to a device row of the mesh (batched over the lane dimension), and KV heads
  are split over ``'model'`` where they divide it. A prompt is prefilled into each lane
  that runs one of its rows. The Pallas kernel runs per device, inside
  ``jax.shard_map`` (``paged_cache.paged_decode_attend``).

  Args: those of ``programs.DecoderPrograms`` (``cache_dtype``: the pools';
    ``options_for``'s ``paged_kernel``: ``"xla"`` or ``"pallas"``; ``mesh`` may be
    None: one device), and
    slots: rows decoding at once (a multiple of the mesh's 'data' axis).
    page_size: tokens per page.
    num_pages: pages per layer pool of each lane, its scratch page included (None:
      every slot can hold a row of the longest length at once, no eviction ever).
    segment: decode steps between refills (host syncs).
    prompt_buckets: padded prompt lengths (as the fused sampler's).
  """

  def __init__(self, *args, slots: int, page_size: int, num_pages: int | None, segment: int,
               prompt_buckets: Sequence[int], mesh=None, **kwargs):
    self.lanes = 1 if mesh is None else int(mesh.shape.get("data", 1))
    if slots <= 0 or slots % self.lanes:
      raise ValueError(f"refill_slots={slots} must be a multiple of the mesh's 'data' axis "
                       f"({self.lanes}), and positive: each data shard decodes its own slots")
    super().__init__(*args, mesh=mesh, **kwargs)
    self.slots, self.page_size, self.segment = slots, page_size, segment
    self.slots_per_lane = slots // self.lanes
    self.prompt_buckets = tuple(sorted(set(prompt_buckets)))
    # The longest row: every prompt key but the last token's, then one own key per
    # response token.
    self.pages_per_row = pages_for(max(self.prompt_buckets) - 1 + self.params.max_new_tokens,
                                   page_size)
    # Copies of each KV head in the pools, so that the heads divide 'model' (Qwen2.5-3B:
    # 2 KV heads, 4-way axis -> 2 copies, one head per device instead of both on all).
    self.kv_repeats = 1 if mesh is None else head_layout(
        self.cfg.num_heads, self.cfg.num_kv_heads, mesh.shape.get("model", 1))[1]
    self.resize_pool(num_pages)

  def resize_pool(self, num_pages: int | None) -> None:
    """Another pool size (per lane, the scratch page included; None: every slot can
    hold a row of the longest length at once): the programs that receive the pools are
    lowered again when next used (the AOT tool sizes the pool to the chip's HBM this
    way)."""
    self.pages_auto = num_pages is None
    if num_pages is None:
      num_pages = self.slots_per_lane * self.pages_per_row + 1
    if num_pages < self.pages_per_row + 1:
      raise ValueError(
          f"kv_pages={num_pages!r}: the pool must hold at least one row of the longest "
          f"length ({self.pages_per_row} pages of {self.page_size} tokens for a "
          f"{max(self.prompt_buckets)}-token prompt bucket and {self.params.max_new_tokens} "
          f"new tokens) plus the scratch page: >= {self.pages_per_row + 1}")
    self.num_pages = num_pages
    self.programs = ProgramCache(self._lower)
    self._pools = None            # the device pools, allocated at this size when next used

  # ----------------------------------------------------------------- shapes
  def page_buckets(self) -> tuple[int, ...]:
    """Logical pages a segment program reads per slot: doubling from one segment
    past the shortest prompt bucket up to ``pages_per_row``."""
    first = min(self.pages_per_row,
                pages_for(min(self.prompt_buckets) - 1 + self.segment, self.page_size))
    buckets, w = {self.pages_per_row}, max(first, 1)
    while w < self.pages_per_row:
      buckets.add(w)
      w *= 2
    return tuple(sorted(buckets))

  def prompt_rungs(self) -> tuple[int, ...]:
    """Prompt rows of a prefill per lane: 1, 2, 4, ... up to the lane's slots (at most
    one new prompt per admitted row)."""
    return row_ladder(self.slots_per_lane, 1)

  def _prefill_len(self, prompt_bucket: int) -> int:
    """Token columns of a prefill (the bucket, whole pages)."""
    return pages_for(prompt_bucket, self.page_size) * self.page_size

  def executable_keys(self, rows: int) -> set[tuple]:
    keys = {("prefill", p, b) for p in self.prompt_rungs() for b in self.prompt_buckets}
    keys |= {("segment", w, rows) for w in self.page_buckets()}
    keys |= {("stats", rows), ("outputs", rows)}
    return keys

  def pool_bytes_per_device(self) -> int:
    """Bytes of one device's share of the key and value pools of every layer."""
    leaves = jax.tree.leaves(self._abstract_pools())
    shard = lambda x: x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    return sum(math.prod(shard(x)) * jnp.dtype(x.dtype).itemsize for x in leaves)

  # ----------------------------------------------------------- executables
  def _abstract_pools(self):
    shape = (self.lanes,) + pool_shape(self.cfg, self.num_pages, self.page_size,
                                       self.kv_repeats)
    leaf = self._spec(shape, jnp.dtype(self.cache_dtype), POOL_AXES)
    return (leaf,) * self.cfg.num_layers, (leaf,) * self.cfg.num_layers

  def _lower_prefill(self, state, prompt_rows: int, prompt_bucket: int):
    """Prefills ``prompt_rows`` right-padded prompts per lane into a dense cache and
    copies each into its lane's pages (``page_ids`` [lanes, prompt_rows, pages]; 0,
    the scratch page, where a prompt has none)."""
    graphdef, cfg, lanes = self.graphdef, self.cfg, self.lanes
    length, page = self._prefill_len(prompt_bucket), self.page_size
    options = self.options_for(lanes * prompt_rows)

    def sampler_prefill(state, pools, tokens, mask, page_ids):
      model = nnx.merge(graphdef, state)
      cache = decode.new_cache(cfg, lanes * prompt_rows, length, self.cache_dtype, self.mesh)
      _, cache = decode.prefill(model, tokens, mask, cache, options)

      def into_pages(pool, dense):        # [L * P, KV, T, D] -> each lane's pool pages
        dense = repeat_heads(dense, pool.shape[1], 1)
        _, kv, _, d = dense.shape
        paged = dense.reshape(lanes, prompt_rows, kv, length // page, page, d)
        paged = paged.swapaxes(1, 2).reshape(lanes, kv, -1, page, d).astype(pool.dtype)
        return jax.vmap(lambda p, ids, new: p.at[:, ids].set(new))(
            pool, page_ids.reshape(lanes, -1), paged)

      return (tuple(map(into_pages, pools[0], cache.k)),
              tuple(map(into_pages, pools[1], cache.v)))

    rows = lanes * prompt_rows
    pools = self._abstract_pools()
    inputs = (abstract_like(state), pools,
              self._spec((rows, length), jnp.int32, ("data",)),
              self._spec((rows, length), jnp.bool_, ("data",)),
              self._spec((lanes, prompt_rows, length // page), jnp.int32, ("data",)))
    return decode.lower(sampler_prefill, inputs, pools, donate=(1,))

  def _lower_outputs(self, state, rows: int):
    """The call's output buffers on device: pad tokens, zero log-probs."""
    specs = self._out_specs(rows)
    fill = dict(tokens=self.params.pad_id, logprobs=0)
    return decode.lower(lambda: {k: jnp.full(s.shape, fill[k], s.dtype) for k, s in specs.items()},
                     (), specs)

  def _slot_specs(self, pages: int) -> dict[str, Any]:
    s = self.slots
    one = lambda dtype: self._spec((s,), dtype, ("data",))
    return dict(page_table=self._spec((s, pages), jnp.int32, ("data",)),
                prompt_len=one(jnp.int32), own_len=one(jnp.int32), last=one(jnp.int32),
                done=one(jnp.bool_), row_ids=one(jnp.int32), out_row=one(jnp.int32),
                copy_src=one(jnp.int32), copy_dst=one(jnp.int32))

  def _out_specs(self, rows: int) -> dict[str, Any]:
    """Each lane's outputs: row ``rows`` of a lane is the discard row of its idle slots."""
    shape = (self.lanes, rows + 1, self.params.max_new_tokens)
    return dict(tokens=self._spec(shape, jnp.int32, ("data",)),
                logprobs=self._spec(shape, jnp.float32, ("data",)))

  def _lower_segment(self, state, pages: int, rows: int):
    """Up to ``segment`` decode steps of every running slot against the pools; a new
    row's copy-on-write page (``copy_src`` -> ``copy_dst``) is copied first. Tokens
    and log-probs go to row ``out_row`` of the slot's lane's outputs.

    With ``paged_kernel="xla"`` the slots' pages are gathered into contiguous views
    once, the segment decodes against the views, and they are scattered back at the
    end (``models.paged_cache``: a per-step gather would copy every page each step);
    the Pallas kernel reads the pools every step."""
    graphdef, params = self.graphdef, self.params
    options = self.options_for(self.slots)
    if options.paged_kernel != "xla":    # the kernel runs per device on the mesh
      options = dataclasses.replace(options, mesh=self.mesh)
    n_new, segment = params.max_new_tokens, self.segment
    views = options.paged_kernel == "xla"
    view_shape = (self.slots, self.cfg.num_kv_heads * self.kv_repeats, pages * self.page_size,
                  self.cfg.head_dim)               # slots on 'data', heads on 'model'
    view_sharding = None if self.mesh is None else named_sharding(
        view_shape, ("data", "model", None, None), self.mesh)
    # [S, ...] -> [lanes, S / lanes, ...] (slot s is in lane s // (S / lanes)).
    by_lane = lambda x: x.reshape((self.lanes, -1) + x.shape[1:])
    lane_map = lambda fn, *args: jax.vmap(fn)(*args)

    def sampler_refill_segment(state, pools, slots, out, seed):
      model = nnx.merge(graphdef, state)
      table = by_lane(slots["page_table"])
      src, dst = by_lane(slots["copy_src"]), by_lane(slots["copy_dst"])
      copy = lambda pool: lane_map(lambda p, a, b: p.at[:, b].set(p[:, a]), pool, src, dst)
      k_pools, v_pools = tuple(map(copy, pools[0])), tuple(map(copy, pools[1]))
      if views:
        def gather(pool):
          view = lane_map(gather_slots, pool, table)
          view = view.reshape((self.slots,) + view.shape[2:])
          return view if view_sharding is None else jax.lax.with_sharding_constraint(
              view, view_sharding)
        k_run, v_run = tuple(map(gather, k_pools)), tuple(map(gather, v_pools))
      else:                          # the kernel reads the pools in place, every step
        k_run, v_run = k_pools, v_pools
      carry = dict(i=jnp.int32(0), k=k_run, v=v_run,
                   own_len=slots["own_len"], last=slots["last"], done=slots["done"], **out)

      def keep_going(c):
        return (c["i"] < segment) & jnp.any(~c["done"])

      def step(c):
        alive = ~c["done"]
        cache = (SlotKVCache(c["k"], c["v"], slots["prompt_len"], c["own_len"]) if views else
                 PagedKVCache(c["k"], c["v"], slots["page_table"], slots["prompt_len"],
                              c["own_len"]))
        logits, cache = model(c["last"][:, None], attention_mask=alive[:, None], cache=cache,
                              options=options)
        t = c["own_len"]                               # the token each slot samples now
        tokens, logp, hit_stop = decode.draw(logits[:, -1], seed, slots["row_ids"], t, alive,
                                             params)
        row = by_lane(jnp.where(alive, slots["out_row"], rows))
        col = by_lane(jnp.minimum(t, n_new - 1))
        write = lambda buf, new: lane_map(lambda b, r, k, x: b.at[r, k].set(x),
                                          buf, row, col, by_lane(new))
        return dict(c, i=c["i"] + 1, k=cache.k, v=cache.v, own_len=cache.own_len,
                    last=jnp.where(alive, tokens, c["last"]),
                    done=c["done"] | hit_stop | (cache.own_len >= n_new),
                    tokens=write(c["tokens"], tokens), logprobs=write(c["logprobs"], logp))

      c = jax.lax.while_loop(keep_going, step, carry)
      # Each slot's row of the outputs, so the host can score rows that stopped here
      # while the next segment runs (``listener.RolloutListener``).
      slot_tokens = lane_map(lambda b, r: b[r], c["tokens"], by_lane(slots["out_row"]))
      slot_tokens = slot_tokens.reshape(self.slots, n_new)
      if views:
        scatter = lambda pool, view: lane_map(scatter_slots, pool, table, by_lane(view))
        k_out = tuple(map(scatter, k_pools, c["k"]))
        v_out = tuple(map(scatter, v_pools, c["v"]))
      else:
        k_out, v_out = c["k"], c["v"]
      return ((k_out, v_out), dict(own_len=c["own_len"], last=c["last"], done=c["done"]),
              dict(tokens=c["tokens"], logprobs=c["logprobs"]), c["i"], slot_tokens)

    slot_specs, out_specs, pools = self._slot_specs(pages), self._out_specs(rows), \
        self._abstract_pools()
    inputs = (abstract_like(state), pools, slot_specs, out_specs, self._spec((), jnp.uint32))
    outputs = (pools, {k: slot_specs[k] for k in ("own_len", "last", "done")}, out_specs,
               self._spec((), jnp.int32), self._spec((self.slots, n_new), jnp.int32, ("data",)))
    return decode.lower(sampler_refill_segment, inputs, outputs, donate=(1, 3))

