"""The decode primitives both samplers are built from: one token rule, one cache.

The fused sampler (``sampler.py``: one ``while_loop`` over the whole cache) and the
segmented one (``segmented.py``: shared prefill, span buckets, live-row compaction)
must sample *the same tokens*: the segmented sampler is only an optimisation, and
its tests compare it with the fused one token for token. Both therefore trace the
functions of this module, which depends on neither of them (so neither imports the
other's internals).

Randomness. Row r's token t is drawn with the key
``fold_in(fold_in(key(seed), row_ids[r]), t)``: the result depends on the seed and
the row's global index only, not on the bucket, batch padding, compaction, sub-call
or mesh, so one device and 8 devices sample identical tokens.

Log-probabilities. ``logprobs[r, t]`` is the log-probability of the sampled token
under the sampling distribution before top-k/top-p truncation, i.e.
``log_softmax(logits / temperature)`` (``temperature = 0``: plain
``log_softmax(logits)``). The learner recomputes exactly this quantity, so it serves
as the PPO "old" log-prob (the ratio of PPO / GRPO, docs/architecture.md, "One training step").

The decode state (*carry*) is a dict: ``t`` (the next token index) and the cache are
shared, every other leaf (``ROW_LEAVES``) has one entry per row, which is what lets
compaction gather rows without knowing what they hold.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.kv_cache import KVCache, cache_sharding, init_cache
from sagc_jax.models.sharding import named_sharding
from sagc_jax.models.transformer import ForwardOptions, Transformer
from sagc_jax.runtime.distributed import put_global
from sagc_jax.sampling.params import SamplingParams

__all__ = ["ROW_LEAVES", "abstract_cache", "decode_until", "draw", "emit", "initial_carry",
           "lower", "new_cache", "pin_cache", "place", "prefill", "sample_tokens", "sharded_spec"]

# Carry leaves indexed by row (gathered by compaction); "t" and the cache's "index"
# are shared scalars.
ROW_LEAVES = ("last", "tokens", "logprobs", "lengths", "done", "row_ids", "slot")


def sharded_spec(mesh: Mesh | None, shape: Sequence[int], dtype: Any,
                 names: Sequence[str | None] = ()) -> jax.ShapeDtypeStruct:
  """An abstract input laid out by mesh axis ``names`` where they divide it (dimensions
  past ``names`` unsharded; everything unsharded without a mesh).

  The samplers compile ahead of time (docs/architecture.md, "Shapes and compilation"), so each
  input is described once, with its sharding, and lowered from that description.
  """
  names = tuple(names) + (None,) * (len(shape) - len(names))
  sharding = None if mesh is None else named_sharding(shape, names, mesh)
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def lower(fn: Callable, in_specs: tuple, out_spec: Any = None, donate: tuple[int, ...] = ()
          ) -> Any:
  """``jax.jit(fn).lower(*in_specs)``, every sampler program's lowering: the inputs laid
  out as their specs say, the outputs as ``out_spec``'s (a leaf without a sharding, or
  no ``out_spec``, leaves XLA to choose), ``donate`` the donated arguments."""
  out_shardings = jax.tree.map(lambda s: s.sharding, out_spec)
  return jax.jit(fn, donate_argnums=donate, out_shardings=out_shardings).lower(*in_specs)


def place(value: Any, sharding: jax.sharding.Sharding | None) -> Any:
  """A host input of a compiled program, placed by its spec's ``sharding``; without one
  (no mesh) passed as it is: the call transfers it, where ``jnp.asarray`` would compile
  a copy program per shape."""
  return value if sharding is None else put_global(value, sharding)


def pin_cache(cfg: ModelConfig, cache: KVCache, mesh: Mesh | None) -> KVCache:
  """``cache`` (inside jit) constrained to the layout of its row and slot counts.

  The constraint keeps XLA from choosing another layout for the cache than the one
  the decode programs receive it in (``cache_sharding``: rows on 'data', KV heads on
  'model' where they divide it, or rows over both axes where they do not).
  """
  if mesh is None:
    return cache
  rows, length = cache.valid.shape
  return jax.lax.with_sharding_constraint(cache, cache_sharding(cfg, rows, length, mesh))


def new_cache(cfg: ModelConfig, rows: int, length: int, dtype: Any, mesh: Mesh | None
              ) -> KVCache:
  """An empty ``length``-slot cache for ``rows`` rows, inside jit, its layout pinned."""
  return pin_cache(cfg, init_cache(cfg, rows, length, dtype=dtype), mesh)


def abstract_cache(cfg: ModelConfig, rows: int, length: int, dtype: Any, mesh: Mesh | None
                   ) -> KVCache:
  """The abstract ``new_cache`` (for lowering programs that receive a cache)."""
  cache = jax.eval_shape(lambda: init_cache(cfg, rows, length, dtype=dtype))
  if mesh is None:
    return cache
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      cache, cache_sharding(cfg, rows, length, mesh))


def prefill(model: Transformer, prompt_tokens: jax.Array, prompt_mask: jax.Array,
            cache: KVCache, options: ForwardOptions) -> tuple[jax.Array, KVCache]:
  """Writes the left-padded prompts into ``cache``; returns (next-token logits [B, V], cache).

  Left padding puts every real row's last prompt token in the last column, so only
  that column's logits are computed (``last_only``: no [B, T, V] logits).
  """
  logits, cache = model(prompt_tokens, attention_mask=prompt_mask, cache=cache,
                        fresh_cache=True, options=options, last_only=True)
  return logits[:, -1, :], cache


def sample_tokens(logits: jax.Array, keys: jax.Array, params: SamplingParams
                  ) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row; returns (tokens [B], log-probs [B]).

  top-k then top-p filter the temperature-scaled logits; the draw is a Gumbel
  arg-max with each row's own key. The returned log-prob is of the unfiltered
  scaled distribution (see the module docstring).
  """
  logits = logits.astype(jnp.float32)
  if params.temperature == 0:
    tokens = jnp.argmax(logits, axis=-1)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
  else:
    scaled = logits / params.temperature
    logp_all = jax.nn.log_softmax(scaled, axis=-1)
    filtered = scaled
    if params.top_k:
      k = min(params.top_k, scaled.shape[-1])
      kth = jax.lax.top_k(scaled, k)[0][:, -1:]
      filtered = jnp.where(scaled < kth, -jnp.inf, filtered)
    if params.top_p < 1:
      sorted_logits = jnp.sort(filtered, axis=-1)[:, ::-1]
      probs = jax.nn.softmax(sorted_logits, axis=-1)
      mass_before = jnp.cumsum(probs, axis=-1) - probs
      # Keep the smallest prefix whose mass reaches top_p (always the top token).
      keep = mass_before < params.top_p
      threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
      filtered = jnp.where(filtered < threshold, -jnp.inf, filtered)
    gumbel = jax.vmap(lambda key: jax.random.gumbel(key, scaled.shape[-1:]))(keys)
    tokens = jnp.argmax(filtered + gumbel, axis=-1)
  tokens = tokens.astype(jnp.int32)
  logp = jnp.take_along_axis(logp_all, tokens[:, None], axis=-1)[:, 0]
  return tokens, logp


