"""One trainer per run directory: live owners refused, stale locks taken over."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sagc_jax.runtime.run_lock import LOCK_NAME, RunLock, WorkdirLocked

REPO = Path(__file__).resolve().parents[1]


def _write_lock(workdir: Path, host: str, pid: int, heartbeat_age_s: float = 0.0) -> Path:
  path = workdir / LOCK_NAME
  now = time.time()
  path.write_text(json.dumps(dict(host=host, pid=pid, started=now - 100,
                                  heartbeat=now - heartbeat_age_s)))
  return path


@pytest.fixture
def other_process():
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
  yield proc
  proc.kill()
  proc.wait()


def test_live_owner_on_this_host_is_refused_then_a_dead_one_is_taken_over(tmp_path,
                                                                         other_process):
  _write_lock(tmp_path, socket.gethostname(), other_process.pid)
  messages = []
  with pytest.raises(WorkdirLocked, match=rf"in use by pid {other_process.pid} on host"):
    RunLock(tmp_path, log=messages.append).acquire()
  other_process.kill()
  other_process.wait()
  lock = RunLock(tmp_path, log=messages.append)
  lock.acquire()
  assert any(f"pid {other_process.pid} on this host is not running" in m for m in messages)
  owner = json.loads((tmp_path / LOCK_NAME).read_text())
  assert owner["pid"] != other_process.pid
  lock.release()
  assert not (tmp_path / LOCK_NAME).exists()


def test_other_host_is_alive_while_its_heartbeat_is_fresh(tmp_path):
  _write_lock(tmp_path, "another-host", 12345, heartbeat_age_s=10)
  with pytest.raises(WorkdirLocked, match="another-host"):
    RunLock(tmp_path, stale_after_s=300, log=lambda m: None).acquire()
  _write_lock(tmp_path, "another-host", 12345, heartbeat_age_s=400)
  messages = []
  lock = RunLock(tmp_path, stale_after_s=300, log=messages.append)
  lock.acquire()
  assert "no heartbeat for" in messages[0]
  lock.release()


def test_heartbeat_is_refreshed_while_held(tmp_path):
  lock = RunLock(tmp_path, heartbeat_s=0.05, log=lambda m: None)
  lock.acquire()
  first = json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"]
  time.sleep(0.5)
  assert json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"] > first
  lock.release()


def test_second_trainer_is_refused_before_touching_the_run(commands, tmp_path, other_process):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "metrics.jsonl").write_text('{"step": 1}\n')
  _write_lock(workdir, socket.gethostname(), other_process.pid)
  before = {p.name: p.read_bytes() for p in workdir.iterdir()}
  proc = commands.run("sagc_jax.train", f"--config={REPO / 'configs/tiny_cpu.py'}",
                      f"--workdir={workdir}")
  assert proc.returncode == 2, proc.stderr
  # (libtpu, installed for the AOT tests, may print its own warnings first.)
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: workdir") and f"in use by pid {other_process.pid}" in last
  assert "Traceback" not in proc.stderr
  assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before
