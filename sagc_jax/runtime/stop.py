"""Stop signals: SIGTERM (preemption) or Ctrl-C ends a run within a bounded time, in
every phase, without losing what was finished.

Why. A Spot or preemptible TPU VM gets about 30 s between SIGTERM and the kill, and
a synchronous RL step at 8k-16k-token responses lasts minutes, most of it one long
rollout. Waiting for the step to end loses the step and everything since the last
checkpoint. So a signal is answered by the phase it arrives in:

* a phase whose work a resume simply redoes (data preparation, the warm start,
  compilation, an evaluation, an export, a step's rollout) is abandoned at once
  (``StopRequested`` is raised from the handler), and what was finished before it is
  checkpointed when it is not yet;
* a phase that must not be cut (a learner update, which overwrites donated weights;
  a checkpoint save) runs to its end, and the run stops after it.

A Python signal handler runs only when the main thread executes Python code. A main
thread waiting for a long XLA program (a rollout of minutes) must therefore wait in a
call that lets the handler run: ``jax.block_until_ready`` does (jaxlib 0.10 checks
for signals while it waits, so a SIGTERM ends the wait before the program does;
``tests/test_stop_guard.py``), ``np.asarray`` of a pending array does not (it waits
for the whole program). Every fetch of ``distributed.to_host`` first waits in ``wait_ready``.
XLA:CPU runs a program with host callbacks on the calling thread, where the handler
may run inside the callback: raised there, the stop would reach XLA as the
callback's error, so it is put off to the next wait.

Nothing else can guarantee the bound (a phase that cannot be cut may be long; on
several processes a peer may never reach the agreed stop), so ``StopGuard`` can arm a
watchdog at the first signal: after ``grace_s`` seconds it prints one line saying
what the newest checkpoint is and ends the process (``os._exit``). Only the command
line arms it; a run inside a notebook or a test keeps its interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, ContextManager, Iterator

__all__ = ["StopGuard", "StopRequested", "stoppable", "wait_ready"]

_installed: "StopGuard | None" = None        # the guard whose handlers are installed
WATCHDOG_EXIT_STATUS = 1


class StopRequested(BaseException):
  """Raised by the stop-signal handler inside a phase it may end at once.

  A ``BaseException``, like ``KeyboardInterrupt``: the ``except Exception`` of library
  code it passes through (orbax's restore, which would file the step as damaged; a
  verifier, which would score the row wrong) must not take it for an error of its own.
  ``phase`` names the phase; read it rather than the message, which a library the
  exception passes through may have extended (TFDS prepends the example it was
  encoding)."""

  def __init__(self, phase: str):
    super().__init__(phase)
    self.phase = phase


class StopGuard:
  """SIGTERM / SIGINT handling of one run, from its first line of work to its end.

  ``stoppable(phase, when)`` marks a phase that a signal ends at once (when ``when()``
  is true at the signal, or always without ``when``); outside such a phase the signal
  is recorded (``requested``) and the run stops at its next safe point. A second Ctrl-C
  raises ``KeyboardInterrupt`` at once (Python's own handler is put back).
  """

  def __init__(self, log: Callable[[str], None] | None = None, *,
               grace_s: float | None = None,
               describe_state: Callable[[], str] | None = None):
    """``log``: where the handler's lines go (default ``write_now`` to stdout);
    ``grace_s``: arm the watchdog (``os._exit`` that many seconds after the first
    signal); ``describe_state()``: what its last line says is kept (the newest
    checkpoint)."""
    self.log = log or write_now
    self.grace_s = grace_s
    self.describe_state = describe_state or (lambda: "")
    self.requested = False
    self.signal_name: str | None = None
    self._phase: tuple[str, Callable[[], bool] | None] | None = None
    self._deferred: str | None = None    # a stop that arrived inside a host callback
    self._previous: dict[int, Any] = {}

  # ----------------------------------------------------------------- install
  def install(self) -> "StopGuard":
    """Takes over SIGTERM and SIGINT (main thread only; elsewhere it does nothing)."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
      return self
    self._previous = {sig: signal.signal(sig, self._on_signal)
                      for sig in (signal.SIGTERM, signal.SIGINT)}
    _installed = self
    return self

  def uninstall(self) -> None:
    global _installed
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
    if _installed is self:
      _installed = None

  # ------------------------------------------------------------------ phases
  @property
  def phase(self) -> str | None:
    return None if self._phase is None else self._phase[0]

  @contextlib.contextmanager
  def stoppable(self, phase: str, when: Callable[[], bool] | None = None) -> Iterator[None]:
    """A phase a stop signal ends at once (``StopRequested(phase)``), if ``when()``
    holds then; a signal that came before the phase began ends it on entry."""
    if self.requested and (when is None or when()):
      raise StopRequested(phase)
    outer, self._phase = self._phase, (phase, when)
    try:
      yield
    finally:
      self._phase = outer
      self._deferred = None

  def raise_if_deferred(self) -> None:
    """Raises the ``StopRequested`` a signal inside a host callback put off."""
    if self._deferred is not None and self._phase is not None:
      phase, self._deferred = self._deferred, None
      raise StopRequested(phase)

  def _on_signal(self, signum: int, frame: Any) -> None:
    name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
    first = not self.requested
    self.requested = True
    if first:
      self.signal_name = name
      if self.grace_s:
        self._arm_watchdog()
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.default_int_handler)
    if self._phase is not None:
      phase, when = self._phase
      if when is None or when():
        self.log(f"{name} received during {phase}: stopping now")
        if _in_host_callback(frame):
          # Raised there, it would reach XLA as the callback's error, not the run.
          self._deferred = phase
          return
        raise StopRequested(phase)
      self.log(f"{name} received during {phase}: stopping when it ends")
    elif first:
      self.log(f"{name} received: checkpointing after the current step")
    if signum == signal.SIGINT:
      self.log("(Ctrl-C again to stop at once, losing the steps since the last checkpoint)")

  def _arm_watchdog(self) -> None:
    deadline = self.grace_s

    def expire():
      time.sleep(deadline)
      where = f" (in {self.phase})" if self.phase else ""
      state = self.describe_state()
      print(f"error: the run did not stop within train.stop_grace_s={deadline:g} s of "
            f"{self.signal_name}{where}; exiting now (exit {WATCHDOG_EXIT_STATUS})."
            + (f" {state}" if state else ""), file=sys.stderr, flush=True)
      sys.stdout.flush()
      os._exit(WATCHDOG_EXIT_STATUS)
    threading.Thread(target=expire, name="stop-watchdog", daemon=True).start()


