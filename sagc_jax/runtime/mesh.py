"""Device mesh from the config: ``('data', 'model')`` axes with Auto sharding.

``jax.make_mesh`` defaults to Explicit axes in this JAX version, which breaks
nnx matmuls on annotated parameters, so the axes are created as ``Auto``
(classic GSPMD propagation). One size may be -1: all remaining devices.
A single-process run may ask for fewer devices than it has.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax


def make_mesh(shape: Sequence[int], axes: Sequence[str]) -> jax.sharding.Mesh:
  shape = list(shape)
  devices = jax.device_count()
  if shape.count(-1) == 1:
    known = math.prod(s for s in shape if s != -1)
    if devices % known:
      raise ValueError(f"mesh.shape={tuple(shape)}: {devices} devices do not divide by "
                       f"the fixed axes ({known})")
    shape[shape.index(-1)] = devices // known
  needed = math.prod(shape)
  if needed > devices or (needed < devices and jax.process_count() > 1):
    raise ValueError(f"mesh.shape={tuple(shape)} needs {needed} devices, this run has "
                     f"{devices}" + (" (a multi-process run must use them all)"
                                     if jax.process_count() > 1 else ""))
  # A single process may run on a prefix of its devices (e.g. tests on fake CPU devices).
  return jax.make_mesh(tuple(shape), tuple(axes), devices=jax.devices()[:needed],
                       axis_types=(jax.sharding.AxisType.Auto,) * len(axes))