def initial_carry(cache: KVCache, row_valid: jax.Array, row_ids: jax.Array,
                  params: SamplingParams) -> dict[str, Any]:
  """The decode state before the first token: padding rows are done from the start.

  ``row_ids`` are the rows' global ids (their random streams); ``slot`` is a row's
  position in the call's output (the segmented sampler's compaction moves rows, and
  scatters them back by slot; -1 marks a padding row added by compaction).
  """
  rows = row_valid.shape[0]
  return dict(t=jnp.int32(0), cache=cache, last=jnp.zeros((rows,), jnp.int32),
              tokens=jnp.full((rows, params.max_new_tokens), params.pad_id, jnp.int32),
              logprobs=jnp.zeros((rows, params.max_new_tokens), jnp.float32),
              lengths=jnp.zeros((rows,), jnp.int32), done=~row_valid,
              row_ids=row_ids, slot=jnp.arange(rows, dtype=jnp.int32))


def draw(step_logits: jax.Array, seed: jax.Array, row_ids: jax.Array, t: jax.Array,
         alive: jax.Array, params: SamplingParams
         ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Token ``t`` of each row (``t`` shared, or one per row); ``(tokens, log-probs,
  hit_stop)``, pad / 0 / False where not ``alive``.

  Row r's key is ``fold_in(fold_in(key(seed), row_ids[r]), t[r])``: a row's tokens do
  not depend on where in a batch (or which batch, slot or sampler) it sits. A row is
  done once it emits one of ``params.stop_ids`` (sorted and unique, ``SamplingParams``).
  """
  base = jax.random.key(seed)
  keys = jax.vmap(lambda r, i: jax.random.fold_in(jax.random.fold_in(base, r), i))(
      row_ids, jnp.broadcast_to(t, row_ids.shape))
  tokens, logp = sample_tokens(step_logits, keys, params)
  tokens = jnp.where(alive, tokens, params.pad_id)
  stop_ids = jnp.asarray(params.stop_ids, jnp.int32)
  hit_stop = alive & jnp.any(tokens[:, None] == stop_ids[None, :], axis=-1)
  return tokens, jnp.where(alive, logp, 0.0), hit_stop


def emit(carry: dict[str, Any], step_logits: jax.Array, seed: jax.Array,
         params: SamplingParams) -> dict[str, Any]:
  """Samples token ``t`` for the rows still running and records it (``draw``)."""
  t = carry["t"]
  alive = ~carry["done"]
  tokens, logp, hit_stop = draw(step_logits, seed, carry["row_ids"], t, alive, params)
  return dict(
      carry, t=t + 1, last=tokens,
      tokens=jax.lax.dynamic_update_slice(carry["tokens"], tokens[:, None], (0, t)),
      logprobs=jax.lax.dynamic_update_slice(
          carry["logprobs"], logp[:, None], (0, t)),
      lengths=carry["lengths"] + alive.astype(jnp.int32),
      done=carry["done"] | hit_stop)


def decode_until(model: Transformer, carry: dict[str, Any], seed: jax.Array,
                 params: SamplingParams, options: ForwardOptions, t_end: int
                 ) -> dict[str, Any]:
  """Decodes one token per running row until token ``t_end`` or every row is done.

  The loop exits as soon as every real row has stopped: a call costs as much as its
  longest response, the straggler effect SAGC manages (docs/controllers.md).
  """
  def keep_going(c):
    return (c["t"] < t_end) & jnp.any(~c["done"])

  def decode_one(c):
    step_logits, new_cache = model(c["last"][:, None], attention_mask=(~c["done"])[:, None],
                                   cache=c["cache"], options=options)
    return emit(dict(c, cache=new_cache), step_logits[:, -1, :], seed, params)

  return jax.lax.while_loop(keep_going, decode_one, carry)
