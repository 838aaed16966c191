"""A stop signal in every phase of ``python -m sagc_jax.train`` ends the process within
30 s (a Spot VM's notice), keeps everything finished, and the run resumes.

Phases that take long only at scale are made long here by wrapping one function in a
small launcher script (``_launch``): a step's rollout waits for a ~8 s XLA program, a
learner update or an export sleeps. Data preparation and the warm start are long
through the config (a large dataset, many warm-start steps). Warm-up and the
evaluation before RL are covered in ``test_trainer.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_trainer import deterministic_view, load_history, write_config_file

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 30.0               # a Spot / preemptible VM's notice

# Wrappers, each printing a marker line when its phase has begun.
ROLLOUT_WAITS_FOR_A_LONG_PROGRAM = """
import jax, jax.numpy as jnp, time
from sagc_jax.sampling import sampler as sampler_module
from sagc_jax.runtime.distributed import to_host

@jax.jit
def spin(x, n):
  return jax.lax.while_loop(lambda c: c[0] < n,
                            lambda c: (c[0] + 1, jnp.tanh(c[1] @ c[1])), (0, x))[1]
x = jnp.full((128, 128), 0.01)
spin(x, 1).block_until_ready()
t = time.perf_counter(); spin(x, 500).block_until_ready()
iterations = int(8.0 / ((time.perf_counter() - t) / 500))     # about 8 s
original, calls = sampler_module.Sampler.generate, []

def generate(self, *args, **kwargs):
  if "group_sizes" in kwargs:        # the training step's call (evaluations pass none)
    calls.append(1)
    if len(calls) == 3:              # the third step's rollout, its prompts already read
      program = spin(x, iterations)
      print("MARK rollout program running", flush=True)
      to_host(program)
  return original(self, *args, **kwargs)
sampler_module.Sampler.generate = generate
"""

# A phase that takes long while running Python code. One long ``time.sleep`` in the main
# thread would stand in badly: the kernel may hand the signal to any of the process's
# threads, and then the sleep does not wake until it ends (Python runs the handler in
# the main thread between bytecodes), so it waits in 0.1 s slices.
SLICED_SLEEP = """
import time

def sleep(seconds):
  end = time.monotonic() + seconds
  while time.monotonic() < end:
    time.sleep(0.1)
"""

UPDATE_SLEEPS = SLICED_SLEEP + """
from sagc_jax.rl import learner as learner_module
original, calls = learner_module.Learner.update, []

def update(self, batch, seed=0):
  calls.append(1)
  if len(calls) == 2:                # step 2's update
    print("MARK update running", flush=True)
    sleep(SECONDS)
  return original(self, batch, seed=seed)
learner_module.Learner.update = update
"""

EXPORT_SLEEPS = SLICED_SLEEP + """
from sagc_jax.training import export as export_module
original = export_module.write_hf_folder

def write_hf_folder(*args, **kwargs):
  print("MARK export running", flush=True)
  sleep(120)
  return original(*args, **kwargs)
export_module.write_hf_folder = write_hf_folder
"""

CHECKPOINT_SAVE_HANGS = """
import time
from sagc_jax.runtime import checkpoint as checkpoint_module
original = checkpoint_module.Checkpointer.save

def save(self, step, *args, **kwargs):
  if step == 2:
    print("MARK save running", flush=True)
    time.sleep(600)
  return original(self, step, *args, **kwargs)
