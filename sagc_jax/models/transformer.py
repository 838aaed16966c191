"""One flax.nnx decoder for Llama 3.x, Qwen2/2.5 and Qwen3, with a static-shape KV cache.

The three families share the block ``x + attn(norm(x))``, ``x + mlp(norm(x))``, a
SwiGLU MLP, grouped-query attention with rotate-half RoPE and a final RMSNorm; the
config switches q/k/v(/o) biases, Qwen3's per-head q/k RMSNorm and tied embeddings.
Module and parameter names mirror the HF checkpoint names (``layers.3.self_attn.q_proj``)
so the HF <-> nnx mapping in ``hf_io`` is mechanical: a ``kernel`` is the transpose of
HF's ``weight`` (we store [in, out]); everything else keeps its name.

Sharding: parameters carry ``out_sharding`` annotations in mesh-axis names, with
attention heads, MLP hidden units and vocabulary rows on ``'model'`` (Megatron style:
column-parallel q/k/v/gate/up, row-parallel o/down). ``sharding.fit_spec`` replicates a
dimension the actual mesh cannot split.

Numerics follow transformers: RMSNorm in float32 then cast back, softmax in float32,
RoPE tables in float32 cast to the activation dtype. Logits are always float32 (the RL
losses need accurate log-probs even for a bfloat16 model).

Padding and positions. Every call takes ``attention_mask`` [B, T] (True/1 = real
token). A query attends to the real keys at or before its own slot; pad keys are never
attended. Positions default to "number of real tokens before this one in the row", so a
left-padded row and the same row unpadded give identical logits on real tokens, and
right padding is harmless too. Logits at pad positions are finite but meaningless.

The KV cache a call with ``cache=`` reads and extends: ``models.kv_cache`` (dense, one
slot per row and token) or ``models.paged_cache`` (pages of a shared pool, one-token
decode calls only).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models import sharding as shd
from sagc_jax.models.attention import (ATTENTION_KINDS, DECODE_KINDS, AttentionMask, attend,
                                       decode_attend)
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.kv_cache import KVCache, check_cache
from sagc_jax.models.paged_cache import (PAGED_KERNELS, PagedKVCache, SlotKVCache,
                                         paged_decode_attend, slot_decode_attend)
from sagc_jax.models.rope import apply_rope, rope_cos_sin
from sagc_jax.runtime.distributed import to_device

__all__ = [
    "ForwardOptions",
    "decode_cache_read_for",
    "Transformer",
    "init_model",
    "place_state",
]

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


def _remat(fn, policy: str):
  if policy == "none":
    return fn
  if policy == "full":
    return jax.checkpoint(fn)
  return jax.checkpoint(fn, policy=getattr(jax.checkpoint_policies, policy))


def _constrain(x: jax.Array, sharding: Any) -> jax.Array:
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
    hd, col, row = cfg.head_dim, (None, "model"), ("model", None)
    common = dict(dtype=dtype, std=std, rngs=rngs)
    self.q_proj = Linear(cfg.hidden_size, cfg.num_heads * hd, use_bias=cfg.qkv_bias, axes=col,
                         **common)
    self.k_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * hd, use_bias=cfg.qkv_bias,
                         axes=col, **common)
    self.v_proj = Linear(cfg.hidden_size, cfg.num_kv_heads * hd, use_bias=cfg.qkv_bias,
                         axes=col, **common)
    self.o_proj = Linear(cfg.num_heads * hd, cfg.hidden_size, use_bias=cfg.o_bias, axes=row,
                         **common)
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
    k_new = _constrain(k.swapaxes(1, 2).astype(kv[0].dtype), options.kv_sharding)
    v_new = _constrain(v.swapaxes(1, 2).astype(kv[1].dtype), options.kv_sharding)
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
      q = _constrain(_constrain(q, options.head_sharding), options.query_sharding)
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
      out = _constrain(_constrain(out, options.query_sharding), options.head_sharding)
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


def real_token_positions(mask: jax.Array) -> jax.Array:
  """0-based count of real tokens before each column ([B, T] bool -> int32; pads: clamped)."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


