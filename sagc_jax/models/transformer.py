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

KV cache (``KVCache``): fixed-shape arrays so that a jitted ``lax.while_loop`` sampler
can carry it without recompiling:

  * ``k[i]``, ``v[i]``: layer i keys/values, [B, max_len, num_kv_heads, head_dim];
  * ``valid``: [B, max_len] bool, slot holds a real token;
  * ``index``: int32 scalar, the next slot to write (shared by all rows);
  * ``next_pos``: [B] int32, RoPE position of each row's next real token.

A call with ``cache=`` writes its T tokens at slots ``index .. index+T-1`` for every row
(pad tokens are written but flagged invalid and do not advance ``next_pos``) and returns
``(logits, new_cache)``. Because the write slot is shared but positions are per row,
prompts padded on either side work: a right-padded row simply has invalid slots between
its prompt and its generated tokens. Typical use::

    cache = init_cache(cfg, batch, max_len=prompt_len + max_new, dtype=jnp.bfloat16)
    logits, cache = model(prompt_ids, attention_mask=prompt_mask, cache=cache)  # prefill
    # next-token logits of each row: the column of its last real prompt token
    # (column prompt_len-1 for left padding, length-1 for right padding).
    logits, cache = model(tok[:, None], attention_mask=alive[:, None], cache=cache)

Pass ``attention_mask=False`` for rows that already hit EOS (their token is then
ignored by later steps). Writing past ``max_len`` is checked on the host when ``index``
is concrete; under jit the caller must guarantee ``index + T <= max_len`` (XLA would clamp
the write silently).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models import sharding as shd
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.rope import apply_rope, rope_cos_sin

__all__ = [
    "KVCache",
    "Transformer",
    "cache_sharding",
    "init_cache",
    "init_model",
    "place_state",
]

_MASKED = float(jnp.finfo(jnp.float32).min)


class Linear(nnx.Module):
  """Dense layer with kernel [in, out] (HF stores the transpose) and optional bias."""

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool,
               axes: tuple[str | None, str | None], dtype: jnp.dtype, std: float,
               rngs: nnx.Rngs):
    init = nnx.initializers.normal(std)
    self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features), dtype),
                            out_sharding=axes)
    self.bias = (nnx.Param(jnp.zeros((out_features,), dtype), out_sharding=(axes[1],))
                 if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = jnp.dot(x, self.kernel[...])
    if self.bias is not None:
      y = y + self.bias[...]
    return y


class RMSNorm(nnx.Module):
  """``weight * x / rms(x)``, normalised in float32 and cast back like transformers."""

  def __init__(self, dim: int, *, eps: float, dtype: jnp.dtype):
    self.weight = nnx.Param(jnp.ones((dim,), dtype), out_sharding=(None,))
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
                            out_sharding=("model", None))

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.weight[...], ids, axis=0)


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
            num_groups: int) -> jax.Array:
  """Grouped-query attention. q [B,T,H,D], k/v [B,S,KV,D], mask [B,T,S] -> [B,T,H,D].

  Query head h reads key/value head h // num_groups (transformers' ``repeat_kv``).
  """
  b, t, h, d = q.shape
  if t == 1:
    return _attend_one_query(q, k, v, mask, num_groups)
  q = q.reshape(b, t, h // num_groups, num_groups, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = scores * (d ** -0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(b, t, h, d)


def _attend_one_query(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                      num_groups: int) -> jax.Array:
  """Decode-step attention (one query per row) as fused multiply-reduce, float32.

  With T = 1 the two contractions are B*KV matrix-vector products; lowered as
  batched dots they cost one small GEMM call per (row, KV head) — on XLA:CPU
  ~2 ms per step for 32 rows x 4 layers, 50x the arithmetic. Written as
  broadcast-multiply + reduce, XLA fuses each into one pass over the cache,
  which is what a memory-bound decode step should be on any backend.
  """
  b, _, h, d = q.shape
  kv_heads = h // num_groups
  qf = q.reshape(b, kv_heads, num_groups, d).astype(jnp.float32)
  kf = k.astype(jnp.float32)[:, :, :, None, :]                    # [B, S, KV, 1, D]
  scores = jnp.sum(qf[:, None] * kf, axis=-1) * (d ** -0.5)      # [B, S, KV, G]
  scores = jnp.where(mask[:, 0, :, None, None], scores, _MASKED)
  probs = jax.nn.softmax(scores, axis=1)
  out = jnp.sum(probs[..., None] * v.astype(jnp.float32)[:, :, :, None, :], axis=1)
  return out.reshape(b, 1, h, d).astype(v.dtype)


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

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
               kv: tuple[jax.Array, jax.Array] | None, index: jax.Array | None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, -1, self.head_dim)
    k = self.k_proj(x).reshape(b, t, -1, self.head_dim)
    v = self.v_proj(x).reshape(b, t, -1, self.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if kv is not None:
      start = (0, index, 0, 0)
      k = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), start)
      v = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), start)
      kv = (k, v)
      k, v = k.astype(q.dtype), v.astype(q.dtype)
    out = _attend(q, k, v, mask, self.num_groups)
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

  def __call__(self, x, cos, sin, mask, kv, index):
    h, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, index)
    x = x + h
    return x + self.mlp(self.post_attention_layernorm(x)), kv


