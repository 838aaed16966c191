"""Per-group response-length statistics inside jit, and their host-side sink.

SAGC observes only each group's max and median response length. The sampler
computes them on the accelerator, right after decoding, over the *real* rows
of each group (padding rows of a row bucket never count), and ships them to
the host with ``jax.experimental.io_callback`` — the controller never needs the
full length vector, and the host sees the stats of every sampling round as it
finishes.

Group structure is data (``group_ids``), never a static G: one compiled
sampler serves every group size that maps to the same row bucket.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from sagc_jax.sampling.decode import lower


class GroupLengthStats(NamedTuple):
  """Per-group stats, padded to a static number of group slots.

  ``count[g] == 0`` marks an unused slot (its max/median are 0).
  """
  group_max: jax.Array      # [num_groups] float32
  group_median: jax.Array   # [num_groups] float32 (numpy's median: mean of the two middles)
  count: jax.Array          # [num_groups] int32, real rows per group


def group_length_stats(lengths: jax.Array, group_ids: jax.Array, row_valid: jax.Array,
                       num_groups: int) -> GroupLengthStats:
  """Max and median of ``lengths`` per group over rows with ``row_valid``.

  Args:
    lengths: [rows] int response lengths.
    group_ids: [rows] int in ``[0, num_groups)`` for real rows (any value for
      padding rows).
    row_valid: [rows] bool, False for padding rows.
    num_groups: static number of group slots.

  The median is computed without a static group size: rows are sorted by
  (group, length) with padding rows sent past every real group, so group g
  occupies the sorted slice ``[start_g, start_g + n_g)`` and its median is the
  mean of the elements at ``start_g + (n_g-1)//2`` and ``start_g + n_g//2``.
  """
  lengths = lengths.astype(jnp.int32)
  gid = jnp.where(row_valid, group_ids.astype(jnp.int32), num_groups)
  order = jnp.lexsort((lengths, gid))                   # primary key: gid
  sorted_lengths = lengths[order]
  count = jax.ops.segment_sum(row_valid.astype(jnp.int32), gid, num_segments=num_groups + 1)
  count = count[:num_groups]
  start = jnp.cumsum(count) - count
  last = lengths.shape[0] - 1
  lower = sorted_lengths[jnp.clip(start + (count - 1) // 2, 0, last)]
  upper = sorted_lengths[jnp.clip(start + count // 2, 0, last)]
  present = count > 0
  median = jnp.where(present, (lower + upper).astype(jnp.float32) / 2, 0.0)
  gmax = jax.ops.segment_max(jnp.where(row_valid, lengths, 0), gid, num_segments=num_groups + 1)
  gmax = jnp.where(present, gmax[:num_groups], 0).astype(jnp.float32)
  return GroupLengthStats(gmax, median, count)


def send_length_stats(sink: "LengthStatsSink", stats: GroupLengthStats) -> GroupLengthStats:
  """Sends ``stats`` to the host ``sink`` from inside jit and returns them.

  One ordered ``io_callback`` per sampler call, whichever sampler ran it: the
  controller sees each round's stats as the round finishes, without a device-to-host
  copy of the whole length vector.
  """
  io_callback(sink, None, *stats, ordered=True)
  return stats


Spec = Callable[[tuple, Any, tuple], jax.ShapeDtypeStruct]


def stats_inputs(rows: int, spec: Spec) -> tuple[jax.ShapeDtypeStruct, ...]:
  """The stats program's inputs for a ``rows``-row call: lengths, group ids, validity."""
  row1 = lambda dtype: spec((rows,), dtype, ("data",))
  return row1(jnp.int32), row1(jnp.int32), row1(jnp.bool_)


def stats_specs(rows: int, spec: Spec) -> GroupLengthStats:
  """Specs of the ``GroupLengthStats`` of a ``rows``-row call (replicated)."""
  shapes = jax.eval_shape(lambda *a: group_length_stats(*a, num_groups=rows),
                          *stats_inputs(rows, spec))
  return GroupLengthStats(*(spec(x.shape, x.dtype, ()) for x in shapes))


def lower_stats(sink: "LengthStatsSink", rows: int, spec: Spec) -> Any:
  """The lowered stats program of a ``rows``-row call: the row lengths (in output
  order), group ids and validity in; their ``group_length_stats`` to ``sink``.

  The segmented and refill samplers report through this small program, run right
  after their last decoding program (``programs.DecoderPrograms._result``: on the host
  lengths, placed as ``stats_inputs``; the fused sampler computes its
  stats in its model program and reports them with ``lower_report``), and never from a
  program that runs the model: JAX does not write a program that carries a host
  callback to the persistent compilation cache, so a restarted run reads every model
  program from the cache and compiles only these again. ``spec(shape, dtype, mesh
  axes)`` describes an input with the sampler's shardings.
  """
  def sampler_stats(lengths, group_ids, row_valid):
    return send_length_stats(sink, group_length_stats(lengths, group_ids, row_valid,
                                                      num_groups=rows))

  return lower(sampler_stats, stats_inputs(rows, spec), stats_specs(rows, spec))


def lower_report(sink: "LengthStatsSink", rows: int, spec: Spec) -> Any:
  """The lowered stats program of a decoding program that computed its group stats
  itself (the fused sampler): the ``GroupLengthStats`` of a ``rows``-row call in, the
  ordered callback to ``sink``, the same stats out (so waiting for them waits for the
  callback). The model program keeps the stats computation it always had and only the
  callback moves here: for the persistent compilation cache (``lower_stats``) and
  because XLA:TPU schedules the fused program's memory better with the stats inside.
  """
  def sampler_stats(group_max, group_median, count):
    return send_length_stats(sink, GroupLengthStats(group_max, group_median, count))

  specs = stats_specs(rows, spec)
  return lower(sampler_stats, tuple(specs), specs)


class LengthStatsSink:
  """Host end of the length-stats callback: buffers each sampling round's stats.

  The jitted sampler calls ``sink(group_max, group_median, count)`` through
  ``io_callback``; ``Sampler.generate`` calls ``pop()`` when its device calls are done
  and returns that call's real groups with its result (``SampleBatch.group_max`` /
  ``group_median``), which the trainer feeds to ``controller.observe``. Thread-safe:
  XLA may run host callbacks on its own threads.
  """

  def __init__(self):
    self._rounds: list[tuple[np.ndarray, np.ndarray]] = []
    self._lock = threading.Lock()

  def __call__(self, group_max, group_median, count) -> None:
    present = np.asarray(count) > 0
    gmax = np.asarray(group_max, dtype=np.float64)[present]
    gmed = np.asarray(group_median, dtype=np.float64)[present]
    with self._lock:
      self._rounds.append((gmax, gmed))

  def pending_rounds(self) -> int:
    with self._lock:
      return len(self._rounds)

  def pop(self) -> tuple[np.ndarray, np.ndarray]:
    """(group_max, group_median) of every round since the last pop, concatenated."""
    jax.effects_barrier()          # make sure every issued callback has run
    with self._lock:
      rounds, self._rounds = self._rounds, []
    if not rounds:
      return np.zeros(0), np.zeros(0)
    return (np.concatenate([r[0] for r in rounds]), np.concatenate([r[1] for r in rounds]))
