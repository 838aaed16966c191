"""Fused causal attention on TPU: JAX's Pallas splash-attention kernel, sharded.

Why. The learner's query-blocked attention (``attention.py``) keeps memory at
O(block x T) but still writes every block's float32 scores to HBM and reads them
back, forward and backward; at the 3B presets' size (T = 2560) that traffic makes a
learner microbatch bandwidth-bound, well above its compute time (docs/results.md,
"AOT: splash vs query-blocked attention").
A fused flash-style kernel (Dao et al. 2022; splash = "sparse flash", JAX's
``jax.experimental.pallas.ops.tpu.splash_attention``) keeps scores in on-chip memory:
HBM traffic is the q/k/v/o tiles only, and fully masked (above-diagonal) tiles are
skipped, so the causal half costs nothing.

What. ``splash_attend`` computes exactly what ``attention._dense`` computes for
self-attention (query slot t sees key slots s <= t whose segment equals its own) with
float32 softmax statistics inside the kernel. The mask is the kernel's static causal
mask and-ed with *segment ids*: today a row's real tokens are segment 1 and its left
padding segment 0 (a real query never sees padding; padding queries see padding,
their outputs are discarded as with every other kind), and packed sequences (several
segments per row) use the same argument.

How it is sharded. Pallas kernels are per-device programs, so the call runs inside
``jax.shard_map``: rows on ``'data'`` and heads on ``'model'`` when they divide, the
layout the projections already produce, so no activation is resharded. When the KV
heads do not divide the ``'model'`` axis (Qwen2.5-3B: 2 KV heads, 4-way axis) each KV
head is repeated just enough times that they do (grouped-query attention is unchanged:
query head h still reads a copy of KV head h // groups).

Off TPU the same kernel runs in Pallas' interpreter, which is how the CPU tests check
it against the dense reference; it is slow there and meant only for tests.

XLA's cost analysis cannot see inside the kernel (it counts a custom call as almost
free), so ``kernel_cost`` gives the analytic FLOPs and HBM bytes the AOT report adds.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

__all__ = ["LANES", "head_layout", "kernel_cost", "kv_repeats", "segment_ids_from_mask",
           "splash_attend", "splash_block"]

LANES = 128   # TPU vector lanes: the kernel's tiles are multiples of this


def splash_block(seq_len: int, block: int) -> int:
  """Tile size for a sequence: ``block`` rounded to the lane width, capped at the
  sequence length rounded up (a short sequence is one tile)."""
  block = max(LANES, -(-block // LANES) * LANES)
  return min(block, -(-seq_len // LANES) * LANES)


def kv_repeats(num_heads: int, num_kv_heads: int, model_ways: int) -> int:
  """How many copies of each KV head make the KV heads divide the 'model' axis while
  the query heads still cover whole groups (1 when they already divide)."""
  if model_ways <= 1 or num_kv_heads % model_ways == 0:
    return 1
  r = math.lcm(num_kv_heads, model_ways) // num_kv_heads
  if num_heads % (num_kv_heads * r):
    raise ValueError(f"splash attention: {num_heads} query heads and {num_kv_heads} KV heads "
                     f"cannot be split over a {model_ways}-way 'model' axis")
  return r


def head_layout(num_heads: int, num_kv_heads: int, model_ways: int) -> tuple[str | None, int]:
  """(mesh axis of the heads, copies of each KV head) of a splash call: heads on 'model'
  when the query heads divide it, the KV heads repeated until they do too. The AOT
  cost model uses the same decision."""
  if model_ways > 1 and num_heads % model_ways == 0:
    return "model", kv_repeats(num_heads, num_kv_heads, model_ways)
  return None, 1


@functools.lru_cache(maxsize=32)
def _kernel(seq_len: int, local_heads: int, block: int, interpret: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as kernel_lib, splash_attention_mask as mask_lib)
  mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq_len, seq_len))] * local_heads)
  sizes = kernel_lib.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block,
      block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
      block_q_dq=block, block_kv_dq=block)
  # Built concretely even when first asked for inside a trace: the mask metadata are
  # constants of every program that uses the kernel, and the cache outlives traces.
  with jax.ensure_compile_time_eval():
    kernel = kernel_lib.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                        interpret=interpret)
  return kernel_lib, kernel


def _on_tpu(mesh: Mesh | None) -> bool:
  if mesh is not None:
    return mesh.devices.flat[0].platform == "tpu"
  return jax.default_backend() == "tpu"


def splash_attend(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array,
                  num_groups: int, *, mesh: Mesh | None = None, block: int = 512) -> jax.Array:
  """Causal grouped-query self-attention through the splash kernel.

  q [B, T, H, D], k / v [B, T, KV, D] (H = KV * num_groups), segment_ids [B, T] int
  (a query sees earlier-or-same slots of its own segment) -> [B, T, H, D] in q's dtype.
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  if h != kv_heads * num_groups:
    raise ValueError(f"splash attention: {h} query heads != {kv_heads} KV heads x {num_groups}")
  model_ways = 1 if mesh is None else mesh.shape.get("model", 1)
  data_ways = 1 if mesh is None else mesh.shape.get("data", 1)
  heads_axis, repeats = head_layout(h, kv_heads, model_ways)
  if repeats > 1:
    k, v = jnp.repeat(k, repeats, axis=2), jnp.repeat(v, repeats, axis=2)
  rows_axis = "data" if data_ways > 1 and b % data_ways == 0 else None

  tile = splash_block(t, block)
  padded = -(-t // tile) * tile
  segment_ids = segment_ids.astype(jnp.int32)
  if padded != t:          # extra slots after the last: segment -1, seen by nobody real
    pad = ((0, 0), (0, padded - t), (0, 0), (0, 0))
    q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    segment_ids = jnp.pad(segment_ids, ((0, 0), (0, padded - t)), constant_values=-1)
  local_heads = h // (model_ways if heads_axis else 1)
  kernel_lib, kernel = _kernel(padded, local_heads, tile, not _on_tpu(mesh))
  scale = d ** -0.5

  def per_device(q, k, v, seg):
    def one_row(q, k, v, seg):          # the kernel takes [heads, T, D]
      out = kernel(q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1),
                   segment_ids=kernel_lib.SegmentIds(q=seg, kv=seg))
      return out.swapaxes(0, 1)
    return jax.vmap(one_row)((q * scale).astype(q.dtype), k, v, seg)

  if mesh is None:
    out = per_device(q, k, v, segment_ids)
  else:
    spec = P(rows_axis, None, heads_axis, None)
    out = jax.shard_map(per_device, mesh=mesh, in_specs=(spec, spec, spec, P(rows_axis, None)),
                        out_specs=spec, check_vma=False)(q, k, v, segment_ids)
  return out[:, :t]


