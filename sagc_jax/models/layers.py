"""The decoder's layers and the options of a forward pass through them.

``ForwardOptions`` says how a pass is computed (attention kind, cache read order,
remat, layouts), never what: the layers below read it, ``transformer.Transformer``
stacks them. Module and parameter names mirror the HF checkpoint names
(``layers.3.self_attn.q_proj``) so the HF <-> nnx mapping in ``hf_io`` is mechanical:
a ``kernel`` is the transpose of HF's ``weight`` (we store [in, out]).

Sharding: parameters carry ``out_sharding`` annotations in mesh-axis names, with
attention heads, MLP hidden units and vocabulary rows on ``'model'`` (Megatron style:
column-parallel q/k/v/gate/up, row-parallel o/down).

Numerics follow transformers: RMSNorm in float32 then cast back, softmax in float32,
RoPE tables in float32 cast to the activation dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sagc_jax.models.attention import (ATTENTION_KINDS, DECODE_KINDS, AttentionMask, attend,
                                       decode_attend)
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.paged_cache import (PAGED_KERNELS, PagedKVCache, SlotKVCache,
                                         paged_decode_attend, slot_decode_attend)
from sagc_jax.models.rope import apply_rope

__all__ = ["Attention", "DecoderLayer", "Embed", "ForwardOptions", "Linear", "MLP", "RMSNorm",
           "decode_cache_read_for"]

REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
DECODE_CACHE_READS = ("before_write", "after_write")


@dataclasses.dataclass(frozen=True)
class ForwardOptions:
  """How a forward pass is computed (never what it computes): static, hashable.

  Attributes:
    attention: ``"dense"``, ``"blocked"`` (query blocks of ``attention_block``, see
      ``attention.py``) or ``"splash"`` (fused TPU kernel, ``splash.py``) for
      multi-token calls.
    attention_block: query block size of ``"blocked"``, tile size of ``"splash"``.
    decode_attention: one-token (decode) attention, ``"reduce"`` (XLA:CPU) or
      ``"einsum"`` (bf16 cache reads with float32 accumulation, TPU/GPU).
    decode_cache_read: which cache a decode step's attention reads. ``"before_write"``:
      the cache before the step's one-slot write, plus the step's own key and value
      (``decode_attend``'s ``new_kv``); XLA:TPU then keeps the write in place, where
      reading the written cache made it stage and rewrite whole layer caches
      (docs/results.md, "Decode-step HBM traffic"). ``"after_write"``:
      the written cache; XLA:CPU keeps *this* order in place, and copies every
      layer's cache twice per step for ``"before_write"`` (the old value is read
      while the loop carries the new one). ``Sampler`` picks by its devices'
      platform (``decode_cache_read_for``).
    remat: per-layer rematerialisation: ``"none"``, ``"full"`` (keep only each layer's
      input) or a ``jax.checkpoint_policies`` name that also keeps matmul outputs.
    scan_layers: run the (cache-free) layer stack as one ``lax.scan`` over stacked
      layer weights, so compile time does not grow with depth. Cached (sampling) calls
      always unroll.
    kv_sharding: optional sharding of each layer's cache, applied to the new keys and
      values and, with ``query_sharding``, to the decode queries and outputs, so that a
      layout other than "KV heads on 'model'" (e.g. rows over every chip when the KV
      heads do not divide the 'model' axis) never gathers the cache.
    query_sharding: sharding of [B, T, H, D] queries matching ``kv_sharding``.
    head_sharding: the projections' own [B, T, H, D] layout (heads on 'model'). With
      ``query_sharding``, queries are pinned to it first and attention outputs are
      returned to it, so XLA reshards the small activations (all-to-all) instead of
      gathering the q / o projection weights every decode step.
    mesh: the mesh ``"splash"`` shards its per-device kernel over (None: one device).
    row_sharding: layout of the residual stream [B, T, hidden] pinned at every layer's
      input and output in cache-free (training) calls, rows on 'data'. Without it,
      XLA's propagation may keep activations whole on every 'data' shard and gather
      them, where FSDP means gathering the (smaller, per-layer) weights instead.
    paged_kernel: decode attention over a ``PagedKVCache``: ``"xla"`` (gather the
      slot's pages, every backend) or ``"pallas"`` (JAX's TPU paged-attention kernel).
  """
  attention: str = "dense"
  attention_block: int = 512
  decode_attention: str = "reduce"
  decode_cache_read: str = "before_write"
  remat: str = "none"
  scan_layers: bool = False
  kv_sharding: Any = None
  query_sharding: Any = None
  head_sharding: Any = None
  mesh: Any = None
  row_sharding: Any = None
  paged_kernel: str = "xla"

  def __post_init__(self):
    if self.attention not in ATTENTION_KINDS:
      raise ValueError(f"attention={self.attention!r} is not one of {ATTENTION_KINDS}")
    if self.decode_attention not in DECODE_KINDS:
      raise ValueError(f"decode_attention={self.decode_attention!r} is not one of "
                       f"{DECODE_KINDS}")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"remat={self.remat!r} is not one of {REMAT_POLICIES}")
    if self.paged_kernel not in PAGED_KERNELS:
      raise ValueError(f"paged_kernel={self.paged_kernel!r} is not one of {PAGED_KERNELS}")
    if self.decode_cache_read not in DECODE_CACHE_READS:
      raise ValueError(f"decode_cache_read={self.decode_cache_read!r} is not one of "
                       f"{DECODE_CACHE_READS}")
    if (isinstance(self.attention_block, bool) or not isinstance(self.attention_block, int)
        or self.attention_block <= 0):
      raise ValueError(f"attention_block={self.attention_block!r} must be a positive int")


def decode_cache_read_for(platform: str) -> str:
  """The ``decode_cache_read`` whose one-slot cache write XLA keeps in place on
  ``platform`` (measured on XLA:TPU, v5e AOT, and XLA:CPU; GPU follows CPU, unmeasured)."""
  return "before_write" if platform == "tpu" else "after_write"


def constrain(x: jax.Array, sharding: Any) -> jax.Array:
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


class Linear(nnx.Module):
  """Dense layer with kernel [in, out] (HF stores the transpose) and optional bias."""

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool,
               axes: tuple[str | None, str | None], dtype: jnp.dtype, std: float,
               rngs: nnx.Rngs):
    init = nnx.initializers.normal(std)
    self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features), dtype),
                            out_sharding=axes, init="normal")
    self.bias = (nnx.Param(jnp.zeros((out_features,), dtype), out_sharding=(axes[1],),
                           init="zeros")
                 if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = jnp.dot(x, self.kernel[...])
    if self.bias is not None:
      y = y + self.bias[...]
    return y


class RMSNorm(nnx.Module):
  """``weight * x / rms(x)``, normalised in float32 and cast back like transformers."""

  def __init__(self, dim: int, *, eps: float, dtype: jnp.dtype):
    self.weight = nnx.Param(jnp.ones((dim,), dtype), out_sharding=(None,), init="ones")
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return self.weight[...] * xf.astype(x.dtype)


class Embed(nnx.Module):
  """Token embedding table [vocab, hidden], vocabulary rows sharded on 'model'."""

  def __init__(self, vocab: int, dim: int, *, dtype: jnp.dtype, std: float, rngs: nnx.Rngs):
    init = nnx.initializers.normal(std)
    self.weight = nnx.Param(init(rngs.params(), (vocab, dim), dtype),
                            out_sharding=("model", None), init="normal")

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.weight[...], ids, axis=0)


class Attention(nnx.Module):
  """Self-attention with GQA, RoPE, optional q/k/v/o biases and Qwen3 q/k norms."""

  def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, std: float, rngs: nnx.Rngs):
    hd = cfg.head_dim
    column = dict(use_bias=cfg.qkv_bias, axes=(None, "model"), dtype=dtype, std=std, rngs=rngs)
    self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * hd, **column)
    self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * hd, **column)
    self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * hd, **column)
    self.o_proj = Linear(cfg.num_heads * hd, cfg.hidden_size, use_bias=cfg.o_bias,
                         axes=("model", None), dtype=dtype, std=std, rngs=rngs)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(hd, eps=cfg.rms_norm_eps, dtype=dtype)
      self.k_norm = RMSNorm(hd, eps=cfg.rms_norm_eps, dtype=dtype)
    else:
      self.q_norm = self.k_norm = None
    self.head_dim = hd
    self.num_groups = cfg.num_groups

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: AttentionMask,
               kv: tuple[jax.Array, jax.Array] | None, index: jax.Array | None,
               options: ForwardOptions, fresh_cache: bool = False,
               paged: tuple[PagedKVCache, jax.Array] | None = None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """``paged = (cache, alive)``: a one-token decode step against a paged cache,
    ``kv`` this layer's (k, v) pools (``models.paged_cache``)."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, -1, self.head_dim)
    k = self.k_proj(x).reshape(b, t, -1, self.head_dim)
    v = self.v_proj(x).reshape(b, t, -1, self.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if paged is not None:
      if isinstance(paged[0], SlotKVCache):
        out, kv = slot_decode_attend(q, k, v, kv, paged[0], paged[1], self.num_groups,
                                     decode_kind=options.decode_attention)
      else:
        out, kv = paged_decode_attend(q, k, v, kv, paged[0], paged[1], self.num_groups,
                                      kernel=options.paged_kernel,
                                      decode_kind=options.decode_attention,
                                      mesh=options.mesh)
      return self.o_proj(out.reshape(b, t, -1)), kv
    if kv is None:
      out = attend(q, k, v, mask, self.num_groups, kind=options.attention,
                   block=options.attention_block, decode_kind=options.decode_attention,
                   mesh=options.mesh)
      return self.o_proj(out.reshape(b, t, -1)), None
    # The cache is [B, KV, S, D]: new keys/values are written heads-major.
    start = (0, 0, index, 0)
    k_new = constrain(k.swapaxes(1, 2).astype(kv[0].dtype), options.kv_sharding)
    v_new = constrain(v.swapaxes(1, 2).astype(kv[1].dtype), options.kv_sharding)
    old_kv = kv
    kv = (jax.lax.dynamic_update_slice(kv[0], k_new, start),
          jax.lax.dynamic_update_slice(kv[1], v_new, start))
    if fresh_cache:
      # Prefill into an empty cache: the T new tokens see only each other, so the
      # attention is self-attention over them (and may be query-blocked).
      mask = AttentionMask(mask.key_valid[:, :t], mask.query_slots)
      out = attend(q, k, v, mask, self.num_groups, kind=options.attention,
                   block=options.attention_block, decode_kind=options.decode_attention,
                   mesh=options.mesh)
    elif t == 1:
      # Which cache the step reads decides whether XLA keeps the one-slot write in
      # place, and the answer differs by backend (``ForwardOptions.decode_cache_read``).
      q = constrain(constrain(q, options.head_sharding), options.query_sharding)
      if options.decode_cache_read == "before_write":
        slots = jnp.arange(mask.key_valid.shape[1])
        old_valid = mask.key_valid & (slots != index)[None, :]
        new_valid = jax.lax.dynamic_index_in_dim(mask.key_valid, index, axis=1,
                                                 keepdims=False)
        out = decode_attend(q, old_kv[0].astype(q.dtype), old_kv[1].astype(q.dtype),
                            old_valid, self.num_groups, options.decode_attention,
                            new_kv=(k_new.astype(q.dtype), v_new.astype(q.dtype), new_valid))
      else:
        out = decode_attend(q, kv[0].astype(q.dtype), kv[1].astype(q.dtype), mask.key_valid,
                            self.num_groups, options.decode_attention)
      out = constrain(constrain(out, options.query_sharding), options.head_sharding)
    else:                       # several tokens after earlier ones: dense over the cache
      out = attend(q, kv[0].swapaxes(1, 2).astype(q.dtype), kv[1].swapaxes(1, 2).astype(q.dtype),
                   mask, self.num_groups)
    return self.o_proj(out.reshape(b, t, -1)), kv


class MLP(nnx.Module):
  """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

  def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, std: float, rngs: nnx.Rngs):
    common = dict(use_bias=cfg.mlp_bias, dtype=dtype, std=std, rngs=rngs)
    self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, axes=(None, "model"), **common)
    self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, axes=(None, "model"), **common)
    self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, axes=("model", None), **common)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
  """Pre-norm residual block: attention then MLP."""

  def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype, std: float, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
    self.self_attn = Attention(cfg, dtype=dtype, std=std, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
    self.mlp = MLP(cfg, dtype=dtype, std=std, rngs=rngs)

  def __call__(self, x, cos, sin, mask, kv, index, options, fresh_cache=False, paged=None):
    h, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, index, options,
                           fresh_cache, paged)
    x = x + h
    return x + self.mlp(self.post_attention_layernorm(x)), kv