checkpoint_module.Checkpointer.save = save
"""


def _launch(tmp_path: Path, config_file: Path, workdir: Path, wrapper: str = ""
            ) -> subprocess.Popen:
  """``python -m sagc_jax.train`` with ``wrapper`` run first in the same process."""
  script = tmp_path / "launch.py"
  script.write_text(wrapper + "\nimport sys\nfrom sagc_jax.train import run\n"
                    f"sys.argv = ['sagc_jax.train', '--config={config_file}', "
                    f"'--workdir={workdir}']\nrun()\n")
  return subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _signal_at(proc: subprocess.Popen, marker: str, sig: int = signal.SIGTERM,
               then: str | None = None) -> tuple[str, float, float]:
  """Sends ``sig`` once ``marker`` is printed; returns (output, seconds to exit, seconds
  until the line ``then`` was printed after the signal)."""
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if marker in line:
      break
  else:
    pytest.fail("".join(seen))
  start = time.time()
  proc.send_signal(sig)
  answered = None
  if then is not None:
    for line in proc.stdout:
      seen.append(line)
      if then in line:
        answered = time.time() - start
        break
  output = "".join(seen) + _rest(proc)
  print(output)                          # the whole log when an assertion fails
  return output, time.time() - start, answered


def _rest(proc: subprocess.Popen, timeout: float = 300) -> str:
  """The output after the lines already read, once the process has ended. Not
  ``communicate(timeout=...)``: it reads the pipe itself, and lines the iteration over
  ``proc.stdout`` had buffered would be lost."""
  proc.wait(timeout=timeout)
  return proc.stdout.read()


def _checkpoints(workdir: Path) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def test_a_stop_in_a_step_s_rollout_checkpoints_the_finished_steps_and_resumes_exactly(
    shared, tmp_path):
  """Step 3's rollout waits for an ~8 s program after its G was proposed and its
  prompts read; SIGTERM there is answered at once (not when the program ends), steps
  1-2 (not yet checkpointed) are checkpointed with the controller and loader state of
  step 3's start, and the resumed run equals an uninterrupted one row for row."""
  config_file = write_config_file(tmp_path / "cfg.py", shared, 4,
                                  "c.train.checkpoint_every = 100")
  workdir = tmp_path / "run"
  proc = _launch(tmp_path, config_file, workdir, ROLLOUT_WAITS_FOR_A_LONG_PROGRAM)
  output, elapsed, answered = _signal_at(proc, "MARK rollout program running",
                                         then="stopping now")
  assert proc.returncode == 0, output
  assert elapsed < LIMIT_S, output
  assert answered is not None and answered < 3.0, output      # the program runs ~8 s
  assert "SIGTERM received during step 3's rollout: stopping now" in output
  assert "step 3 is abandoned" in output and "checkpointing step 2 before stopping" in output
  assert "Traceback" not in output
  assert _checkpoints(workdir) == [2]
  assert json.loads((workdir / "summary.json").read_text())["preempted"]

  resumed = subprocess.run([sys.executable, "-m", "sagc_jax.train", f"--config={config_file}",
                            f"--workdir={workdir}"], cwd=REPO, capture_output=True, text=True)
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert "resumed from checkpoint step 2" in resumed.stdout
  straight = tmp_path / "straight"
  subprocess.run([sys.executable, "-m", "sagc_jax.train", f"--config={config_file}",
                  f"--workdir={straight}"], cwd=REPO, check=True, capture_output=True)
  assert ([deterministic_view(r) for r in load_history(workdir)]
          == [deterministic_view(r) for r in load_history(straight)])


@pytest.mark.parametrize("checkpoint_every", [1, 100], ids=["nothing_new", "step_1_unsaved"])
def test_a_stop_in_a_learner_update(shared, tmp_path, checkpoint_every):
  """Step 2's update (5 s here). With step 1 checkpointed nothing is lost by stopping
  at once; with step 1 unsaved the update runs to its end and step 2 is checkpointed
  (the update overwrites donated weights: cut, it would lose step 1 too)."""
  config_file = write_config_file(tmp_path / "cfg.py", shared, 200,
                                  f"c.train.checkpoint_every = {checkpoint_every}")
  workdir = tmp_path / "run"
  proc = _launch(tmp_path, config_file, workdir, UPDATE_SLEEPS.replace("SECONDS", "5"))
  output, elapsed, _ = _signal_at(proc, "MARK update running")
  assert proc.returncode == 0, output
  assert elapsed < LIMIT_S and "Traceback" not in output, output
  if checkpoint_every == 1:
    assert "SIGTERM received during step 2's update: stopping now" in output
    assert "nothing new to checkpoint (the newest checkpoint is step 1)" in output
    assert _checkpoints(workdir) == [1]
  else:
    assert "SIGTERM received during step 2's update: stopping when it ends" in output
    assert _checkpoints(workdir) == [2]
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["preempted"] and summary["steps"] == _checkpoints(workdir)[-1]


