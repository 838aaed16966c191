"""Rotary position embeddings, bit-compatible with transformers' Llama/Qwen code.

HF checkpoints store q/k projections in the "rotate half" layout (the two halves of a
head are the real and imaginary parts), so we must use the same convention, not the
interleaved one. Inverse frequencies are computed in float32 numpy exactly as
transformers does in torch float32 (including Llama 3.1's ``llama3`` scaling), because
a last-bit difference in a frequency, multiplied by a position in the thousands, is a
visible phase error.

Positions are explicit per token ([batch, seq]): with left-padded prompts a row's first
real token has position 0 whatever its column.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from sagc_jax.models.config import Llama3RopeScaling, ModelConfig

__all__ = ["apply_rope", "inv_frequencies", "rope_cos_sin"]


def _llama3_scale(inv_freq: np.ndarray, s: Llama3RopeScaling) -> np.ndarray:
  """Llama 3.1 frequency scaling: long wavelengths slowed by ``factor``, short ones
  kept, a smooth interpolation in between (transformers ``_compute_llama3_parameters``)."""
  f32 = np.float32
  old_len = s.original_max_position_embeddings
  low_freq_wavelen = old_len / s.low_freq_factor
  high_freq_wavelen = old_len / s.high_freq_factor
  wavelen = f32(2 * math.pi) / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / f32(s.factor), inv_freq).astype(f32)
  smooth = ((f32(old_len) / wavelen - f32(s.low_freq_factor))
            / f32(s.high_freq_factor - s.low_freq_factor)).astype(f32)
  smoothed = ((f32(1) - smooth) * scaled / f32(s.factor) + smooth * scaled).astype(f32)
  is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(f32)


@functools.lru_cache(maxsize=32)
def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
  """float32 inverse frequencies, shape [head_dim // 2]."""
  dim = cfg.head_dim
  exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
  inv_freq = (np.float32(1.0) / np.power(np.float32(cfg.rope_theta), exponents)).astype(np.float32)
  if cfg.rope_scaling is not None:
    inv_freq = _llama3_scale(inv_freq, cfg.rope_scaling)
  inv_freq.setflags(write=False)
  return inv_freq


def rope_cos_sin(cfg: ModelConfig, positions: jax.Array,
                 dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
  """cos and sin tables for integer ``positions`` [B, T] -> each [B, T, head_dim]."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_frequencies(cfg))
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates ``x`` [B, T, heads, head_dim] with tables [B, T, head_dim] (rotate-half)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, :, None, :] + rotated * sin[:, :, None, :]
