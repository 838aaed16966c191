"""The shape ladders every compiled component pads to.

A jitted program compiles once per input shape, so the sampler and the learner pad
their inputs to a few fixed sizes and compile each ahead of time. Two helpers are
shared by both: the smallest bucket that holds a value, and a geometric ladder of
row counts.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["row_ladder", "smallest_bucket"]


def smallest_bucket(value: int, buckets: Sequence[int], what: str, kind: str = "bucket") -> int:
  """The smallest of ``buckets`` that is >= ``value``.

  A value beyond the largest is a ``ValueError`` naming ``what``, the value, the
  largest ``kind`` and every bucket (a shape no compiled program holds).
  """
  ordered = sorted(buckets)
  for size in ordered:
    if value <= size:
      return size
  raise ValueError(f"{what}={value} exceeds the largest {kind} {ordered[-1]} "
                   f"({kind}s: {tuple(ordered)})")


def row_ladder(top: int, base: int, factor: int = 2) -> tuple[int, ...]:
  """Row counts ``base, base * factor, base * factor**2, ...`` below ``top``, and ``top``.

  The learner's microbatch rows (``base``: the mesh's 'data' axis, doubled) and the
  segmented sampler's compaction targets (``top`` divided by 4 down to ``base``) are
  both such ladders: few executables, every rung a whole multiple of ``base``.
  """
  if base < 1 or factor < 2 or top < base or top % base:
    raise ValueError(f"row_ladder: top={top} must be a multiple of base={base} >= 1 "
                     f"(factor={factor} >= 2)")
  rungs, r = {top}, base
  while r < top:
    rungs.add(r)
    r *= factor
  return tuple(sorted(rungs))
