"""The stop-signal guard (``runtime.stop``): a signal ends a stoppable phase at once,
also while the main thread waits for a running XLA program; a phase that must not be
cut finishes first; a signal inside a host callback is raised after it, not into XLA;
a second Ctrl-C interrupts at once; the command line's watchdog ends a run that did
not stop in time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sagc_jax.runtime import stop
from sagc_jax.runtime.distributed import to_host


@jax.jit
def _spin(x, iterations):
  """A program without host callbacks (XLA:CPU dispatches it asynchronously) that
  runs ``iterations`` small matmuls: a stand-in for a long rollout."""
  body = lambda c: (c[0] + 1, jnp.tanh(c[1] @ c[1]))
  return jax.lax.while_loop(lambda c: c[0] < iterations, body, (0, x))[1]


def _seconds_per_iteration() -> float:
  x = jnp.full((128, 128), 0.01)
  _spin(x, 1).block_until_ready()
  start = time.perf_counter()
  _spin(x, 2000).block_until_ready()
  return (time.perf_counter() - start) / 2000


_TIMERS: list[threading.Timer] = []


@pytest.fixture
def guard():
  messages: list[str] = []
  g = stop.StopGuard(log=messages.append).install()
  g.messages = messages
  try:
    yield g
  finally:
    for timer in _TIMERS:         # a test that failed early must not signal pytest later
      timer.cancel()
    _TIMERS.clear()
    g.uninstall()


def _signal_self_after(seconds: float, sig: int = signal.SIGTERM) -> None:
  timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), sig))
  _TIMERS.append(timer)
  timer.start()


def test_a_wait_for_a_running_program_is_ended_by_a_stop_signal(guard):
  """The main thread waits in ``to_host`` for a program of ~4 s; a SIGTERM after
  0.3 s ends the wait within a second, as ``StopRequested`` naming the phase.
  Without the guard's interruptible wait the handler would run only when the
  program ends."""
  x = jnp.full((128, 128), 0.01)
  iterations = int(4.0 / _seconds_per_iteration())
  _signal_self_after(0.3)
  start = time.perf_counter()
  with pytest.raises(stop.StopRequested, match="the rollout"):
    with stop.stoppable("the rollout"):
      to_host(_spin(x, iterations))
  assert time.perf_counter() - start < 1.5
  assert guard.requested and guard.signal_name == "SIGTERM"
  assert guard.messages == ["SIGTERM received during the rollout: stopping now"]


def test_outside_a_stoppable_phase_the_signal_is_only_recorded(guard):
  with stop.stoppable("a learner update", when=lambda: False):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)                     # the handler runs here and returns
  assert guard.requested
  assert guard.messages == ["SIGTERM received during a learner update: stopping when it ends"]
  # A stoppable phase entered after the signal stops at once.
  with pytest.raises(stop.StopRequested, match="the export"):
    with stop.stoppable("the export"):
      pytest.fail("the phase body must not run")


def test_a_second_ctrl_c_interrupts_at_once(guard):
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(0.05)
  assert guard.requested and guard.signal_name == "SIGINT"
  assert guard.messages[0] == "SIGINT received: checkpointing after the current step"
  with pytest.raises(KeyboardInterrupt):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1.0)


def test_a_signal_inside_a_host_callback_is_raised_after_the_program(guard):
  """XLA:CPU runs a program with host callbacks on the calling thread, so the handler
  may run inside the callback. Raised there it would come back as XLA's INTERNAL
  callback error; it is raised at the next wait instead, as ``StopRequested``."""
  jnp.zeros(()).block_until_ready()      # no program of an earlier test still running
  calls = []

  def host(v):
    calls.append(threading.current_thread() is threading.main_thread())
    if len(calls) == 2:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.05)                   # the handler runs inside this callback
    return v

  @jax.jit
  def program(x):
    body = lambda c: (c[0] + 1, jax.pure_callback(
        host, jax.ShapeDtypeStruct(x.shape, x.dtype), c[1] + 1))
    return jax.lax.while_loop(lambda c: c[0] < 5, body, (0, x))[1]

  with pytest.raises(stop.StopRequested, match="the rollout"):
    with stop.stoppable("the rollout"):
      out = program(jnp.zeros(3))
      to_host(out)
  if all(calls):          # the handler ran inside a callback: the program went on
    assert len(calls) == 5


def test_without_a_guard_waits_are_plain():
  assert stop._installed is None
  assert np.asarray(to_host(jnp.arange(3) + 1)).tolist() == [1, 2, 3]
  with stop.stoppable("nothing"):        # no guard: a no-op
    pass


def test_the_watchdog_ends_a_run_that_does_not_stop_in_time(tmp_path):
  """``grace_s`` after the first signal the process exits with status 1 and says what
  the newest checkpoint is, whatever the main thread is doing (here: a busy loop in
  no stoppable phase)."""
  script = tmp_path / "busy.py"
  script.write_text(textwrap.dedent("""
      import time
      from sagc_jax.runtime import stop
      stop.StopGuard(print, grace_s=1.0,
                     describe_state=lambda: "The newest checkpoint is step 7.").install()
      print("ready", flush=True)
      while True:
        pass
  """))
  proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  assert proc.stdout.readline().strip() == "ready"
  start = time.time()
  proc.send_signal(signal.SIGTERM)
  output, _ = proc.communicate(timeout=60)
  assert proc.returncode == stop.WATCHDOG_EXIT_STATUS, output
  assert 0.9 < time.time() - start < 10
  assert "SIGTERM received: checkpointing after the current step" in output
  assert ("did not stop within train.stop_grace_s=1 s of SIGTERM; exiting now (exit 1). "
          "The newest checkpoint is step 7.") in output
