"""A paged KV cache: per-layer pools of fixed-size pages and a page table per decode slot.

The dense cache (``kv_cache.py``) gives every row of a call ``prompt + max_new`` slots,
so its memory is rows x the longest allowed response whatever the responses do, and
rows cannot change within a call. Here the keys and values of every layer live in a
pool of ``num_pages`` pages of ``page_size`` tokens, ``[num_kv_heads, num_pages,
page_size, head_dim]`` (the layout of JAX's Pallas TPU kernel
``jax.experimental.pallas.ops.tpu.paged_attention``), and a decode *slot* reads the
pages its row of the page table names (vLLM's PagedAttention, Kwon et al. 2023). Pages
are handed out and taken back on the host (``sampling.refill_schedule.PagePool``), between
decode segments, so the memory a step holds follows its live tokens, and a slot whose
row finished can take a queued row (``sampling.refill``).

Logical layout of a slot's sequence. Logical token ``j`` is in page
``page_table[s, j // page_size]`` at offset ``j % page_size``:

  * ``[0, prompt_len)``: the prompt's keys except its last token's. Its whole pages
    are shared read-only by the G rows of the prompt (prefilled once); a partial last
    page is copied into each row's first own page when the row starts (copy on
    write), so every slot's sequence is contiguous, as the Pallas kernel requires;
  * ``prompt_len + i``: the row's own i-th key: i = 0 is the prompt's last token, fed
    by the first decode step (whose logits give response token 0), i >= 1 is response
    token i - 1.

A decode step writes its input token's key at ``prompt_len + own_len``, then attends
to the ``prompt_len + own_len + 1`` keys ``[0, prompt_len + own_len]`` (the written
cache, as ``decode_cache_read="after_write"``). Page 0 is the scratch page: never
handed out, it takes the writes of slots that are not running and fills unused page
table entries, whose keys are never valid.

Attention paths: ``"pallas"`` calls the TPU kernel on the pools every step, reading
only the pages a slot fills (per device, inside ``jax.shard_map``, on a mesh;
``"reference"`` runs the kernel's contract in XLA in its place, for tests). ``"xla"`` (every backend) works on a *slot view*
(``SlotKVCache``): the refill sampler gathers each slot's W pages into a contiguous
[S, KV, W * page, D] array once per decode segment, decodes the segment against it
(``slot_decode_attend``: per-slot writes, ``attention.decode_attend`` reads), and
scatters it back into the pages. Gathering the pages every step instead
(``paged_decode_attend`` with ``kernel="xla"``, the reference the others are tested
against) copies W pages per slot, layer and step, which on XLA:CPU made a step cost
several dense steps (docs/results.md, "Decoding choices on XLA:CPU").
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from sagc_jax.models.attention import decode_attend
from sagc_jax.models.config import ModelConfig

__all__ = ["PAGED_KERNELS", "POOL_AXES", "SCRATCH_PAGE", "PagedKVCache", "SlotKVCache",
           "gather_slots", "paged_decode_attend", "pool_shape", "reference_paged_attention",
           "repeat_heads", "scatter_slots",
           "slot_decode_attend"]

PAGED_KERNELS = ("xla", "pallas", "reference")
SCRATCH_PAGE = 0
# Mesh axes of a refill decoder's pools, [lanes, KV, num_pages, page_size, D]: one
# lane (its slots and its own pages) per 'data' shard, KV heads on 'model'.
POOL_AXES = ("data", "model", None, None, None)


class PagedKVCache(NamedTuple):
  """The pools and one decode call's view of them (a pytree).

  ``k[i]``, ``v[i]``: layer i's pools, one per lane [L, KV, num_pages, page_size, D];
  ``page_table`` [S, W] int32 lane-local physical pages of each slot's first W
  logical pages (slot s is in lane s // (S / L); the rest of a slot's pages are not
  read by this call); ``prompt_len`` [S] int32 shared-prompt keys
  of each slot; ``own_len`` [S] int32 own keys written so far (the response tokens
  sampled so far: see the module docstring).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  page_table: jax.Array
  prompt_len: jax.Array
  own_len: jax.Array

  @property
  def page_size(self) -> int:
    return self.k[0].shape[3]

  @property
  def num_pages(self) -> int:
    return self.k[0].shape[2]

  @property
  def positions(self) -> jax.Array:
    """[S] RoPE position of each slot's next input token (its logical index: the
    shared prompt is the row's own first ``prompt_len`` tokens)."""
    return self.prompt_len + self.own_len


