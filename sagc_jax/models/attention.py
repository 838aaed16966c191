"""Attention kernels: dense, query-blocked (memory-efficient), one-query decode in plain
XLA, and the fused TPU kernel ``splash`` (``splash.py``).

All three compute grouped-query attention: query head ``h`` reads key/value head
``h // num_groups`` (transformers' ``repeat_kv``), scores and softmax in float32.

* ``dense``: one [B, KV, G, T, S] float32 score tensor. Simple, and the reference the
  others are tested against; at T = S = 2560 it is 25 MiB per row and query head
  (600 MiB per row for Llama-3.2-3B's 24 heads), which is why the learner cannot use
  it at scale.
* ``blocked``: the queries are cut into blocks of ``block`` rows; block ``i`` attends only
  to keys ``[0, (i + 1) * block)`` (the causal mask makes later keys irrelevant, so the
  FLOPs drop to about (n + 1) / 2n of dense), and each block is wrapped in
  ``jax.checkpoint`` so autodiff keeps only the block's inputs, never its [block, S]
  probabilities. Peak memory is O(block * S) instead of O(T * S), on every backend
  (the idea of FlashAttention, Dao et al. 2022, without the fused kernel). Real-token
  outputs equal ``dense`` up to float rounding; outputs at padding queries (rows with no
  visible key) differ and are meaningless in both.
* ``splash``: causal self-attention through JAX's Pallas splash kernel (``splash.py``),
  scores never leave on-chip memory; TPU only in practice (elsewhere it runs in Pallas'
  interpreter, for tests).
* decode (``decode_attend``): T = 1, keys and values in the cache's [B, KV, S, D] layout. ``einsum`` reads the bf16 cache directly with float32
  accumulation (``preferred_element_type``), the bandwidth-optimal form on TPU/GPU.
  ``reduce`` writes the two contractions as broadcast-multiply + reduce in float32, which
  XLA:CPU fuses into one pass over the cache; on TPU the float32 copy of the cache it
  implies triples the bytes moved. It was the CPU default while the sampler read a
  full-length cache every step; with the segmented sampler's span-sized caches
  ``einsum`` measured faster on XLA:CPU too (see ``Sampler``), so it is now opt-in.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from sagc_jax.models.splash import segment_ids_from_mask, splash_attend

__all__ = ["ATTENTION_KINDS", "DECODE_KINDS", "AttentionMask", "attend", "decode_attend"]

ATTENTION_KINDS = ("dense", "blocked", "splash")
DECODE_KINDS = ("reduce", "einsum")

_MASKED = float(jnp.finfo(jnp.float32).min)


class AttentionMask(NamedTuple):
  """What a query may see, without materialising [B, T, S]: key ``s`` is visible to
  query ``t`` iff ``key_valid[b, s]`` and ``s <= query_slots[t]`` and, for packed rows
  (``segment_ids`` given; self-attention only, query t is column t), key ``s`` belongs
  to query ``t``'s own sequence: attention never crosses packed sequences."""

  key_valid: jax.Array     # [B, S] bool
  query_slots: jax.Array   # [T] int32: the cache slot (or column) of each query
  segment_ids: jax.Array | None = None   # [B, S] int32, 0 = padding (packed rows)

  def dense(self) -> jax.Array:
    """[B, T, S] bool mask."""
    slots = jnp.arange(self.key_valid.shape[1])
    mask = self.key_valid[:, None, :] & (slots[None, None, :] <= self.query_slots[None, :, None])
    if self.segment_ids is not None:
      own = jnp.take(self.segment_ids, self.query_slots, axis=1)        # [B, T]
      mask = mask & (self.segment_ids[:, None, :] == own[:, :, None])
    return mask


