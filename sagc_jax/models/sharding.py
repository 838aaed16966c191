"""Fits the model's sharding annotations to a concrete mesh.

Parameters are annotated with mesh axis names (``'model'`` for attention heads, MLP
hidden units and vocabulary rows; ``'data'`` for batch dimensions of activations and
caches). A mesh may lack one of those axes, or a dimension may not divide by the axis
size (2 KV heads on a 4-way ``model`` axis, a 151 936-row vocabulary on 3 devices); JAX
refuses uneven shardings, so such dimensions are replicated instead. The fitted spec is
also written back into the variable's ``out_sharding`` metadata so that later
``nnx.get_named_sharding`` calls (jit in/out shardings) agree with the actual placement.
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["abstract_like", "fit_spec", "named_sharding"]

AxisNames = Sequence[str | tuple[str, ...] | None]


def fit_spec(shape: Sequence[int], names: AxisNames | None, mesh: Mesh) -> tuple:
  """Per-dimension axis names with every unusable entry replaced by None."""
  if names is None:
    return (None,) * len(shape)
  if len(names) != len(shape):
    raise ValueError(f"sharding names {tuple(names)} do not match shape {tuple(shape)}")
  fitted = []
  for size, name in zip(shape, names):
    axes = (name,) if isinstance(name, str) else tuple(name or ())
    if not axes or any(a not in mesh.shape for a in axes):
      fitted.append(None)
      continue
    ways = 1
    for a in axes:
      ways *= mesh.shape[a]
    fitted.append(name if size % ways == 0 else None)
  return tuple(fitted)


def named_sharding(shape: Sequence[int], names: AxisNames | None, mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec(*fit_spec(shape, names, mesh)))



def abstract_like(tree):
  """ShapeDtypeStructs (with each leaf's sharding, if it has one) for ``jit.lower``."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=getattr(x, "sharding", None)),
                      tree)
