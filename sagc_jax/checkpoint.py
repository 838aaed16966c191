"""Orbax checkpoints of a training run, with fallback past a broken latest one.

One checkpoint holds the policy parameters, the optimizer state (both as pure
nested dicts of arrays, restored onto the live shardings) and a JSON ``meta``
item with everything else a resumed run needs to continue *exactly*: step,
controller state (posteriors, lambda, RNG), data-loader position, learner
counters, and the metrics history. Orbax writes each step into a temporary
directory and renames it when complete, so a save interrupted by a kill never
shows up as a step; a step whose files were later damaged fails to restore and
the previous step is used instead, with a message saying so.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

_ITEMS = ("params", "opt_state", "meta")


class Checkpointer:
  """Save / restore-latest for ``(params, opt_state, meta)`` under one directory."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3,
               log: Callable[[str], None] = print, *, read_only: bool = False):
    directory = os.fspath(directory)
    self.directory = directory if "://" in directory else os.path.abspath(directory)
    self.log = log
    options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else max_to_keep,
                                           create=not read_only,
                                           read_only=read_only,
                                           enable_async_checkpointing=not read_only)
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=_ITEMS)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, params: Any, opt_state: Any, meta: dict[str, Any]) -> None:
    """Starts an asynchronous save (call ``wait`` before exiting)."""
    self._manager.save(step, force=True, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
        meta=ocp.args.JsonSave(meta)))

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def restore_latest(self, abstract_params: Any, abstract_opt_state: Any
                     ) -> tuple[int, Any, Any, dict[str, Any]] | None:
    """Newest restorable ``(step, params, opt_state, meta)``, or None without checkpoints.

    The abstract targets (``jax.ShapeDtypeStruct`` with shardings) decide where
    the restored arrays live. Damaged steps are reported and skipped.
    """
    steps = self.all_steps()
    for step in reversed(steps):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params),
            opt_state=ocp.args.StandardRestore(abstract_opt_state),
            meta=ocp.args.JsonRestore()))
        meta = dict(restored.meta)
        if meta.get("step") != step:
          raise ValueError(f"meta says step {meta.get('step')!r}")
        jax.block_until_ready((restored.params, restored.opt_state))
      except Exception as err:  # noqa: BLE001 - any failure means "this step is unusable"
        moved = self._quarantine(step)
        message = (f"checkpoint step {step} in {self.directory} is corrupt or incomplete "
                   f"({type(err).__name__}: {str(err)[:200]}); moved it to {moved} and "
                   "trying the previous one")
        self.log(message)
        logging.warning(message)
        continue
      return step, restored.params, restored.opt_state, meta
    if steps:
      raise RuntimeError(f"none of the checkpoints {steps} in {self.directory} could be "
                         "restored (see the messages above); refusing to start over and "
                         "overwrite the run — move the directory away to start fresh")
    return None

  def restore_params(self, abstract_params: Any, step: int | None = None) -> tuple[int, Any]:
    """``(step, params)`` of ``step`` (default: the newest), reading nothing else.

    For readers of a run (export): a failure raises and nothing is moved.
    """
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoints in {self.directory}")
    step = steps[-1] if step is None else step
    if step not in steps:
      raise ValueError(f"step {step} is not among the checkpoints {steps} in {self.directory}")
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params)))
    return step, restored.params

  def _quarantine(self, step: int) -> str:
    """Renames a damaged step out of the manager's view, so that step can be saved again."""
    from etils import epath

    source = epath.Path(self.directory) / str(step)
    target = epath.Path(self.directory) / f"corrupt-{step}-{int(time.time())}"
    if jax.process_index() == 0 and source.exists():
      source.rename(target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"sagc_quarantine_{step}")
    self._manager.reload()
    return str(target)

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
