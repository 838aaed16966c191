"""Runs ``tunix_worker.py`` in a peer Python environment (one with ``google-tunix``).

Tunix's pins and ours can disagree, so the peer columns of ``bench heavy_tail`` and
``bench learner`` run Tunix in its own interpreter: a JSON job in, a JSON result out.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("tunix_worker.py")
TUNIX_ROPE_THETA = 1e6        # what Tunix's Llama applies, whatever config.json says


def run_worker(peer_python: str, job: dict[str, Any]) -> dict[str, Any]:
  """``job`` through the worker under ``peer_python``, on CPU; its result."""
  with tempfile.TemporaryDirectory() as tmp:
    job_path, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
    job_path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([peer_python, str(WORKER), str(job_path), str(out)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(f"the Tunix worker failed under {peer_python} (exit "
                         f"{proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return json.loads(out.read_text())