class SlotKVCache(NamedTuple):
  """Each slot's pages gathered into one contiguous view (``gather_slots``): ``k[i]``,
  ``v[i]`` [S, KV, W * page, D], the dense cache's layout; ``prompt_len`` and
  ``own_len`` as in ``PagedKVCache`` (logical index = slot position in the view)."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  prompt_len: jax.Array
  own_len: jax.Array

  @property
  def positions(self) -> jax.Array:
    return self.prompt_len + self.own_len


def pool_shape(cfg: ModelConfig, num_pages: int, page_size: int, kv_repeats: int = 1
               ) -> tuple[int, int, int, int]:
  """One lane's pool of one layer: [KV x kv_repeats, pages, page, D] (``kv_repeats``
  copies of each KV head make the heads divide the 'model' axis: ``splash.kv_repeats``)."""
  return (cfg.num_kv_heads * kv_repeats, num_pages, page_size, cfg.head_dim)


def repeat_heads(new: jax.Array, heads: int, axis: int) -> jax.Array:
  """``new``'s KV heads (on ``axis``) copied to ``heads``: head j holds head j // r, so
  query head h still reads a copy of its KV head h // groups."""
  r = heads // new.shape[axis]
  return new if r == 1 else jnp.repeat(new, r, axis=axis)


def _write(pool: jax.Array, page: jax.Array, offset: jax.Array, new: jax.Array) -> jax.Array:
  """``pool`` [KV, P, page, D] with ``new`` [S, KV, D] written at (page[s], offset[s]).

  One scatter of S x KV vectors of D, the KV head an index rather than a window
  dimension: with [KV, D] windows XLA:TPU lays the pool out KV-minor for the write and
  copies all of it into the Pallas kernel's layout in every step (v5e AOT: a full
  pool copy per layer and step; none this way)."""
  s, kv, d = new.shape
  heads = jnp.tile(jnp.arange(kv), s)
  return pool.at[heads, jnp.repeat(page, kv), jnp.repeat(offset, kv)].set(
      new.reshape(s * kv, d).astype(pool.dtype))


def gather_slots(pool: jax.Array, page_table: jax.Array) -> jax.Array:
  """The slots' pages, contiguous: [KV, P, page, D] x [S, W] -> [S, KV, W * page, D]."""
  kv, _, page, d = pool.shape
  s, w = page_table.shape
  return pool[:, page_table].swapaxes(0, 1).reshape(s, kv, w * page, d)


def scatter_slots(pool: jax.Array, page_table: jax.Array, view: jax.Array) -> jax.Array:
  """``gather_slots`` undone: the view's pages written back to ``pool``. Shared prompt
  pages get back the values they hold (several slots write the same ones); scratch
  entries take garbage, never read as valid."""
  kv, _, page, d = pool.shape
  s, w = page_table.shape
  return pool.at[:, page_table].set(view.reshape(s, kv, w, page, d).swapaxes(0, 1))


