"""One flax.nnx decoder for Llama 3.x, Qwen2/2.5 and Qwen3, with a static-shape KV cache.

The three families share the block ``x + attn(norm(x))``, ``x + mlp(norm(x))``, a
SwiGLU MLP, grouped-query attention with rotate-half RoPE and a final RMSNorm; the
config switches q/k/v(/o) biases, Qwen3's per-head q/k RMSNorm and tied embeddings.
The layers, their HF names and sharding annotations are ``models.layers``; this module
stacks them and places their parameters. ``sharding.fit_spec`` replicates a dimension
the actual mesh cannot split. Logits are always float32 (the RL losses need accurate
log-probs even for a bfloat16 model).

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

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models import sharding as shd
from sagc_jax.models.attention import AttentionMask
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.kv_cache import KVCache, check_cache
from sagc_jax.models.layers import (DecoderLayer, Embed, ForwardOptions, Linear, RMSNorm,
                                    constrain, decode_cache_read_for)
from sagc_jax.models.paged_cache import PagedKVCache, SlotKVCache
from sagc_jax.models.rope import rope_cos_sin
from sagc_jax.runtime.distributed import to_device

__all__ = [
    "ForwardOptions",
    "decode_cache_read_for",
    "Transformer",
    "init_model",
    "place_state",
]


def _remat(fn, policy: str):
  if policy == "none":
    return fn
  if policy == "full":
    return jax.checkpoint(fn)
  return jax.checkpoint(fn, policy=getattr(jax.checkpoint_policies, policy))


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

    x, cos, sin = self._embed(input_ids, positions)
    if cache is None:
      x = self._layer_stack(x, cos, sin, attn_mask, options)
      return self.norm(x), None
    hidden, k, v = self._cached_layers(x, cos, sin, attn_mask, cache, index, options,
                                       fresh_cache)
    return hidden, KVCache(k=k, v=v, valid=key_valid, index=index + t,
                           next_pos=cache.next_pos + mask.sum(-1, dtype=jnp.int32))

  def _embed(self, input_ids: jax.Array, positions: jax.Array
             ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Token embeddings and the RoPE tables of their positions."""
    x = self.embed_tokens(input_ids)
    cos, sin = rope_cos_sin(self.cfg, positions, x.dtype)
    return x, cos, sin

  def _cached_layers(self, x, cos, sin, mask, cache, index, options: ForwardOptions,
                     fresh_cache: bool = False, paged=None
                     ) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """Every layer against its own cache leaves, unrolled: (final-norm hidden states,
    the layers' new keys, their new values)."""
    kvs = []
    for i, layer in enumerate(self.layers):
      x, kv = layer(x, cos, sin, mask, (cache.k[i], cache.v[i]), index, options, fresh_cache,
                    paged)
      kvs.append(kv)
    k, v = zip(*kvs)
    return self.norm(x), k, v

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
    x, cos, sin = self._embed(input_ids, positions)
    hidden, k, v = self._cached_layers(x, cos, sin, None, cache, None, options,
                                       paged=(cache, alive))
    return hidden, cache._replace(k=k, v=v, own_len=cache.own_len + alive.astype(jnp.int32))

  def _layer_stack(self, x, cos, sin, attn_mask, options: ForwardOptions) -> jax.Array:
    """The cache-free layer stack: unrolled or scanned, each layer optionally remat'd.

    Both paths run the same per-layer function on the same weights; scanning stacks
    the layers' weights into [num_layers, ...] arrays inside the program (one extra
    copy of the weights, which the sampler's cached path never makes).
    """
    graphdef = nnx.graphdef(self.layers[0])

    def one_layer(state, h):
      layer = nnx.merge(graphdef, state)
      h = constrain(h, options.row_sharding)
      return constrain(layer(h, cos, sin, attn_mask, None, None, options)[0],
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

