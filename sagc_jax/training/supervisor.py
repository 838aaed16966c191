"""A run's duties toward its process and its run directory, apart from training.

``Supervisor`` owns the lock that keeps a second trainer off the run directory
(``runtime.run_lock``), the stop signals (SIGTERM, a first Ctrl-C: ``runtime.stop``)
and the agreement of every process on when to stop, the Weights & Biases run and the
policy exports. The training loop asks it two things: may this phase stop at once
(``stoppable``), and did any process receive a signal (``agree_on_stop``).

A phase that a stop signal ends at once is one whose work a resume redoes (start-up,
warm-up, evaluations, a step's rollout, an export); the others run to their end
first. On a pod every process must leave the step loop at the same point, so there
the signal waits for the step's end (``train.stop_grace_s`` bounds the wait).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax

from sagc_jax.runtime import distributed
from sagc_jax.runtime.run_lock import RunLock
from sagc_jax.runtime.stop import StopGuard, write_now
from sagc_jax.training.export import base_folder, write_hf_folder
from sagc_jax.training.wandb_run import start_wandb

__all__ = ["Supervisor"]


class Supervisor:
  """The run directory's lock, stop signals, W&B and exports of one trainer."""

  def __init__(self, config: Any, workdir: Any, *, stop_deadline: bool,
               describe_state: Callable[[], str], log: Callable[[str], None]):
    self.config, self.workdir = config, workdir
    self.is_primary = jax.process_index() == 0
    self.log = log
    self._lock = None
    prefix = f"[process {jax.process_index()}] " if jax.process_index() else ""
    self.guard = StopGuard(lambda message: write_now(message, prefix),
                           grace_s=(config.train.stop_grace_s or None) if stop_deadline
                           else None,
                           describe_state=describe_state)

  def start(self) -> None:
    """Handles stop signals from here to ``close`` and takes the run directory's lock."""
    self.guard.install()
    self.workdir.mkdir(parents=True, exist_ok=True)
    if self.is_primary:         # before anything in the workdir is written
      self._lock = RunLock(self.workdir, log=self.log)
      self._lock.acquire()

  def stoppable(self, phase: str, when: Callable[[], bool] | None = None, *,
                every_process: bool = False):
    """A phase that a stop signal ends at once (``StopRequested``) instead of after it,
    when ``when()`` holds (default: always). Inside the step loop only on a single
    process (module docstring). Phases before the first step (``every_process``) hold
    nothing new, and stop at once on every process that receives the signal."""
    alone = every_process or not distributed.is_multiprocess()
    return self.guard.stoppable(phase, when=lambda: alone and (when is None or when()))

  def agree_on_stop(self, log: Callable[[str], None]) -> bool:
    """True on every process if any received a stop signal (all must call it)."""
    stop = distributed.any_on_all(self.guard.requested)
    if stop and not self.guard.requested:
      log("another process received a stop signal: checkpointing and stopping with it")
    return stop

  def attach_wandb(self, metrics: Any, local_dir: Any, *, resumed: bool,
                   log: Callable[[str], None]) -> None:
    if self.config.train.wandb_project and self.is_primary:
      metrics.attach_wandb(start_wandb(self.config, self.workdir, local_dir, resumed=resumed,
                                       log=log))

  def export_policy(self, model: Any, model_cfg: Any, step: int,
                    log: Callable[[str], None]) -> str:
    """Writes the policy as a Hugging Face folder (``train.export_every``):
    ``<train.export_dir or workdir/exports>/step_<N>``, replaced when a resumed run
    reaches the same step again. Every process must call it (weights are gathered)."""
    root = self.config.train.export_dir or os.fspath(self.workdir / "exports")
    out = f"{root.rstrip('/')}/step_{step}"
    start = time.perf_counter()
    # Only process 0 writes (and copies the starting folder's files); all gather.
    folder = base_folder(self.config, os.fspath(self.workdir)) if self.is_primary else None
    write_hf_folder(model, model_cfg, folder, out, replace=True)
    log(f"step {step}: exported the policy to {out} ({time.perf_counter() - start:.1f} s)")
    return out

  def close(self) -> None:
    """Stops handling signals and releases the lock (idempotent)."""
    self.guard.uninstall()
    if self._lock is not None:
      self._lock.release()
      self._lock = None
