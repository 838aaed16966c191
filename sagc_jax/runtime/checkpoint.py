"""Orbax checkpoints of a training run, with fallback past a broken latest one.

One checkpoint holds the policy parameters, the optimizer state (both as pure
nested dicts of arrays, restored onto the live shardings) and a JSON ``meta``
item with everything else a resumed run needs to continue *exactly*: step,
controller state (posteriors, lambda, RNG), data-loader position, learner
counters, and the metrics history. Orbax writes each step into a temporary
directory and renames it when complete, so a save interrupted by a kill never
shows up as a step; a step whose files were later damaged (or whose weights
restore non-finite) is moved aside as ``corrupt-<step>-<time>`` and the previous
step is used instead, with a message saying so.

Damage that still reads as finite numbers (a disk or copy fault, bytes overwritten in
place) is caught by content checksums: at save, two position-weighted 32-bit sums of
every array's bits, computed on the devices where the arrays live (``tree_checksums``),
go into ``meta``; at restore they are recomputed from the restored arrays, and a step
whose sums differ is treated as damaged like an unreadable one, naming the array.

A checkpoint that reads fine but does not fit this run (another model, other
shapes) is not damage but a config mistake: ``CheckpointMismatch`` names what
differs and nothing in the directory is touched. A directory whose only steps were
moved aside is never silently started over.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from sagc_jax.runtime.distributed import barrier, to_host
from sagc_jax.runtime.storage import run_path

_QUARANTINE_PREFIX = "corrupt-"


class CheckpointWriteError(RuntimeError):
  """A background checkpoint write failed (disk full, permissions, a vanished path).

  Orbax reports it only when someone waits on the save, and leaves non-daemon
  threads waiting forever for the failed save's signals: a process that hits this
  must end with ``os._exit`` (``sagc_jax.train`` does), or it never exits.
  """


class CheckpointMismatch(ValueError):
  """The checkpoint's arrays do not match this run's: a config change, not damage."""


def _leaf_paths(tree: Any) -> list[tuple[str, Any]]:
  """``("a/b/kernel", leaf)`` of every leaf of a tree, in flatten order."""
  return [(jax.tree_util.keystr(path, simple=True, separator="/"), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _listed(label: str, entries: list[str], limit: int) -> str:
  """``label: a, b (+n more)`` naming at most ``limit`` entries ('' without any)."""
  more = f" (+{len(entries) - limit} more)" if len(entries) > limit else ""
  return f"{label}: {', '.join(entries[:limit])}{more}" if entries else ""


def _leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """``{"a/b/kernel": shape}`` of a tree of arrays, abstract arrays or orbax metadata."""
  return {path: tuple(getattr(leaf, "shape", ()) or ()) for path, leaf in _leaf_paths(tree)}


def _describe_mismatch(saved: Any, wanted: Any, item: str, limit: int = 4) -> str | None:
  """What differs between a saved tree and this run's (None when they match)."""
  saved_shapes, wanted_shapes = _leaf_shapes(saved), _leaf_shapes(wanted)
  if item != "params":
    # Optimizer states may be saved as dicts and restored as NamedTuples: compare
    # the arrays' shapes, not their paths.
    if sorted(saved_shapes.values()) == sorted(wanted_shapes.values()):
      return None
    return (f"{item}: {len(saved_shapes)} saved arrays vs {len(wanted_shapes)} in this run, "
            "with different shapes")
  differ = [f"{k} saved {saved_shapes[k]} vs run {wanted_shapes[k]}"
            for k in sorted(wanted_shapes.keys() & saved_shapes.keys())
            if saved_shapes[k] != wanted_shapes[k]]
  parts = (_listed("shapes differ", differ, limit),
           _listed("not in the checkpoint", sorted(wanted_shapes.keys() - saved_shapes.keys()),
                   limit),
           _listed("only in the checkpoint", sorted(saved_shapes.keys() - wanted_shapes.keys()),
                   limit))
  return "; ".join(part for part in parts if part) or None


