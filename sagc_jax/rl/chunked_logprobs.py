"""Token log-probs and entropy from hidden states, a chunk of positions at a time.

The learner needs, for every response token, ``log softmax(logits / temperature)`` of the
sampled token and (as a metric) the entropy of that distribution. Computing the full
float32 logits first costs ``rows x positions x vocab x 4`` bytes: for 32 rows of 2048
positions and Llama 3's 128 256-token vocabulary that is 31 GiB, before autodiff keeps
a second copy. Here the positions are processed ``chunk`` at a time in a ``lax.scan``
whose body is rematerialised (``jax.checkpoint``): the forward keeps only the per-token
results, the backward recomputes one chunk's logits at a time, so the largest live
array is [rows, chunk, vocab].

The values are exactly ``losses.token_logprobs`` / ``losses.entropy_from_logits`` of the
full logits (the same functions run on each chunk); the entropy carries no gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sagc_jax.models.transformer import head_logits
from sagc_jax.rl import losses

__all__ = ["chunked_logprobs_entropy"]


def chunked_logprobs_entropy(hidden: jax.Array, head_weight: jax.Array, transposed: bool,
                             targets: jax.Array, *, temperature: float = 1.0,
                             chunk: int = 512) -> tuple[jax.Array, jax.Array]:
  """(log-probs [B, N], entropy [B, N]) of ``targets`` under ``softmax(h W / temperature)``.

  Args:
    hidden: [B, N, hidden] final-norm hidden states at the positions that predict
      ``targets`` (position i predicts ``targets[:, i]``).
    head_weight, transposed: the output head (``Transformer.head_weight()``).
    targets: [B, N] int token ids.
    temperature: the sampler's temperature (> 0).
    chunk: positions per chunk; N is padded up to a multiple internally.
  """
  if chunk <= 0:
    raise ValueError(f"chunk={chunk} must be positive")
  b, n, h = hidden.shape
  chunk = min(chunk, n)
  pad = -n % chunk
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  steps = (n + pad) // chunk
  # [steps, B, chunk, ...]: the scan walks over position chunks.
  hs = hidden.reshape(b, steps, chunk, h).swapaxes(0, 1)
  ts = targets.reshape(b, steps, chunk).swapaxes(0, 1)

  # The weight enters the scan in float32 and is cast back inside each chunk, so the
  # head's gradient accumulates over chunks in float32 (a bf16 weight captured as is
  # would have its gradient summed in bf16, rounded once per chunk).
  weight32 = head_weight.astype(jnp.float32)

  @jax.checkpoint
  def one_chunk(h_chunk, t_chunk):
    weight = weight32.astype(head_weight.dtype)
    logits = head_logits(h_chunk, weight, transposed) / temperature
    logp = losses.token_logprobs(logits, t_chunk)
    entropy = losses.entropy_from_logits(jax.lax.stop_gradient(logits))
    return logp, entropy

  _, (logp, entropy) = jax.lax.scan(lambda c, x: (c, one_chunk(*x)), None, (hs, ts))
  logp = logp.swapaxes(0, 1).reshape(b, n + pad)[:, :n]
  entropy = entropy.swapaxes(0, 1).reshape(b, n + pad)[:, :n]
  return logp, jax.lax.stop_gradient(entropy)