def test_a_second_ctrl_c_during_an_update_that_must_finish_stops_at_once(shared, tmp_path):
  config_file = write_config_file(tmp_path / "cfg.py", shared, 200,
                                  "c.train.checkpoint_every = 100")
  workdir = tmp_path / "run"
  proc = _launch(tmp_path, config_file, workdir, UPDATE_SLEEPS.replace("SECONDS", "120"))
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if "MARK update running" in line:
      break
  proc.send_signal(signal.SIGINT)
  for line in proc.stdout:
    seen.append(line)
    if "stopping when it ends" in line:
      break
  start = time.time()
  proc.send_signal(signal.SIGINT)
  output = "".join(seen) + _rest(proc)
  assert proc.returncode == 130 and time.time() - start < LIMIT_S, output
  assert "interrupted: steps since the last checkpoint are lost" in output
  assert "Traceback" not in output


def test_a_stop_in_an_export_keeps_the_step_s_checkpoint(shared, tmp_path):
  config_file = write_config_file(tmp_path / "cfg.py", shared, 200,
                                  "c.train.checkpoint_every = 2", "c.train.export_every = 2")
  workdir = tmp_path / "run"
  proc = _launch(tmp_path, config_file, workdir, EXPORT_SLEEPS)
  output, elapsed, _ = _signal_at(proc, "MARK export running")
  assert proc.returncode == 0 and elapsed < LIMIT_S, output
  assert "SIGTERM received during the export of step 2: stopping now" in output
  assert "step 2: export stopped (its checkpoint is kept" in output
  assert "--step 2 --out <folder>` writes it" in output
  assert _checkpoints(workdir) == [2]
  assert not list((workdir / "exports").glob("step_*"))


@pytest.mark.parametrize("phase, marker, overrides", [
    ("data preparation", "preparing dataset",
     ("c.data.synthetic.num_train = 400000",)),
    ("the supervised warm start", "supervised warm start:",
     ("c.sft.steps = 5000",)),
], ids=["data", "warm_start"])
def test_a_stop_during_start_up_exits_at_once_and_the_rerun_starts_clean(
    shared, tmp_path, phase, marker, overrides):
  """Nothing exists yet: exit 0 within seconds, saying so; the rerun redoes the
  phase (a stopped TFDS preparation or warm start leaves nothing half-written that
  is read)."""
  data_dir = tmp_path / "tfds"           # this run's own data, prepared from scratch
  config_file = write_config_file(tmp_path / "cfg.py", shared, 1, *overrides,
                                  f"c.data.data_dir = {str(data_dir)!r}")
  workdir = tmp_path / "run"
  proc = _launch(tmp_path, config_file, workdir)
  output, elapsed, _ = _signal_at(proc, marker)
  assert proc.returncode == 0 and elapsed < LIMIT_S, output
  assert f"SIGTERM received during {phase}: stopping now" in output
  assert f"stopped during {phase}: nothing new to checkpoint" in output
  assert "Traceback" not in output


def test_the_watchdog_ends_a_run_whose_stop_cannot_finish_in_time(shared, tmp_path):
  """A checkpoint save that hangs (a dead filesystem): ``train.stop_grace_s`` after the
  signal the process exits 1, naming the newest checkpoint."""
  config_file = write_config_file(tmp_path / "cfg.py", shared, 200,
                                  "c.train.checkpoint_every = 1", "c.train.stop_grace_s = 3.0")
  workdir = tmp_path / "run"
  proc = _launch(tmp_path, config_file, workdir, CHECKPOINT_SAVE_HANGS)
  output, elapsed, _ = _signal_at(proc, "MARK save running")
  assert proc.returncode == 1 and 2.5 < elapsed < LIMIT_S, output
  assert "did not stop within train.stop_grace_s=3 s of SIGTERM; exiting now (exit 1)" in output
  assert "Step 2 was not checkpointed; a resume starts from step 1 (if its write finished)" in output