def _bits(x: jax.Array) -> jax.Array:
  """Each element's bit pattern as uint32 (8-byte elements: the xor of their halves)."""
  size = jnp.dtype(x.dtype).itemsize
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if size == 8:
    halves = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return halves[..., 0] ^ halves[..., 1]
  unsigned = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[size]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_checksum(x: jax.Array) -> jax.Array:
  """[2] uint32: sums of the bits weighted by odd functions of the flat position
  (modular sums are exact in any reduction order, so shardings agree)."""
  bits = _bits(x)
  index = jnp.zeros(bits.shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(bits.ndim)):      # row-major flat index, without a reshape
    index = index + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, dim) * jnp.uint32(stride)
    stride *= bits.shape[dim]
  first = jnp.sum(bits * (index * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)
  second = jnp.sum((bits ^ jnp.uint32(0x5BD1E995)) * (index * jnp.uint32(0x9E3779B1)
                                                     + jnp.uint32(0x632BE5AB)),
                   dtype=jnp.uint32)
  return jnp.stack([first, second])


_checksum_programs: dict[Any, Any] = {}


def _checksum_program(leaves: list) -> Any:
  """The compiled checksum program of these leaves' shapes, dtypes and shardings."""
  key = tuple((x.shape, str(x.dtype), getattr(x, "sharding", None)) for x in leaves)
  if key not in _checksum_programs:
    _checksum_programs[key] = jax.jit(lambda xs: jnp.stack([_leaf_checksum(x) for x in xs])
                                      ).lower(leaves).compile()
  return _checksum_programs[key]


def tree_checksums(tree: Any) -> list[list[int]]:
  """``[[a, b], ...]``: ``_leaf_checksum`` of every leaf of ``tree``, in flatten order.

  One compiled program per tree structure and shapes (``prepare_checksums`` compiles
  it ahead, so a run's first save compiles nothing).
  """
  leaves = list(jax.tree.leaves(tree))
  if not leaves:
    return []
  return to_host(_checksum_program(leaves)(leaves)).astype(int).tolist()


def prepare_checksums(*abstract_trees: Any) -> None:
  """Compiles the checksum program of each tree (``jax.ShapeDtypeStruct`` leaves with
  shardings) so that saving later compiles nothing."""
  for tree in abstract_trees:
    leaves = list(jax.tree.leaves(tree))
    if leaves:
      _checksum_program(leaves)


def checksum_mismatch(tree: Any, saved: list[list[int]], item: str) -> str | None:
  """Which array of ``tree`` no longer has its saved checksums (None: all match)."""
  now = tree_checksums(tree)
  if len(now) != len(saved):
    return f"{item}: {len(now)} arrays restored, {len(saved)} checksummed at save"
  bad = [path for (path, _), a, b in zip(_leaf_paths(tree), now, saved) if list(a) != list(b)]
  if not bad:
    return None
  more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
  return (f"the content checksum of {item}/{', '.join(bad[:3])}{more} differs from the one "
          "written at save")


def _verify(restored: Any, sums: dict[str, Any] | None, items: tuple[str, ...]) -> None:
  """Raises ``ValueError`` naming the damage of a restored step: an item of ``items``
  whose content checksums (when saved) differ, or weights that are not finite."""
  for item in items if sums else ():
    problem = checksum_mismatch(getattr(restored, item), sums[item], item)
    if problem:
      raise ValueError(problem)
  if not all_finite(restored.params):
    raise ValueError("its weights restored with NaN or inf values")


def all_finite(tree: Any) -> bool:
  """True when every floating leaf of ``tree`` is finite (a restored state worth using)."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
  return all(bool(jnp.isfinite(x).all()) for x in leaves)


class Checkpointer:
  """Save / restore-latest for ``(params, opt_state, meta)`` under one directory."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3,
               log: Callable[[str], None] = print, *, read_only: bool = False):
    directory = os.fspath(directory)
    self.directory = directory if "://" in directory else os.path.abspath(directory)
    self.log = log
    self.read_only = read_only
    self.max_to_keep = max_to_keep
    # The newest step restored with matching checksums: never rotated out, however many
    # newer ones are saved, until a newer one has verified the same way (a resume).
    self.verified_step: int | None = None
    # Handlers named up front (not inferred at the first save) so that a manager that
    # only restores can read each step's array metadata before restoring it.
    handlers = {"params": ocp.StandardCheckpointHandler(),
                "opt_state": ocp.StandardCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler()}
    # A reader asked for read-only on purpose: orbax's two warnings that it is ("Given
    # directory is read only", "setting save_interval_steps=0") would read as a fault.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR if read_only else level)
    try:
      # Rotation is ours (``_rotate``), so that the verified step stays.
      # A writer removes the <step>.orbax-checkpoint-tmp folders of saves cut short (a
      # kill, the stop deadline) when it starts, not only when that step is saved again.
      options = ocp.CheckpointManagerOptions(max_to_keep=None, create=not read_only,
                                             read_only=read_only,
                                             enable_async_checkpointing=not read_only,
                                             cleanup_tmp_directories=not read_only)
      self._manager = ocp.CheckpointManager(self.directory, options=options,
                                            item_handlers=handlers)
    finally:
      absl_logger.setLevel(level)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, params: Any, opt_state: Any, meta: dict[str, Any]) -> None:
    """Starts an asynchronous save (call ``wait`` before exiting); first raises
    ``CheckpointWriteError`` if the previous one failed."""
    self.wait()
    meta = dict(meta, checksums={"params": tree_checksums(params),
                                 "opt_state": tree_checksums(opt_state)})
    self._manager.save(step, force=True, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
        meta=ocp.args.JsonSave(meta)))

  def wait(self) -> None:
    """Blocks until the background save is written; raises ``CheckpointWriteError``."""
    try:
      self._manager.wait_until_finished()
    except Exception as err:  # noqa: BLE001 - orbax re-raises the writer's own error
      raise CheckpointWriteError(
          f"writing a checkpoint to {self.directory} failed ({type(err).__name__}: "
          f"{str(err)[:300]}); stopping. The newest complete step is still there: free "
          "space or fix the path, then resume") from err
    self._rotate()

  def _rotate(self) -> None:
    """Deletes all but the newest ``max_to_keep`` complete steps, and the verified one."""
    if self.read_only or not self.max_to_keep:
      return
    steps = self.all_steps()
    for step in steps[:-self.max_to_keep]:
      if step != self.verified_step:
        self._manager.delete(step)

  def saving(self) -> bool:
    """A background save is still being written."""
    return self._manager.is_saving_in_progress()

  def check(self) -> None:
    """``wait`` without blocking: raises if a finished background save failed, returns
    at once while one is still being written (called after every training step)."""
    if not self._manager.is_saving_in_progress():
      self.wait()

  def restore_latest(self, abstract_params: Any, abstract_opt_state: Any
                     ) -> tuple[int, Any, Any, dict[str, Any]] | None:
    """Newest restorable ``(step, params, opt_state, meta)``, or None without checkpoints.

    The abstract targets (``jax.ShapeDtypeStruct`` with shardings) decide where
    the restored arrays live. Damaged steps (unreadable, or non-finite weights) are
    reported, moved aside and skipped; a step that does not match the targets raises
    ``CheckpointMismatch`` and nothing is moved.
    """
    steps = self.all_steps()
    moved_aside = [] if steps else self.quarantined()
    if moved_aside:
      raise RuntimeError(
          f"{self.directory} holds no usable checkpoint but damaged ones were moved aside "
          f"({', '.join(moved_aside)}); refusing to start over and overwrite the run. "
          f"To start fresh on purpose, move {self.directory} away (or delete the "
          f"{_QUARANTINE_PREFIX}* folders)")
    for step in reversed(steps):
      try:
        saved = self._manager.item_metadata(step)
      except Exception as err:  # noqa: BLE001 - unreadable metadata is damage
        self._skip_damaged(step, err)
        continue
      for item, wanted in (("params", abstract_params), ("opt_state", abstract_opt_state)):
        saved_item = saved[item] if item in saved.keys() else None
        tree = getattr(saved_item, "tree", saved_item)
        problem = None if tree is None else _describe_mismatch(tree, wanted, item)
        if problem:
          raise CheckpointMismatch(
              f"checkpoint step {step} in {self.directory} does not match this run "
              f"({problem}). Was the model (model.path) or the optimizer changed? Resume "
              "with the run's original config, or start a new run in another workdir; "
              "the checkpoints were left as they are")
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params),
            opt_state=ocp.args.StandardRestore(abstract_opt_state),
            meta=ocp.args.JsonRestore()))
        meta = dict(restored.meta)
        if meta.get("step") != step:
          raise ValueError(f"meta says step {meta.get('step')!r}")
        jax.block_until_ready((restored.params, restored.opt_state))
        # The checksums first: they name the damaged array (garbage in a compressed
        # data file mostly decodes to NaN / inf, which the finiteness check cannot name).
        sums = meta.pop("checksums", None)        # absent in checkpoints from before them
        _verify(restored, sums, ("params", "opt_state"))
        if sums:
          self.verified_step = step
      except Exception as err:  # noqa: BLE001 - any failure here means "this step is damaged"
        self._skip_damaged(step, err)
        continue
      return step, restored.params, restored.opt_state, meta
    if steps:
      raise RuntimeError(f"none of the checkpoints {steps} in {self.directory} could be "
                         "restored (see the messages above); refusing to start over and "
                         "overwrite the run — move the directory away to start fresh")
    return None

  def restore_params(self, abstract_params: Any, step: int | None = None) -> tuple[int, Any]:
    """``(step, params)`` of checkpoint ``step``, reading only them and the step's small
    JSON item (their checksums, verified, as is their finiteness).

    For readers of a run (eval, export): nothing is moved. Without ``step``, the newest
    step that verifies is used; older ones are tried when a newer one is damaged (each
    failure is logged). A given ``step`` must restore or it raises ``ValueError``.
    """
    steps = self.all_steps()
    candidates = [step] if step is not None else steps[::-1]
    if not candidates:
      raise FileNotFoundError(f"no checkpoints in {self.directory}")
    for candidate in candidates:
      try:
        if candidate not in steps:
          raise ValueError(f"step {candidate} is not among the checkpoints {steps} in "
                           f"{self.directory}")
        restored = self._manager.restore(candidate, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()))
        _verify(restored, dict(restored.meta).get("checksums"), ("params",))
        return candidate, restored.params
      except Exception as err:  # noqa: BLE001 - a damaged step: try the previous one
        why = f"{type(err).__name__}: {str(err)[:300]}"
        if candidate == candidates[-1]:
          others = [s for s in steps if s != candidate]
          raise ValueError(f"checkpoint step {candidate} in {self.directory} cannot be used "
                           f"({why})" + (f"; the run's other steps: {others}" if others
                                         else "")) from None
        self.log(f"checkpoint step {candidate} in {self.directory} could not be used ({why}); "
                 "trying the previous one")

  def _skip_damaged(self, step: int, err: Exception) -> None:
    """Moves a damaged step aside (``restore_latest``, the run's writer)."""
    self.log(f"checkpoint step {step} in {self.directory} is corrupt or incomplete "
             f"({type(err).__name__}: {str(err)[:200]}); moved it to {self._quarantine(step)} "
             "and trying the previous one")

  def quarantined(self) -> list[str]:
    """Names of the damaged steps moved aside in this directory."""
    root = run_path(self.directory)
    if not root.exists():
      return []
    return sorted(p.name for p in root.iterdir() if p.name.startswith(_QUARANTINE_PREFIX))

  def _quarantine(self, step: int) -> str:
    """Renames a damaged step out of the manager's view, so that step can be saved again."""
    source = run_path(self.directory) / str(step)
    target = run_path(self.directory) / f"{_QUARANTINE_PREFIX}{step}-{int(time.time())}"
    if jax.process_index() == 0 and source.exists():
      source.rename(target)
    barrier(f"sagc_quarantine_{step}")
    self._manager.reload()
    return str(target)

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._manager.close()
