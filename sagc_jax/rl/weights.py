"""Where the learner's weights live: master-weight and optimizer-state shardings, casts.

The learner trains float32 master weights next to a model that may hold bfloat16 ones
(see ``Learner``). With ``fsdp`` the master weights, the Adam moments and the frozen
reference are split over the mesh's 'data' axis as well as 'model' (FSDP / ZeRO-3), so
each chip holds 1 / (data x model) of them; the moments always take exactly their
parameter's sharding. These helpers are pure functions of trees and a mesh; the casts
run ``step_fns.cast_params`` jitted, or stay abstract for an abstract model (AOT).
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sagc_jax.models import sharding as shd
from sagc_jax.rl import step_fns

__all__ = ["cast_program", "fsdp_names", "is_abstract", "like_params", "master_shardings",
           "optimizer_state", "to_dtype"]


def is_abstract(tree) -> bool:
  """Whether ``tree`` has ShapeDtypeStruct leaves (an abstract model: lower only)."""
  return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def fsdp_names(names: tuple, shape: tuple[int, ...], mesh: Mesh) -> tuple:
  """Adds 'data' to the largest dimension not already sharded (FSDP / ZeRO-3).

  A dimension qualifies only if it divides by the 'data' axis; vectors (norm
  scales, biases) stay as they are: they are tiny and gathering them is waste.
  """
  data = mesh.shape.get("data", 1)
  if data == 1 or len(shape) < 2:
    return names
  free = [i for i, n in enumerate(names) if n is None and shape[i] % data == 0]
  if not free:
    return names
  i = max(free, key=lambda j: shape[j])
  return tuple("data" if j == i else n for j, n in enumerate(names))


def master_shardings(model_params, mesh: Mesh | None, fsdp: bool):
  """Shardings of the master weights: the model's, plus 'data' with ``fsdp``; None
  without a mesh."""
  if mesh is None:
    return None
  if not fsdp:
    return jax.tree.map(lambda x: x.sharding, model_params)

  def with_data(x):
    names = tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
    names = shd.fit_spec(x.shape, fsdp_names(names, x.shape, mesh), mesh)
    return NamedSharding(mesh, P(*names))
  return jax.tree.map(with_data, model_params)


def like_params(tree, param_shardings, default):
  """Shardings for an optax state: subtrees shaped like the params get theirs, every
  other leaf (step counts) ``default``."""
  structure = jax.tree.structure(param_shardings)

  def is_param_tree(x):
    return jax.tree.structure(x) == structure
  return jax.tree.map(
      lambda x: param_shardings if is_param_tree(x) else
      jax.tree.map(lambda _: default, x), tree, is_leaf=is_param_tree)


def optimizer_state(tx, master, param_shardings, mesh: Mesh | None):
  """(``tx``'s state for the ``master`` weights, its shardings): subtrees shaped like the
  params (Adam's moments) take the params' shardings, other leaves are replicated.
  Abstract when ``master`` is; shardings None without a mesh."""
  shapes = jax.eval_shape(tx.init, shd.abstract_like(master))
  shardings = (None if mesh is None else
               like_params(shapes, param_shardings, NamedSharding(mesh, P())))
  if not is_abstract(master):
    init = jax.jit(tx.init, **({} if mesh is None else dict(out_shardings=shardings)))
    return init(master), shardings
  if shardings is None:
    return shapes, None
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings), shardings


def cast_program(shardings):
  """Jitted ``step_fns.cast_params`` (dtype static), output placed with ``shardings``."""
  return jax.jit(step_fns.cast_params, static_argnums=1,
                 **({} if shardings is None else dict(out_shardings=shardings)))


def to_dtype(params, dtype, shardings, *, copy: bool = False):
  """``params`` cast to ``dtype`` and placed with ``shardings`` (abstract if ``params``
  is); ``params`` itself when nothing would change and ``copy`` is False."""
  leaves = jax.tree.leaves(params)
  same_sharding = shardings is None or all(
      getattr(x, "sharding", None) == s for x, s in zip(leaves, jax.tree.leaves(shardings)))
  if all(x.dtype == dtype for x in leaves) and same_sharding and not copy:
    return params
  if is_abstract(params):
    if shardings is None:
      return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), params)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, dtype, sharding=s),
                        params, shardings)
  return cast_program(shardings)(params, dtype)