def write_now(message: str, prefix: str = "") -> None:
  """One line on the process's stdout straight to its file descriptor. The handler runs
  between any two bytecodes of the main thread, maybe inside a ``write`` of the same
  stream, where a second buffered write raises "reentrant call inside BufferedWriter";
  and ``sys.stdout`` may be redirected at that moment (TFDS' output is silenced while
  it prepares data), so the interpreter's own stdout is used."""
  line = f"{prefix}{message}\n"
  stream = sys.__stdout__ or sys.stdout
  try:
    fd = stream.fileno()
  except (AttributeError, OSError, ValueError):   # a stream without a file
    print(line, end="", flush=True)
    return
  try:
    stream.flush()
  except RuntimeError:            # the main thread is inside a write: do not wait on it
    pass
  os.write(fd, line.encode())


def _in_host_callback(frame: Any) -> bool:
  """The main thread is running a JAX host callback (XLA:CPU runs a program with
  callbacks on the calling thread)."""
  marker = os.path.join("jax", "_src", "callback.py")
  while frame is not None:
    if frame.f_code.co_filename.endswith(marker):
      return True
    frame = frame.f_back
  return False


def stoppable(phase: str, when: Callable[[], bool] | None = None) -> ContextManager[None]:
  """``StopGuard.stoppable`` of the installed guard; nothing without one (a library
  call outside a run)."""
  return contextlib.nullcontext() if _installed is None else _installed.stoppable(phase, when)


def wait_ready(tree: Any) -> None:
  """Blocks until every JAX array in ``tree`` is computed, in a wait a stop signal can
  interrupt (see the module docstring), then raises a stop a host callback put off.
  Without an installed guard, or off the main thread, it returns at once."""
  guard = _installed
  if guard is None or threading.current_thread() is not threading.main_thread():
    return
  guard.raise_if_deferred()
  import jax
  jax.block_until_ready([x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)])
  guard.raise_if_deferred()