def _dense(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
           num_groups: int) -> jax.Array:
  """q [B,T,H,D], k/v [B,S,KV,D], mask [B,T,S] -> [B,T,H,D]."""
  b, t, h, d = q.shape
  q = q.reshape(b, t, h // num_groups, num_groups, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = scores * (d ** -0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(b, t, h, d)


def _blocked(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, num_groups: int,
             block: int) -> jax.Array:
  """Causal self-attention (queries are the keys' own slots) in query blocks."""
  t = q.shape[1]
  if t <= block:
    return _dense(q, k, v, mask.dense(), num_groups)

  outs = []
  for lo in range(0, t, block):
    hi = min(lo + block, t)

    # Full k / v in, causal prefix sliced inside: autodiff saves the shared inputs
    # once, not one prefix copy per block.
    @jax.checkpoint
    def one_block(q_blk, k_all, v_all, valid_all, slots_blk, seg_all, hi=hi):
      blk_mask = AttentionMask(valid_all[:, :hi], slots_blk,
                               None if seg_all is None else seg_all[:, :hi]).dense()
      return _dense(q_blk, k_all[:, :hi], v_all[:, :hi], blk_mask, num_groups)

    outs.append(one_block(q[:, lo:hi], k, v, mask.key_valid, mask.query_slots[lo:hi],
                          mask.segment_ids))
  return jnp.concatenate(outs, axis=1)


def decode_attend(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array,
                  num_groups: int, kind: str = "einsum",
                  new_kv: tuple[jax.Array, jax.Array, jax.Array] | None = None) -> jax.Array:
  """Decode-step attention against a cache in its own layout.

  q [B,1,H,D]; k/v [B,KV,S,D] (the cache: heads before slots, so that the contraction
  over D and the weighted sum over S read it in place, without a transposing copy of
  the whole cache every step); key_mask [B,S] -> [B,1,H,D].

  ``new_kv = (k_new, v_new, valid_new)`` ([B,KV,1,D], [B,KV,1,D], [B]): one more key,
  the step's own, attended to next to the cache (the softmax runs over both). The
  caller then passes the cache *before* the step's write, so the write is a separate,
  in-place update of one slot: when the attention reads the updated cache instead,
  XLA:TPU stages each layer's whole cache through on-chip memory to apply the update
  and writes all of it back, doubling the cache bytes a decode step moves.
  """
  b, _, h, d = q.shape
  qg = q.reshape(b, h // num_groups, num_groups, d)

  def scores_of(keys, valid):                   # -> [B, KV, G, S] float32, masked
    if kind == "einsum":
      sc = jnp.einsum("bkgd,bksd->bkgs", qg, keys, preferred_element_type=jnp.float32)
    else:
      sc = jnp.sum(qg.astype(jnp.float32)[:, :, None] * keys.astype(jnp.float32)[:, :, :, None],
                   axis=-1).swapaxes(2, 3)
    return jnp.where(valid[:, None, None, :], sc * (d ** -0.5), _MASKED)

  def weighted(probs, values):                  # [B, KV, G, S] x [B, KV, S, D] -> f32
    if kind == "einsum":
      return jnp.einsum("bkgs,bksd->bkgd", probs.astype(values.dtype), values,
                        preferred_element_type=jnp.float32)
    return jnp.sum(probs[..., None] * values.astype(jnp.float32)[:, :, None], axis=3)

  scores = scores_of(k, key_mask)
  if new_kv is None:
    out = weighted(jax.nn.softmax(scores, axis=-1), v)
  else:
    k_new, v_new, valid_new = new_kv
    probs = jax.nn.softmax(jnp.concatenate([scores, scores_of(k_new, valid_new[:, None])],
                                           axis=-1), axis=-1)
    out = weighted(probs[..., :-1], v) + weighted(probs[..., -1:], v_new)
  return out.reshape(b, 1, h, d).astype(v.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, num_groups: int, *,
           kind: str = "dense", block: int = 512, decode_kind: str = "reduce",
           mesh: Mesh | None = None) -> jax.Array:
  """Grouped-query attention. q [B,T,H,D], k/v [B,S,KV,D] -> [B,T,H,D].

  ``kind`` applies to multi-token self-attention (training forward, prefill; the
  queries are then the keys' own slots 0..T-1); a one-token call uses ``decode_kind``
  (``decode_attend``). ``mesh``: where ``splash`` shards its per-device kernel.
  """
  if q.shape[1] == 1:
    return decode_attend(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask.dense()[:, 0],
                         num_groups, decode_kind)
  if kind == "splash" and k.shape[1] == q.shape[1]:
    segments = (segment_ids_from_mask(mask.key_valid) if mask.segment_ids is None
                else mask.segment_ids)
    return splash_attend(q, k, v, segments, num_groups, mesh=mesh, block=block)
  if kind == "blocked" and k.shape[1] == q.shape[1]:
    return _blocked(q, k, v, mask, num_groups, block)
  return _dense(q, k, v, mask.dense(), num_groups)
