"""One run of a comparison in its own process (``python -m sagc_jax.train`` on the run).

A comparison runs many training runs (18 for the real-model one) one after another.
In one process the memory of finished runs was not all given back (on the real model
the comparison process grew run after run towards the machine's memory), so each run
gets a fresh process that returns everything when it exits. The parent
(``arms.run_arms``) writes the run's config to ``DIR/arm_config.json`` with a
two-line config file that reads it (``DIR/arm_config.py``), then runs the training
CLI on them: the run resumes, stops and reports exactly as a run started by hand.
Compiled programs are shared through the persistent compilation cache, so a child
compiles little. The child is its own process group: a terminal's Ctrl-C reaches the
parent only, which passes each SIGINT / SIGTERM on exactly once, so the run stops the
way a single training run does (checkpoint, then exit 0).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from sagc_jax.runtime.storage import read_json

ARM_CONFIG = "arm_config.json"
_LOADER = """# Written by sagc_jax.compare: this run's config is arm_config.json beside this file.
from pathlib import Path

from sagc_jax.experiments.arm_process import read_arm_config


def get_config():
  return read_arm_config(Path(__file__).resolve().parent)
"""


def _write(path: Path, text: str) -> None:
  partial = path.with_name(path.name + ".partial")
  partial.write_text(text)
  os.replace(partial, path)


def read_arm_config(run_dir: Path) -> Any:
  """The run's config: its JSON over today's defaults (validated by the trainer)."""
  from sagc_jax.config import base_config

  config = base_config()
  config.update(read_json(run_dir / ARM_CONFIG))
  return config


def run_in_child(config: Any, run_dir: Path) -> dict[str, Any]:
  """Trains ``config`` in ``run_dir`` in a fresh process; returns its summary
  (``{"preempted": True}`` when a forwarded stop signal ended it before one).

  SIGINT and SIGTERM received meanwhile are passed to the child (which checkpoints
  and exits 0); a child that fails raises ``RuntimeError`` naming the run.
  """
  run_dir.mkdir(parents=True, exist_ok=True)
  _write(run_dir / ARM_CONFIG, config.to_json_best_effort(indent=1))   # both atomically
  loader = run_dir / "arm_config.py"
  _write(loader, _LOADER)
  child = subprocess.Popen([sys.executable, "-m", "sagc_jax.train", f"--config={loader}",
                            f"--workdir={run_dir}"], start_new_session=True)
  forwarded = []

  def forward(signum, frame):
    del frame
    if child.poll() is None:
      forwarded.append(signum)
      child.send_signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    code = child.wait()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  summary = run_dir / "summary.json"
  if code == 0 and forwarded:
    saved = read_json(summary) if summary.exists() else {}
    return dict(saved, preempted=True)
  if code != 0 or not summary.exists():
    raise RuntimeError(f"the run in {run_dir} failed (exit code {code}; its messages are "
                       "above); fix the cause and rerun the same command: finished runs "
                       "are skipped and this one resumes from its checkpoint")
  return read_json(summary)
