"""The fused sampler's programs: prefill, then one ``while_loop`` over the whole cache.

One ``generate`` program per (call rows, prompt bucket) prefills the left-padded prompts
into a static-shape KV cache of ``prompt + max_new_tokens`` slots, then decodes one
token for every row per iteration and exits as soon as every real row has produced a
stop token or ``max_new_tokens`` is reached: a call costs as much as its *longest*
response, exactly the straggler effect SAGC manages. The per-group max and median
response lengths are computed in the same program (``group_stats``); a small stats
program per call rows right after it sends them to the host (``lower_report``), so the
program that runs the model carries no host callback and can be read from JAX's
persistent compilation cache.
"""

from __future__ import annotations

import time
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.models.kv_cache import KVCache
from sagc_jax.models.sharding import abstract_like
from sagc_jax.runtime.compilation import WarmupJob
from sagc_jax.sampling import decode
from sagc_jax.sampling.group_stats import (GroupLengthStats, group_length_stats, lower_report,
                                           stats_specs)
from sagc_jax.sampling.listener import RolloutListener, wait_for
from sagc_jax.sampling.programs import DecoderPrograms

__all__ = ["FusedDecoder"]


class FusedDecoder(DecoderPrograms):
  """The fused executables of one model architecture, and one call through them
  (``programs.DecoderPrograms``: ("generate", rows, prompt_len) and ("stats", rows)).

  The generate program keeps the shardings of the model state it is lowered with.
  """

  def _lower_generate(self, state, rows: int, prompt_len: int):
    graphdef, params, cfg = self.graphdef, self.params, self.cfg
    n_new = params.max_new_tokens
    options = self.options_for(rows)

    def sampler_generate(state, prompt_tokens, prompt_mask, row_valid, group_ids, row_ids, seed):
      model = nnx.merge(graphdef, state)
      cache = decode.new_cache(cfg, rows, prompt_len + n_new, self.cache_dtype, self.mesh)
      logits, cache = decode.prefill(model, prompt_tokens, prompt_mask, cache, options)
      carry = decode.emit(decode.initial_carry(cache, row_valid, row_ids, params), logits, seed,
                          params)
      carry = decode.decode_until(model, carry, seed, params, options, t_end=n_new)
      stats = group_length_stats(carry["lengths"], group_ids, row_valid, num_groups=rows)
      return dict(tokens=carry["tokens"], logprobs=carry["logprobs"], lengths=carry["lengths"],
                  decode_steps=carry["t"], stats=stats)

    row2 = lambda dtype: self._spec((rows, n_new), dtype, ("data", None))
    out = dict(tokens=row2(jnp.int32), logprobs=row2(jnp.float32),
               lengths=self._spec((rows,), jnp.int32, ("data",)),
               decode_steps=self._spec((), jnp.int32), stats=stats_specs(rows, self._spec))
    return decode.lower(sampler_generate,
                        (abstract_like(state), *self._abstract_inputs(rows, prompt_len)), out)

  def _abstract_inputs(self, rows: int, prompt_len: int) -> tuple:
    """Specs of the generate program's inputs: prompt tokens and mask, row validity,
    group ids, row ids and the seed."""
    return (self._spec((rows, prompt_len), jnp.int32, ("data", None)),
            self._spec((rows, prompt_len), jnp.bool_, ("data", None)),
            self._spec((rows,), jnp.bool_, ("data",)),
            self._spec((rows,), jnp.int32, ("data",)),
            self._spec((rows,), jnp.int32, ("data",)),
            self._spec((), jnp.uint32, ()))

  def _lower_stats(self, state, rows: int):
    return lower_report(self.sink, rows, self._spec)

  def compile(self, state, rows: int, prompt_len: int):
    """The compiled generate executable of one (call rows, prompt bucket) (cached)."""
    return self.programs.get(("generate", rows, prompt_len), state)

  def warmup_job(self, state, rows: int, prompt_len: int) -> WarmupJob:
    return WarmupJob(self.programs, [("generate", rows, prompt_len), ("stats", rows)], (state,))

  def abstract_cache(self, rows: int, prompt_len: int) -> KVCache:
    """The generate program's KV cache of one call, abstract, with its pinned sharding
    (if a mesh)."""
    return decode.abstract_cache(self.cfg, rows, prompt_len + self.params.max_new_tokens,
                                 self.cache_dtype, self.mesh)

  def compile_decode_step(self, state, rows: int, prompt_len: int):
    """One decode step (a token for every row against a full cache), compiled on its own.

    Not used to sample: the generate executable runs the same model call inside its
    while loop, but XLA's cost analysis counts a loop body once, so per-token FLOPs and
    bytes of decoding are read from this executable (``sagc_jax.aot``).
    """
    graphdef, options = self.graphdef, self.options_for(rows)

    def decode_step(state, tokens, alive, cache):
      step_model = nnx.merge(graphdef, state)
      logits, cache = step_model(tokens[:, None], attention_mask=alive[:, None], cache=cache,
                                 options=options)
      return logits[:, -1].argmax(-1), cache

    cache = self.abstract_cache(rows, prompt_len)
    row1 = lambda dtype: self._spec((rows,), dtype, ("data",))
    inputs = (abstract_like(state), row1(jnp.int32), row1(jnp.bool_), cache)
    return decode.lower(decode_step, inputs, (row1(jnp.int32), cache), donate=(3,)).compile()

  def run(self, state, rows: int, prompt_len: int, tokens: np.ndarray, mask: np.ndarray,
          row_valid: np.ndarray, group_ids: np.ndarray, row_ids: np.ndarray, seed: int,
          listener: RolloutListener | None = None) -> tuple[dict[str, Any], float, int]:
    """One call on ``rows`` rows (inputs padded to it): ``(outputs, seconds, slots)`` as
    ``SegmentedDecoder.run``'s; ``listener`` works while it runs."""
    inputs = self._place((tokens, mask, row_valid, group_ids, row_ids, np.uint32(seed)),
                         self._abstract_inputs(rows, prompt_len))
    executable = self.compile(state, rows, prompt_len)
    stats_program = self.programs.get(("stats", rows))
    start = time.perf_counter()
    out = executable(state, *inputs)
    # The stats program queues behind the generate program on the group stats it leaves
    # on the devices; both are done (the callback delivered) when ``wait_for`` returns.
    out["stats"] = GroupLengthStats(*stats_program(*out["stats"]))
    out = wait_for(out, listener)
    return out, time.perf_counter() - start, rows * int(out["decode_steps"])