def kernel_cost(*, rows: int, seq_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                block: int, itemsize: int, backward: bool, recompute_forward: bool,
                devices: int) -> dict[str, float]:
  """Analytic FLOPs and HBM bytes per device of one causal ``splash_attend`` call.

  Only tiles on or below the diagonal are computed: with n = T / tile tiles per side,
  n (n + 1) / 2 of n^2. Forward: two matmuls per tile (q k^T and p v), 2 * tile^2 * D
  FLOPs each per head; backward: five (recomputed scores, dv, dp, dq, dk). Bytes: each
  query tile is read once and its output written once; each visited key/value tile is
  read once per query tile that visits it (the kernel streams k/v from HBM), and in the
  backward the same streams plus dq, dk, dv writes. ``recompute_forward`` adds one more
  forward (per-layer remat). The total divides evenly over ``devices`` (rows and heads
  are sharded, nothing is replicated).
  """
  tile = splash_block(seq_len, block)
  n = -(-seq_len // tile)
  tiles = n * (n + 1) / 2
  fwd_flops = rows * num_heads * tiles * 4 * tile * tile * head_dim
  q_bytes = rows * num_heads * n * tile * head_dim * itemsize          # q (or o, do, dq)
  kv_stream = rows * num_heads * tiles * 2 * tile * head_dim * itemsize  # k + v per visit
  kv_bytes = rows * num_kv_heads * n * tile * head_dim * itemsize        # k (or v, dk, dv)
  fwd_bytes = 2 * q_bytes + kv_stream
  flops, nbytes = fwd_flops, fwd_bytes
  if recompute_forward:
    flops, nbytes = flops + fwd_flops, nbytes + fwd_bytes
  if backward:
    flops += 2.5 * fwd_flops
    nbytes += 4 * q_bytes + 2 * kv_stream + 2 * kv_bytes
  return dict(flops=flops / devices, bytes=nbytes / devices)


def segment_ids_from_mask(key_valid: jax.Array) -> jax.Array:
  """Segment ids of left-padded rows: 1 for real tokens, 0 for padding."""
  return jnp.asarray(key_valid).astype(jnp.int32)

