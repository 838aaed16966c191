"""Two local JAX processes through the local launcher: same G every step (signal_rate,
which reads prompts, rewards and seconds), same policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_trainer import load_history, write_config_file

REPO = Path(__file__).resolve().parents[1]


def test_two_processes_agree_on_every_group_size_and_end_with_identical_params(shared,
                                                                                tmp_path):
  steps = 4
  config_file = write_config_file(
      tmp_path / "cfg.py", shared, steps,
      "c.mesh.shape = (-1, 1)            # 2 processes x 2 CPU devices",
      "c.train.compilation_cache = False  # processes must not share a cache dir",
      "c.train.export_every = 2             # every process takes part in the gather",
      "c.train.log_completions_every = 1",
      # The kind that reads the most from every process: the step's prompts, rewards and
      # seconds (process 0's clock); the processes agree only if all of it is shared.
      "c.controller.kind = 'signal_rate'")
  workdir = tmp_path / "run"
  logs = tmp_path / "logs"
  proc = subprocess.run(
      ["bash", str(REPO / "launch" / "local_multiprocess.sh"), "-n", "2", "-d", "2", "-l",
       str(logs), "--", sys.executable, "-m", "sagc_jax.train", f"--config={config_file}",
       f"--workdir={workdir}"],
      capture_output=True, text=True, timeout=900, cwd=REPO)
  output = proc.stdout + proc.stderr + "".join(
      p.read_text() for p in sorted(logs.glob("process_*.log")))
  assert proc.returncode == 0, output[-4000:]
  records = [json.loads((workdir / f"process_{i}.json").read_text()) for i in (0, 1)]
  assert all(r["processes"] == 2 for r in records)
  assert records[0]["g"] == records[1]["g"] and len(records[0]["g"]) == steps
  assert records[0]["param_checksums"] == records[1]["param_checksums"]
  assert [r["step"] for r in load_history(workdir)] == list(range(1, steps + 1))
  assert [r["g"] for r in load_history(workdir)] == records[0]["g"]
  # Host gathers compile per byte bucket at warm-up, not per shape mid-run (#16: 51
  # compilations after warm-up were reported for multi-process runs).
  assert [r["new_compilations"] for r in load_history(workdir)] == [0.0] * steps, output[-3000:]
  # Sampler and learner log-probs both reach the host through the sharded-array gather
  # (each process sends its shards' bounds and bytes): they agree only if every shard
  # landed in its place.
  assert max(r["learner/logprob_mismatch_max"] for r in load_history(workdir)) < 1e-4
  checkpoints = sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert checkpoints == ["2", "4"]
  assert sorted(p.name for p in (workdir / "exports").iterdir()) == ["step_2", "step_4"]
  assert (workdir / "exports" / "step_4" / "model.safetensors").stat().st_size > 0
  # Process 0 logs its own share of each step's completions.
  records = [json.loads(line) for line in (workdir / "completions.jsonl").read_text().splitlines()]
  assert sorted({r["step"] for r in records}) == list(range(1, steps + 1))