class KVCache(NamedTuple):
  """Static-shape decoding cache (a pytree); see the module docstring for the protocol."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  valid: jax.Array
  index: jax.Array
  next_pos: jax.Array

  @property
  def batch_size(self) -> int:
    return self.valid.shape[0]

  @property
  def max_len(self) -> int:
    return self.valid.shape[1]


def _cache_specs(num_layers: int) -> KVCache:
  """Mesh-axis names per cache leaf: rows on 'data', KV heads on 'model'."""
  kv = ("data", None, "model", None)
  return KVCache(k=(kv,) * num_layers, v=(kv,) * num_layers, valid=("data", None),
                 index=(), next_pos=("data",))


def cache_sharding(cfg: ModelConfig, batch_size: int, max_len: int, mesh: Mesh) -> KVCache:
  """A ``KVCache`` of NamedShardings (for jit in/out shardings of a sampler)."""
  shapes = jax.eval_shape(lambda: init_cache(cfg, batch_size, max_len))
  return jax.tree.map(lambda s, names: shd.named_sharding(s.shape, names, mesh),
                      shapes, _cache_specs(cfg.num_layers),
                      is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: jnp.dtype = jnp.float32,
               mesh: Mesh | None = None) -> KVCache:
  """An empty cache: no valid slot, index 0, every row's next position 0."""
  if batch_size <= 0 or max_len <= 0:
    raise ValueError(f"init_cache: batch_size={batch_size} and max_len={max_len} must be positive")
  shape = (batch_size, max_len, cfg.num_kv_heads, cfg.head_dim)
  cache = KVCache(
      k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
      v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
      valid=jnp.zeros((batch_size, max_len), bool),
      index=jnp.zeros((), jnp.int32),
      next_pos=jnp.zeros((batch_size,), jnp.int32),
  )
  if mesh is not None:
    cache = jax.device_put(cache, cache_sharding(cfg, batch_size, max_len, mesh))
  return cache


def real_token_positions(mask: jax.Array) -> jax.Array:
  """0-based count of real tokens before each column ([B, T] bool -> int32; pads: clamped)."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


class Transformer(nnx.Module):
  """Decoder-only causal LM. ``model(ids)`` -> float32 logits [B, T, vocab].

  Args of ``__call__``:
    input_ids: int [B, T].
    attention_mask: [B, T] bool/int, truthy = real token (default: all real).
    positions: int [B, T] RoPE positions (default: real-token count, offset by
      ``cache.next_pos`` when decoding with a cache).
    cache: a ``KVCache``; if given, returns ``(logits, updated_cache)``.
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
               positions: jax.Array | None = None, cache: KVCache | None = None):
    input_ids = jnp.asarray(input_ids)
    if input_ids.ndim != 2:
      raise ValueError(f"input_ids must be [batch, seq], got shape {input_ids.shape}")
    b, t = input_ids.shape
    mask = (jnp.ones((b, t), bool) if attention_mask is None
            else jnp.asarray(attention_mask).astype(bool))
    if mask.shape != (b, t):
      raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {(b, t)}")
    if cache is None:
      index = None
      key_valid = mask
      query_slots = jnp.arange(t)
      offset = 0
    else:
      _check_cache(cache, b, t)
      index = cache.index
      key_valid = jax.lax.dynamic_update_slice(cache.valid, mask, (0, index))
      query_slots = index + jnp.arange(t)
      offset = cache.next_pos[:, None]
    if positions is None:
      positions = offset + real_token_positions(mask)
    key_slots = jnp.arange(key_valid.shape[1])
    attn_mask = key_valid[:, None, :] & (key_slots[None, None, :] <= query_slots[None, :, None])

    x = self.embed_tokens(input_ids)
    cos, sin = rope_cos_sin(self.cfg, positions, x.dtype)
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      kv = None if cache is None else (cache.k[i], cache.v[i])
      x, kv = layer(x, cos, sin, attn_mask, kv, index)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    logits = self.logits(self.norm(x))
    if cache is None:
      return logits
    return logits, KVCache(k=tuple(new_k), v=tuple(new_v), valid=key_valid,
                           index=index + t,
                           next_pos=cache.next_pos + mask.sum(-1, dtype=jnp.int32))

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Output head on final (normed) hidden states, float32 accumulation and result."""
    if self.lm_head is None:
      return jnp.einsum("bth,vh->btv", hidden, self.embed_tokens.weight[...],
                        preferred_element_type=jnp.float32)
    return jnp.dot(hidden, self.lm_head.kernel[...], preferred_element_type=jnp.float32)


def _check_cache(cache: KVCache, batch: int, t: int) -> None:
  if cache.batch_size != batch:
    raise ValueError(f"cache batch_size={cache.batch_size} != input batch {batch}")
  if not isinstance(cache.index, jax.core.Tracer):  # concrete: checkable on the host
    end = int(cache.index) + t
    if end > cache.max_len:
      raise ValueError(f"cache overflow: index {int(cache.index)} + {t} tokens > "
                       f"max_len={cache.max_len}")


def abstract_model(cfg: ModelConfig, dtype: jnp.dtype) -> Transformer:
  """The model with ShapeDtypeStruct leaves: shapes and sharding metadata, no memory."""
  with nnx.use_eager_sharding(False):
    return nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(0)))


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


def _init_value(path: tuple, shape: tuple[int, ...], rng: np.random.Generator,
                std: float) -> np.ndarray:
  """Initial value of one parameter: unit RMSNorm scales, zero biases, normal(std) else."""
  if path[-1] == "bias":
    return np.zeros(shape, np.float32)
  if path[-1] == "weight" and str(path[-2]).endswith("norm"):
    return np.ones(shape, np.float32)
  return rng.normal(0.0, std, shape).astype(np.float32)


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
    host = _init_value(path, tuple(var.shape), rng, init_std).astype(np_dtype)
    var.set_value(to_device(host, shardings[path]))
  return nnx.merge(graphdef, state)


def to_device(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
  """Host array -> device array; with a sharding each device receives only its slice."""
  if sharding is None:
    return jnp.asarray(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def param_count(model: Transformer) -> int:
  """Number of parameters (tied embeddings counted once)."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

