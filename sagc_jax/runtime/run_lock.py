"""One trainer per run directory: ``<workdir>/run.lock``.

Two trainers on one workdir interleave their metrics rows and checkpoints (a probe
found every step twice in ``metrics.jsonl``). The trainer's primary process takes
this lock before it writes anything and releases it on close. The file records the
owner's host, pid, start time and a heartbeat that a daemon thread refreshes every
``heartbeat_s`` (also during long compiles), so that a second trainer can tell:

* an owner on this host whose pid is alive: refused, naming it;
* an owner on this host whose pid is gone (killed, crashed): a stale lock, taken over
  and reported;
* an owner on another host (pods: a gs:// workdir): alive while its heartbeat is
  younger than ``stale_after_s``; older, it is stale (the host was lost without a
  chance to release it), taken over and reported.

Locally the lock file is created atomically (``O_CREAT | O_EXCL``); in a bucket the
create is a plain write, so two trainers starting within the same second could both
succeed there.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Callable

from sagc_jax.runtime.storage import is_remote, run_path

__all__ = ["RunLock", "WorkdirLocked"]

LOCK_NAME = "run.lock"


class WorkdirLocked(ValueError):
  """Another live trainer owns the run directory (a user error: exit status 2)."""


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:       # alive, owned by another user
    return True
  return True


class RunLock:
  """The run directory's lock (see the module docstring)."""

  def __init__(self, workdir: str | os.PathLike, *, heartbeat_s: float = 30.0,
               stale_after_s: float = 300.0, log: Callable[[str], None] = print):
    self.path = run_path(workdir) / LOCK_NAME
    self.remote = is_remote(workdir)
    self.heartbeat_s = heartbeat_s
    self.stale_after_s = stale_after_s
    self.log = log
    self.owner = dict(host=socket.gethostname(), pid=os.getpid(), started=time.time())
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  # ------------------------------------------------------------------ public
  def acquire(self) -> None:
    """Takes the lock, or raises ``WorkdirLocked`` naming the live owner."""
    if not self._create():
      current = self._read()
      reason = self._stale_reason(current)
      if reason is None:
        raise WorkdirLocked(
            f"workdir {self.path.parent} is in use by pid {current.get('pid')} on host "
            f"{current.get('host')!r} (lock {self.path}, heartbeat "
            f"{time.time() - float(current.get('heartbeat', 0)):.0f} s ago): stop that run "
            "or use another --workdir")
      self.log(f"taking over a stale run lock ({reason}): {self.path}")
      self._write()
    self._thread = threading.Thread(target=self._beat, name="sagc-run-lock", daemon=True)
    self._thread.start()

  def release(self) -> None:
    """Stops the heartbeat and removes the lock if this process still owns it."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=self.heartbeat_s + 5)
      self._thread = None
    try:
      current = self._read()
      if (current.get("host"), current.get("pid")) == (self.owner["host"], self.owner["pid"]):
        self.path.unlink()
    except (OSError, ValueError):
      pass                      # gone already, or unreadable: nothing of ours to remove

  # ----------------------------------------------------------------- helpers
  def _content(self) -> str:
    return json.dumps({**self.owner, "heartbeat": time.time()})

  def _create(self) -> bool:
    """Creates the lock file if there is none; False if one exists."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if self.remote:
      if self.path.exists():
        return False
      self._write()
      return True
    try:
      with open(self.path, "x") as f:      # O_CREAT | O_EXCL: of two trainers, one wins
        f.write(self._content())
    except FileExistsError:
      return False
    return True

  def _write(self) -> None:
    """Rewrites the lock whole: a reader never sees a half-written file (which it
    would take for a stale lock). gs:// objects are replaced whole by the store; a
    local file is written beside it and renamed over it."""
    if self.remote:
      self.path.write_text(self._content())
      return
    partial = f"{os.fspath(self.path)}.{os.getpid()}.partial"
    try:
      with open(partial, "w") as f:
        f.write(self._content())
      os.replace(partial, os.fspath(self.path))
    except OSError:                 # a full disk: no partial file left in the workdir
      if os.path.exists(partial):
        os.remove(partial)
      raise

  def _read(self) -> dict[str, Any]:
    try:
      return json.loads(self.path.read_text())
    except (OSError, ValueError):
      return {}                 # unreadable or half-written: treated as stale below

  def _stale_reason(self, owner: dict[str, Any]) -> str | None:
    """Why ``owner``'s lock is stale, or None while its owner may be alive."""
    if not owner:
      return "unreadable lock file"
    if owner.get("host") == self.owner["host"]:
      pid = int(owner.get("pid", -1))
      if pid == os.getpid():
        return "this process: an earlier trainer here was not closed"
      if not _pid_alive(pid):
        return f"pid {pid} on this host is not running"
      return None
    age = time.time() - float(owner.get("heartbeat", 0))
    if age > self.stale_after_s:
      return (f"host {owner.get('host')!r}, pid {owner.get('pid')}: no heartbeat for "
              f"{age:.0f} s > {self.stale_after_s:.0f} s")
    return None

  def _beat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        self._write()
      except Exception:  # pylint: disable=broad-except  (a full disk: the run's own writes
        pass             # fail and stop it; the heartbeat thread must not die or hang)
