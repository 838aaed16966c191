"""The static-shape KV cache of ``models.transformer.Transformer`` and its sharding.

KV cache (``KVCache``): fixed-shape arrays so that a jitted ``lax.while_loop`` sampler
can carry it without recompiling:

  * ``k[i]``, ``v[i]``: layer i keys/values, [B, num_kv_heads, max_len, head_dim]
    (heads before slots: the layout decode attention reads without a transpose);
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
from jax.sharding import Mesh

from sagc_jax.models import sharding as shd
from sagc_jax.models.config import ModelConfig

__all__ = ["KVCache", "cache_row_axes", "cache_sharding", "check_cache", "init_cache"]


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


def cache_row_axes(cfg: ModelConfig, batch_size: int, mesh: Mesh) -> tuple[str, ...]:
  """Mesh axes a cache's rows are split over.

  Normally rows go on 'data' and KV heads on 'model'. When the KV heads do not divide
  the 'model' axis (Qwen2.5-3B: 2 KV heads, 4-way 'model'), splitting heads is
  impossible and replicating the cache over 'model' would multiply its size per chip
  by the axis size; then the rows are split over ('data', 'model') instead, if they
  divide, and each chip holds whole heads of fewer rows.
  """
  model_ways = mesh.shape.get("model", 1)
  data_ways = mesh.shape.get("data", 1)
  if (model_ways > 1 and cfg.num_kv_heads % model_ways
      and batch_size % (data_ways * model_ways) == 0):
    return ("data", "model")
  return ("data",)


def _cache_specs(num_layers: int, row_axes: tuple[str, ...]) -> KVCache:
  """Mesh-axis names per cache leaf: rows on ``row_axes``, KV heads on 'model' unless
  'model' already splits the rows."""
  rows = row_axes if len(row_axes) > 1 else row_axes[0]
  heads = None if "model" in row_axes else "model"
  kv = (rows, heads, None, None)
  return KVCache(k=(kv,) * num_layers, v=(kv,) * num_layers, valid=(rows, None),
                 index=(), next_pos=(rows,))


def cache_sharding(cfg: ModelConfig, batch_size: int, max_len: int, mesh: Mesh) -> KVCache:
  """A ``KVCache`` of NamedShardings (for jit in/out shardings of a sampler)."""
  shapes = jax.eval_shape(lambda: init_cache(cfg, batch_size, max_len))
  specs = _cache_specs(cfg.num_layers, cache_row_axes(cfg, batch_size, mesh))
  return jax.tree.map(lambda s, names: shd.named_sharding(s.shape, names, mesh),
                      shapes, specs, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: jnp.dtype = jnp.float32,
               mesh: Mesh | None = None) -> KVCache:
  """An empty cache: no valid slot, index 0, every row's next position 0."""
  if batch_size <= 0 or max_len <= 0:
    raise ValueError(f"init_cache: batch_size={batch_size} and max_len={max_len} must be positive")
  shape = (batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
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


def check_cache(cache: KVCache, batch: int, t: int) -> None:
  """A call of ``t`` tokens on ``batch`` rows fits ``cache`` (checked on the host when the
  write index is concrete)."""
  if cache.batch_size != batch:
    raise ValueError(f"cache batch_size={cache.batch_size} != input batch {batch}")
  if not isinstance(cache.index, jax.core.Tracer):  # concrete: checkable on the host
    end = int(cache.index) + t
    if end > cache.max_len:
      raise ValueError(f"cache overflow: index {int(cache.index)} + {t} tokens > "
                       f"max_len={cache.max_len}")