class Transformer(nnx.Module):
  """Decoder-only causal LM. ``model(ids)`` -> float32 logits [B, T, vocab].

  Args of ``__call__`` (and of ``hidden_states``, which stops before the output head):
    input_ids: int [B, T].
    attention_mask: [B, T] bool/int, truthy = real token (default: all real).
    positions: int [B, T] RoPE positions (default: real-token count, offset by
      ``cache.next_pos`` when decoding with a cache).
    cache: a ``KVCache`` or a ``PagedKVCache`` (one-token calls: T = 1, the attention
      mask saying which slots run); if given, returns ``(logits, updated_cache)``.
    fresh_cache: the cache is empty (index 0): a prefill, whose tokens attend only to
      each other (lets ``options.attention='blocked'`` apply).
    options: ``ForwardOptions`` (attention kind, remat, scan over layers, cache layout).
    last_only: logits of the last column only ([B, 1, vocab]): a prefill needs nothing
      else, and the full [B, T, vocab] float32 logits of a long prompt batch would be the
      largest array of the program.
  """

  def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype = jnp.float32, rngs: nnx.Rngs,
               init_std: float = 0.02):
    self.cfg = cfg
    common = dict(dtype=dtype, std=init_std, rngs=rngs)
    self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, **common)
    self.layers = nnx.List([DecoderLayer(cfg, **common) for _ in range(cfg.num_layers)])
    self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    Linear(cfg.hidden_size, cfg.vocab_size, use_bias=False,
                           axes=(None, "model"), **common))

  def __call__(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
               positions: jax.Array | None = None, cache: KVCache | None = None,
               fresh_cache: bool = False, options: ForwardOptions = ForwardOptions(),
               last_only: bool = False):
    hidden, new_cache = self.hidden_states(input_ids, attention_mask=attention_mask,
                                           positions=positions, cache=cache,
                                           fresh_cache=fresh_cache, options=options)
    logits = self.logits(hidden[:, -1:] if last_only else hidden)
    return logits if cache is None else (logits, new_cache)

  def hidden_states(self, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                    positions: jax.Array | None = None, cache: KVCache | None = None,
                    fresh_cache: bool = False, options: ForwardOptions = ForwardOptions(),
                    segment_ids: jax.Array | None = None
                    ) -> tuple[jax.Array, KVCache | None]:
    """Final-norm hidden states [B, T, hidden] (and the updated cache, or None).

    ``segment_ids`` [B, T] int (no cache): packed rows, several sequences per row
    (id > 0; 0 = padding). Attention stays inside a sequence and ``positions`` (then
    required) restart at 0 for each one, so every sequence is computed exactly as if
    it were alone in its row.
    """
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, seq], got shape {input_ids.shape}")
    b, t = input_ids.shape
    if segment_ids is not None:
      if cache is not None or positions is None or attention_mask is not None:
        raise ValueError("segment_ids (packed rows) need positions, and take no cache and "
                         "no attention_mask")
      segment_ids = jnp.asarray(segment_ids).astype(jnp.int32)
      attention_mask = segment_ids > 0
    mask = (jnp.ones((b, t), bool) if attention_mask is None
            else jnp.asarray(attention_mask).astype(bool))
    if mask.shape != (b, t):
      raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {(b, t)}")
    if isinstance(cache, (PagedKVCache, SlotKVCache)):
      return self._paged_decode(input_ids, mask, positions, cache, options)
    if cache is None:
      index = None
      key_valid = mask
      query_slots = jnp.arange(t)
      offset = 0
    else:
      check_cache(cache, b, t)
      index = cache.index
      key_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, index))
      query_slots = index + jnp.arange(t)
      offset = cache.next_pos[:, None]
    if positions is None:
      positions = offset + real_token_positions(mask)
    attn_mask = AttentionMask(key_valid, query_slots, segment_ids)

    x = self.embed_tokens(input_ids)
    cos, sin = rope_cos_sin(self.cfg, positions, x.dtype)
    if cache is None:
      x = self._layer_stack(x, cos, sin, attn_mask, options)
      return self.norm(x), None
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      x, kv = layer(x, cos, sin, attn_mask, (cache.k[i], cache.v[i]), index, options,
                    fresh_cache)
      new_k.append(kv[0])
      new_v.append(kv[1])
    return self.norm(x), KVCache(k=tuple(new_k), v=tuple(new_v), valid=key_valid,
                                 index=index + t,
                                 next_pos=cache.next_pos + mask.sum(-1, dtype=jnp.int32))

  def _paged_decode(self, input_ids: jax.Array, mask: jax.Array, positions: jax.Array | None,
                    cache: PagedKVCache | SlotKVCache, options: ForwardOptions
                    ) -> tuple[jax.Array, PagedKVCache | SlotKVCache]:
    """One token per slot against a paged cache (or its slot views): each running slot
    (``mask``) writes its key and value at its next logical index and attends to its
    own keys."""
    b, t = input_ids.shape
    if t != 1 or cache.own_len.shape[0] != b:
      raise ValueError(f"a paged cache takes one token per slot: input_ids shape {(b, t)}, "
                       f"{cache.own_len.shape[0]} slots")
    alive = mask[:, 0]
    if positions is None:
      positions = cache.positions[:, None]
    x = self.embed_tokens(input_ids)
    cos, sin = rope_cos_sin(self.cfg, positions, x.dtype)
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      x, kv = layer(x, cos, sin, None, (cache.k[i], cache.v[i]), None, options,
                    paged=(cache, alive))
      new_k.append(kv[0])
      new_v.append(kv[1])
    return self.norm(x), cache._replace(k=tuple(new_k), v=tuple(new_v),
                                        own_len=cache.own_len + alive.astype(jnp.int32))

  def _layer_stack(self, x, cos, sin, attn_mask, options: ForwardOptions) -> jax.Array:
    """The cache-free layer stack: unrolled or scanned, each layer optionally remat'd.

    Both paths run the same per-layer function on the same weights; scanning stacks
    the layers' weights into [num_layers, ...] arrays inside the program (one extra
    copy of the weights, which the sampler's cached path never makes).
    """
    graphdef = nnx.graphdef(self.layers[0])

    def one_layer(state, h):
      layer = nnx.merge(graphdef, state)
      h = _constrain(h, options.row_sharding)
      return _constrain(layer(h, cos, sin, attn_mask, None, None, options)[0],
                        options.row_sharding)

    one_layer = _remat(one_layer, options.remat)
    states = [nnx.state(layer) for layer in self.layers]
    if not options.scan_layers:
      for state in states:
        x = one_layer(state, x)
      return x
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    x, _ = jax.lax.scan(lambda h, state: (one_layer(state, h), None), x, stacked)
    return x

  def head_weight(self) -> tuple[jax.Array, bool]:
    """(output-head matrix, is_transposed): [vocab, hidden] when tied, else [hidden, vocab]."""
    if self.lm_head is None:
      return self.embed_tokens.weight[...], True
    return self.lm_head.kernel[...], False

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Output head on final (normed) hidden states, float32 accumulation and result."""
    weight, transposed = self.head_weight()
    return head_logits(hidden, weight, transposed)


def head_logits(hidden: jax.Array, weight: jax.Array, transposed: bool) -> jax.Array:
  """``hidden @ W`` in float32 for an [hidden, vocab] (or tied [vocab, hidden]) head."""
  if transposed:
    return jnp.einsum("bth,vh->btv", hidden, weight, preferred_element_type=jnp.float32)
  return jnp.dot(hidden, weight, preferred_element_type=jnp.float32)


def abstract_model(cfg: ModelConfig, dtype: jnp.dtype, mesh: Mesh | None = None
                   ) -> Transformer:
  """The model with ShapeDtypeStruct leaves: shapes and sharding metadata, no memory.

  With ``mesh`` every leaf also carries its fitted ``NamedSharding``, so the model can
  be passed to ``jit(...).lower`` for ahead-of-time compilation on that mesh (e.g. an
  abstract TPU topology on a CPU host).
  """
  with nnx.use_eager_sharding(False):
    model = nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
  if mesh is None:
    return model
  graphdef, state = nnx.split(model)
  shardings = place_state(state, mesh)
  for path, var in nnx.to_flat_state(state):
    var.set_value(jax.ShapeDtypeStruct(var.shape, var.dtype, sharding=shardings[path]))
  return nnx.merge(graphdef, state)


def place_state(state: nnx.State, mesh: Mesh | None) -> dict[tuple, jax.sharding.Sharding | None]:
  """Fits every variable's ``out_sharding`` to ``mesh`` (metadata updated in place).

  Returns {flat path: NamedSharding} (None values when ``mesh`` is None).
  """
  out = {}
  for path, var in nnx.to_flat_state(state):
    if mesh is None:
      out[path] = None
      continue
    fitted = shd.fit_spec(var.shape, var.get_metadata().get("out_sharding"), mesh)
    var.set_metadata(out_sharding=fitted)
    out[path] = shd.named_sharding(var.shape, fitted, mesh)
  return out


def _init_value(path: tuple, var: nnx.Variable, rng: np.random.Generator,
                std: float) -> np.ndarray:
  """Initial value of one parameter, of the kind its module declared (``init``
  metadata: ``normal`` (std), ``ones``, ``zeros``): the modules are the one place
  that says how each parameter starts, here and in their own constructors."""
  kind = var.get_metadata().get("init")
  shape = tuple(var.shape)
  if kind == "normal":
    return rng.normal(0.0, std, shape).astype(np.float32)
  if kind in ("ones", "zeros"):
    return (np.ones if kind == "ones" else np.zeros)(shape, np.float32)
  raise ValueError(f"parameter {'.'.join(map(str, path))} declares no init kind "
                   f"(init={kind!r}; expected 'normal', 'ones' or 'zeros')")


def init_model(cfg: ModelConfig, *, seed: int = 0, dtype: jnp.dtype = jnp.float32,
               mesh: Mesh | None = None, init_std: float = 0.02) -> Transformer:
  """Random-init model (normal(init_std) matrices, unit norms, zero biases).

  Values are drawn on the host with numpy, one tensor at a time, and placed like loaded
  weights (straight into their shards when a mesh is given). This is deterministic in
  ``seed`` and avoids compiling a random-init program (seconds on CPU, each call).
  """
  graphdef, state = nnx.split(abstract_model(cfg, dtype))
  shardings = place_state(state, mesh)
  rng = np.random.default_rng(seed)
  np_dtype = np.dtype(jnp.dtype(dtype))
  for path, var in nnx.to_flat_state(state):
    host = _init_value(path, var, rng, init_std).astype(np_dtype)
    var.set_value(to_device(host, shardings[path]))
  return nnx.merge(graphdef, state)


def param_count(model: Transformer) -> int:
  """Number of parameters (tied embeddings counted once)."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