def slot_decode_attend(q: jax.Array, k_new: jax.Array, v_new: jax.Array,
                       views: tuple[jax.Array, jax.Array], cache: SlotKVCache,
                       alive: jax.Array, num_groups: int, *, decode_kind: str = "einsum"
                       ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """``paged_decode_attend`` on slot views: each running slot writes its key and value
  at its logical index (stopped slots write nothing) and attends to keys
  ``[0, logical]`` of its own view, read in place."""
  view_heads, length = views[0].shape[1], views[0].shape[2]
  num_groups = num_groups * k_new.shape[2] // view_heads      # per (repeated) view head
  k_new, v_new = repeat_heads(k_new, view_heads, 2), repeat_heads(v_new, view_heads, 2)
  logical = cache.prompt_len + cache.own_len
  at = jnp.where(alive, logical, length)                       # out of range: dropped
  # Batched over slots (a scatter with the slot as its batch dimension): slots sharded
  # over the mesh write locally.
  write = lambda view, new: jax.vmap(
      lambda v, i, x: v.at[:, i].set(x.astype(v.dtype), mode="drop"))(view, at, new[:, 0])
  k_view, v_view = write(views[0], k_new), write(views[1], v_new)
  valid = jnp.arange(length)[None, :] <= logical[:, None]
  out = decode_attend(q, k_view.astype(q.dtype), v_view.astype(q.dtype), valid, num_groups,
                      decode_kind)
  return out, (k_view, v_view)


def reference_paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                              lengths: jax.Array, page_indices: jax.Array) -> jax.Array:
  """The Pallas kernel's contract (``paged_attention``) in XLA: q [B, H, D], already
  scaled; pages [KV, P, page, D]; attends to keys ``[0, lengths[b])`` of each row's
  pages. ``kernel="reference"`` runs it where the kernel would, under the same
  ``shard_map``, so the sharded wiring is tested on any backend."""
  b, h, d = q.shape
  keys, values = gather_slots(k_pages, page_indices), gather_slots(v_pages, page_indices)
  kv, t = keys.shape[1], keys.shape[2]
  scores = jnp.einsum("bkgd,bktd->bkgt", q.reshape(b, kv, h // kv, d).astype(jnp.float32),
                      keys.astype(jnp.float32))
  valid = jnp.arange(t)[None, :] < lengths[:, None]
  scores = jnp.where(valid[:, None, None], scores, -jnp.inf)
  out = jnp.einsum("bkgt,bktd->bkgd", jax.nn.softmax(scores, axis=-1),
                   values.astype(jnp.float32))
  return out.reshape(b, h, d)


def _kernel(kernel: str, q, k_pages, v_pages, lengths, page_indices):
  if kernel == "reference":
    return reference_paged_attention(q, k_pages, v_pages, lengths, page_indices)
  from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

  w = page_indices.shape[1]
  block = max(b for b in (8, 4, 2, 1) if w % b == 0)      # must divide W
  return paged_attention(q, k_pages, v_pages, lengths, page_indices,
                         pages_per_compute_block=block)


def _lanes_kernel(kernel: str, q, k_pool, v_pool, lengths, page_table, mesh):
  """The per-device kernel over lane-leading pools: inside ``jax.shard_map`` on a mesh
  (lanes on 'data', query and KV heads on 'model' where they divide it; the refill
  decoder repeats KV heads until they do, ``pool_shape``)."""
  lanes = k_pool.shape[0]
  if mesh is None or mesh.size == 1:
    return _kernel(kernel, q, k_pool[0], v_pool[0], lengths, page_table)
  if lanes != mesh.shape.get("data", 1):
    raise ValueError(f"paged kernel: {lanes} lanes on a mesh whose 'data' axis is "
                     f"{mesh.shape.get('data', 1)}")
  data = "data" if "data" in mesh.shape else None
  ways = mesh.shape.get("model", 1)
  heads, kv_heads = q.shape[1], k_pool.shape[1]
  split = ways > 1 and heads % ways == 0
  if split and kv_heads % ways:
    raise ValueError(f"paged kernel: {kv_heads} KV heads do not divide the {ways}-way "
                     "'model' axis (repeat them: pool_shape(kv_repeats=...))")
  axis = "model" if split else None

  def per_device(q, k, v, lengths, table):
    return _kernel(kernel, q, k[0], v[0], lengths, table)

  pool_spec = P(data, axis, None, None, None)
  return jax.shard_map(per_device, mesh=mesh,
                       in_specs=(P(data, axis, None), pool_spec, pool_spec, P(data),
                                 P(data, None)),
                       out_specs=P(data, axis, None), check_vma=False)(
      q, k_pool, v_pool, lengths, page_table)


def paged_decode_attend(q: jax.Array, k_new: jax.Array, v_new: jax.Array,
                        pools: tuple[jax.Array, jax.Array], cache: PagedKVCache,
                        alive: jax.Array, num_groups: int, *, kernel: str = "xla",
                        decode_kind: str = "einsum", mesh: Mesh | None = None
                        ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """One decode step of one layer: writes each running slot's key and value, attends.

  q [S, 1, H, D]; k_new / v_new [S, 1, KV, D]; ``pools`` this layer's (k, v) pools,
  lane-leading [L, KV, P, page, D] (slot s is in lane s // (S / L); its page table row
  holds lane-local page ids); ``alive`` [S] bool (other slots write to the scratch page
  and their output is meaningless). ``kernel``: ``"xla"`` gathers the pages (the
  reference), ``"pallas"`` calls the TPU kernel, per device on ``mesh``,
  ``"reference"`` the kernel's contract in XLA in its place. Returns (attention
  output [S, 1, H, D], updated pools).
  """
  if kernel not in PAGED_KERNELS:
    raise ValueError(f"paged attention kernel={kernel!r} is not one of {PAGED_KERNELS}")
  lanes, pool_heads, page_size = pools[0].shape[0], pools[0].shape[1], pools[0].shape[3]
  num_groups = num_groups * k_new.shape[2] // pool_heads      # per (repeated) pool head
  k_new, v_new = repeat_heads(k_new, pool_heads, 2), repeat_heads(v_new, pool_heads, 2)
  s, w = cache.page_table.shape
  by_lane = lambda x: x.reshape((lanes, -1) + x.shape[1:])
  logical = cache.prompt_len + cache.own_len                       # [S] the write index
  column = jnp.minimum(logical // page_size, w - 1)
  page = jnp.take_along_axis(cache.page_table, column[:, None], axis=1)[:, 0]
  page = jnp.where(alive, page, SCRATCH_PAGE)
  offset = logical % page_size
  write = lambda pool, new: jax.vmap(_write)(pool, by_lane(page), by_lane(offset),
                                             by_lane(new[:, 0]))
  k_pool, v_pool = write(pools[0], k_new), write(pools[1], v_new)
  lengths = logical + 1                                          # keys [0, logical]
  if kernel != "xla":
    # The kernel scales nothing: the scores' 1/sqrt(D) is applied to the queries.
    scaled = (q[:, 0] * (q.shape[-1] ** -0.5)).astype(k_pool.dtype)
    out = _lanes_kernel(kernel, scaled, k_pool, v_pool, jnp.where(alive, lengths, 1),
                        cache.page_table, mesh)
    return out[:, None].astype(q.dtype), (k_pool, v_pool)
  table = by_lane(cache.page_table)
  gather = lambda pool: jax.vmap(gather_slots)(pool, table).reshape(
      (s,) + (pool.shape[1], w * page_size, pool.shape[4]))
  keys, values = gather(k_pool), gather(v_pool)
  valid = jnp.arange(w * page_size)[None, :] < lengths[:, None]
  out = decode_attend(q, keys.astype(q.dtype), values.astype(q.dtype), valid, num_groups,
                      decode_kind)
  return out, (k_pool, v_pool)
