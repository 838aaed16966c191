"""What the three decoders (fused, segmented, refill) share: what their programs are
built from, the program cache keyed by shape, and the stats program of each call.

A decoder's program of key ``(kind, *shape)`` is lowered by its ``_lower_<kind>(state,
*shape)``; every decoder reports a call's per-group lengths through the ``stats``
program of its call rows (``group_stats.lower_stats``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.transformer import ForwardOptions
from sagc_jax.runtime.compilation import ProgramCache
from sagc_jax.runtime.distributed import to_host
from sagc_jax.sampling import decode
from sagc_jax.sampling.group_stats import LengthStatsSink, lower_stats, stats_inputs
from sagc_jax.sampling.params import SamplingParams

__all__ = ["DecoderPrograms"]


class DecoderPrograms:
  """The programs of one decoder for one model architecture, keyed by shape.

  It receives what its programs are built from, not the ``Sampler`` that owns it
  (which imports the decoders, never the reverse):

  Args:
    graphdef: the model's graph (``nnx.split``); parameters come with every call.
    params: ``SamplingParams`` (every decoder samples the same tokens).
    cfg: the model config (the cache's shape).
    cache_dtype: KV cache dtype.
    mesh: optional mesh (rows on 'data').
    options_for: the ``ForwardOptions`` of a pass over a given row count, with that
      row count's cache layout pinned (the sampler's own).
    sink: host sink of the per-group length stats.
  """

  def __init__(self, graphdef: nnx.GraphDef, params: SamplingParams, cfg: ModelConfig, *,
               cache_dtype: Any, mesh: Mesh | None,
               options_for: Callable[[int], ForwardOptions], sink: LengthStatsSink):
    self.graphdef, self.params, self.cfg = graphdef, params, cfg
    self.cache_dtype, self.mesh, self.options_for, self.sink = cache_dtype, mesh, options_for, sink
    self.programs = ProgramCache(self._lower)

  def _spec(self, shape, dtype, names=()) -> jax.ShapeDtypeStruct:
    return decode.sharded_spec(self.mesh, shape, dtype, names)

  def _place(self, values, specs) -> list:
    """Host inputs placed as their specs say (``decode.place``)."""
    return [decode.place(x, s.sharding) for x, s in zip(values, specs)]

  def _lower(self, key: tuple, state=None):
    kind, *shape = key
    return getattr(self, f"_lower_{kind}")(state, *shape)

  def _lower_stats(self, state, rows: int):
    return lower_stats(self.sink, rows, self._spec)

  def _result(self, rows: int, tokens, logprobs, lengths, steps: int, group_ids, row_valid
              ) -> dict[str, Any]:
    """A call's host outputs, the stats program run on its lengths (which sends them to
    the sink): the fields of the fused program's outputs (tokens, logprobs, lengths,
    decode_steps, stats)."""
    inputs = self._place((lengths, group_ids, row_valid), stats_inputs(rows, self._spec))
    stats = to_host(self.programs.get(("stats", rows))(*inputs))
    return dict(tokens=tokens, logprobs=logprobs, lengths=lengths,
                decode_steps=np.int32(steps), stats=stats)
