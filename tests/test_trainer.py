"""End-to-end trainer: GRPO/DAPO x SAGC/static runs, metrics, exact resume,
SIGTERM checkpoint, corrupt-checkpoint fallback, config errors, eval CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from sagc_jax.runtime.checkpoint import CheckpointMismatch
from sagc_jax.config import preset, validate
from sagc_jax.models import build_tiny_checkpoint
from sagc_jax.runtime.metrics import deterministic_view, load_history
from sagc_jax.training.loop import Trainer

REPO = Path(__file__).resolve().parents[1]
REQUIRED_KEYS = {"step", "g", "lambda", "p_mean/G2", "p_mean/G4", "straggler_rate",
                 "group_straggler_rate", "step_straggler",
                 "time_rollout_s", "time_reward_s", "time_learner_s", "time_total_s",
                 "generated_tokens", "padding_efficiency", "reward_mean", "accuracy",
                 "response_len_mean", "response_len_median", "response_len_max",
                 "group_max_over_median",
                 "new_compilations", "learner/loss"}


def small_config(shared, algorithm="grpo", controller="sagc", steps=3):
  c = preset(algorithm, controller)
  c.controller.update(dict(candidates=(2, 4), static_g=4, tau=1.5))
  c.mesh.shape = (2, 1)                        # rows sharded over 2 of the fake devices
  c.data.update(dict(data_dir=shared["data_dir"], eval_examples=16))
  c.data.synthetic.update(dict(num_train=400, num_test=40, max_ops=1))
  c.rollout.update(dict(mode="hold_rollouts", rollouts_per_step=8, max_new_tokens=16,
                        prompt_buckets=(16,), response_buckets=(16,), eval_batch=16))
  if algorithm == "dapo":
    c.learner.update(dict(overlong_buffer=4, dynamic_max_rounds=2))
  c.learner.update(dict(lr=1e-3, mini_batches=2))
  c.sft.update(dict(steps=8, batch_size=16, seq_bucket=48, warmup_steps=2))
  c.train.update(dict(steps=steps, checkpoint_every=2, eval_every=steps, keep_checkpoints=5,
                      compilation_cache_dir=shared["cache"]))
  return c


def run(config, workdir, max_steps=None, log=None, before_rl=None):
  trainer = Trainer(config, workdir, log=log or (lambda message: None), before_rl=before_rl)
  try:
    summary = trainer.run(max_steps=max_steps)
    params = jax.tree.map(np.asarray, nnx.state(trainer.model, nnx.Param))
  finally:
    trainer.close()
  return summary, params, trainer


@pytest.mark.parametrize("algorithm, controller", [("grpo", "sagc"), ("grpo", "static"),
                                                   ("dapo", "sagc"), ("dapo", "static")])
def test_short_end_to_end_runs(shared, tmp_path, algorithm, controller):
  summary, _, trainer = run(small_config(shared, algorithm, controller), tmp_path)
  rows = load_history(tmp_path)
  assert [r["step"] for r in rows] == [1, 2, 3]
  for row in rows:
    assert REQUIRED_KEYS <= set(row) or trainer.learner.config.dynamic_sampling
    assert row["new_compilations"] == 0
    assert row["g"] in (2, 4)
    # A group's max / median is >= 1, and > tau (1.5) for a straggling group.
    assert row["group_max_over_median"] >= 1.0
    assert row["group_max_over_median"] > 1.0 + 0.5 * row["group_straggler_rate"] - 1e-9
    if controller == "static":
      assert row["g"] == 4 and row["lambda"] == 0.0
  assert summary["steps"] == 3 and "eval_accuracy_end" in summary
  assert (tmp_path / "summary.json").exists() and (tmp_path / "config.json").exists()
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                if p.name.isdigit()) == [2, 3]
  assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  if algorithm == "dapo":
    assert trainer.learner.reference is None
    assert all(r["sampling_rounds"] >= 1 for r in rows)


def test_sampled_only_evaluation_reports_the_paired_gain(shared, tmp_path):
  """train.eval_greedy=False: no greedy pass or key anywhere; the summary's gain is the
  end - start sampled accuracy, with an interval around it, from the per-example
  correctness the eval history keeps."""
  config = small_config(shared, steps=2)
  config.train.eval_greedy = False
  messages = []
  summary, _, trainer = run(config, tmp_path, log=messages.append)
  first, last = trainer.eval_history[0], trainer.eval_history[-1]
  # Each evaluation shows on the console as it starts and with what it measured.
  for when, evaluation in (("before RL", first), ("after step 2", last)):
    assert f"eval {when} on 16 held-out examples ..." in messages
    assert (f"eval {when}: held-out accuracy "
            f"{evaluation['eval_sampled_accuracy']:.3f} sampled") in messages
  assert "eval_accuracy" not in first and "eval_accuracy_start" not in summary
  assert len(first["sampled_correct"]) == len(last["sampled_correct"]) == 16
  assert np.mean(first["sampled_correct"]) == pytest.approx(first["eval_sampled_accuracy"])
  gain = summary["eval_sampled_accuracy_end"] - summary["eval_sampled_accuracy_start"]
  assert summary["eval_sampled_gain"] == pytest.approx(gain)
  assert summary["eval_sampled_gain_ci95_low"] <= gain <= summary["eval_sampled_gain_ci95_high"]
  assert not any("eval_accuracy" in r for r in load_history(tmp_path))
  from sagc_jax.runtime.metrics import load_evaluation_before_rl
  before = load_evaluation_before_rl(tmp_path)           # the step-0 row of metrics.jsonl
  assert before["eval_sampled_accuracy"] == summary["eval_sampled_accuracy_start"]
  assert "sampled_correct" not in before


def test_a_run_reuses_the_evaluation_before_rl_of_a_run_with_the_same_weights(shared,
                                                                             tmp_path):
  """The before_rl hook of a comparison (``experiments.initial_eval.reuse_before_rl``,
  what train.initial_eval_dir attaches): a run with another controller but the same
  weights and evaluation settings reads the evaluation before RL that the first run
  kept, and what it reads equals what it measures without it (an independent run)."""
  from sagc_jax.experiments.initial_eval import reuse_before_rl

  folder = tmp_path / "initial_eval"

  def evaluation_before_rl(name, controller, initial_eval_dir):
    config = small_config(shared, controller=controller, steps=1)
    messages = []
    hook = reuse_before_rl(initial_eval_dir) if initial_eval_dir else None
    summary, _, trainer = run(config, tmp_path / name, log=messages.append, before_rl=hook)
    return trainer.eval_history[0], summary, messages

  kept, _, kept_lines = evaluation_before_rl("sagc", "sagc", str(folder))
  reused, summary, reused_lines = evaluation_before_rl("static", "static", str(folder))
  measured, alone_summary, _ = evaluation_before_rl("static_alone", "static", "")
  assert not any("reusing" in line for line in kept_lines)
  assert "eval before RL on 16 held-out examples ..." in kept_lines
  assert [line for line in reused_lines if "eval before RL: reusing" in line]
  assert "eval before RL on 16 held-out examples ..." not in reused_lines
  assert (f"eval before RL: held-out accuracy {reused['eval_accuracy']:.3f} greedy, "
          f"{reused['eval_sampled_accuracy']:.3f} sampled") in reused_lines
  assert reused["eval_reused"] == 1.0 and "eval_reused" not in measured
  timing = {"eval_seconds", "eval_reused"}
  assert {k: v for k, v in reused.items() if k not in timing} == \
      {k: v for k, v in measured.items() if k not in timing}
  assert summary["eval_sampled_gain"] == alone_summary["eval_sampled_gain"]
  assert len(list(folder.glob("*.json"))) == 1


def test_refill_rollouts_equal_the_default_sampler_s_and_compile_nothing_after_warm_up(
    shared, tmp_path):
  """rollout.refill_slots: 4 slots for 8 rollouts per step, 2 steps. Step 1 samples from
  the same policy, so its rollouts (lengths, rewards) equal the default sampler's.
  Scoring rows as they finish (``rollout.overlap_rewards``, on by default) or after the
  call gives the same run, step for step."""
  runs = {}
  for refill, overlap in ((0, True), (4, True), (4, False)):
    config = small_config(shared, steps=2)
    config.mesh.shape = (1, 1)
    config.rollout.update(dict(refill_slots=refill, page_size=4, overlap_rewards=overlap))
    _, _, trainer = run(config, tmp_path / f"refill{refill}_{overlap}")
    assert (trainer.components.sampler.refill is not None) == bool(refill)
    runs[refill, overlap] = load_history(tmp_path / f"refill{refill}_{overlap}")
  assert all(r["new_compilations"] == 0 for r in runs[4, True])
  for key in ("g", "generated_tokens", "reward_mean", "response_len_max"):
    assert runs[4, True][0][key] == runs[0, True][0][key], key
  assert ([deterministic_view(r) for r in runs[4, True]]
          == [deterministic_view(r) for r in runs[4, False]])
  assert all(r["time_reward_overlapped_s"] == 0.0 for r in runs[4, False])


@pytest.mark.parametrize("kind", ["sagc", "prompt_aware", "per_prompt"])
def test_resume_is_exact(shared, tmp_path, kind):
  """A run stopped after step 2 and resumed equals the uninterrupted run (weights and
  every metrics row). The contextual kinds on 8 training prompts, so that prompts recur
  and their history (checkpointed with the controller) decides."""
  config = small_config(shared, steps=4)
  config.controller.kind = kind
  if kind != "sagc":
    config.data.synthetic.num_train = 8
    config.sft.batch_size = 4
  straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
  _, straight_params, _ = run(config, straight_dir)
  # Same warm start for both (the SFT cache is per workdir).
  resumed_dir.mkdir()
  for name in ("init_model", "sft_model"):
    shutil.copytree(straight_dir / name, resumed_dir / name)
  run(config, resumed_dir, max_steps=2)                 # "killed" after step 2
  assert len(load_history(resumed_dir)) == 2
  _, resumed_params, trainer = run(config, resumed_dir)  # resumes at step 2
  assert trainer.step == 4
  for a, b in zip(jax.tree.leaves(straight_params), jax.tree.leaves(resumed_params)):
    np.testing.assert_array_equal(a, b)
  straight_rows = [deterministic_view(r) for r in load_history(straight_dir)]
  resumed_rows = [deterministic_view(r) for r in load_history(resumed_dir)]
  assert resumed_rows == straight_rows
  # One step-0 row (the evaluation before RL), written once, kept by the resume.
  lines = (resumed_dir / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3, 4]
  if kind == "per_prompt":
    # Groups of their own sizes within the row budget, on the warmed programs.
    assert all(r["allocated_rows"] <= r["row_budget"] for r in straight_rows)
    assert all(r["new_compilations"] == 0 for r in straight_rows)
  if kind != "sagc":
    # Every prompt observed joined the history; later steps met prompts seen before.
    assert straight_rows[-1]["history_prompts"] == 8
    assert max(r["feature_coverage"] for r in straight_rows[1:]) > 0
    assert all(0.0 <= r["predicted_straggler_rate"] <= 1.0 for r in straight_rows)


def test_skipped_prompts_are_consumed_not_sampled_and_compile_nothing(shared, tmp_path):
  """A plan's size of 0 (a skipped prompt, ``signal_rate_per_prompt``): the loader moves
  past it, the sampler and the learner see only the sampled prompts, and no step after
  warm-up compiles (``controllers.SkipsEveryOther`` skips every other prompt)."""
  config = small_config(shared, steps=3)
  config.controller.kind = "controllers:SkipsEveryOther"
  _, _, trainer = run(config, tmp_path)
  rows = load_history(tmp_path)
  assert len(rows) == 3
  assert all(r["new_compilations"] == 0 for r in rows)
  assert all(r["skipped_prompts"] == r["n_groups"] > 0 for r in rows)
  groups = sum(int(r["n_groups"]) for r in rows)
  assert trainer.loader.state_dict()["position"] == 2 * groups      # skipped ones too


def test_a_budgeted_run_stops_at_the_first_step_past_its_budget_and_a_resume_stays_there(
    shared, tmp_path):
  """train.time_budget_s: the last step is the first whose cumulative step time reaches
  the budget; it is checkpointed and evaluated; the evaluations fall at the first step
  boundary after each of train.eval_points points of the budget (re-derived here from
  the rows' own step times); a resume trains nothing and the run counts as finished."""
  from sagc_jax.runtime.metrics import finished_summary

  config = small_config(shared, steps=500)
  config.train.update(dict(time_budget_s=3.0, eval_points=3, eval_every=500,
                           checkpoint_every=500))
  summary, _, trainer = run(config, tmp_path)
  rows = load_history(tmp_path)
  clock = np.cumsum([r["time_total_s"] for r in rows])
  assert 1 < len(rows) < 500
  assert clock[-2] < 3.0 <= clock[-1]                         # the first step past it
  np.testing.assert_allclose([r["time_cumulative_s"] for r in rows], clock)
  assert summary["budget_spent"] and summary["time_budget_s"] == 3.0
  assert not summary["preempted"] and summary["steps"] == len(rows)
  expected = sorted({int(np.searchsorted(clock, j * 1.0)) + 1 for j in (1, 2, 3)})
  assert [r["step"] for r in rows if "eval_sampled_accuracy" in r] == expected
  assert trainer.checkpointer.all_steps()[-1] == len(rows)
  assert finished_summary(tmp_path, trainer.config.train) is not None
  logged = []
  summary, _, resumed = run(config, tmp_path, log=logged.append)
  assert resumed.step == len(rows) and len(load_history(tmp_path)) == len(rows)
  assert any("the time budget is spent" in m for m in logged)
  assert summary["budget_spent"] and summary["steps"] == len(rows)


def test_budget_spent_and_the_evaluations_it_triggers_on_hand_cases():
  """``run_state.budget_spent``, the one rule the loop, the evaluation schedule and
  the summary share: spent once the cumulative step time reaches the budget, never
  without one; its step is evaluated even between ``eval_points`` points."""
  from types import SimpleNamespace

  from sagc_jax.training.run_state import budget_spent, evaluation_due

  train = SimpleNamespace(time_budget_s=10.0, eval_points=2, eval_every=100, steps=100)
  assert [budget_spent(train, s) for s in (0.0, 9.999, 10.0, 25.0)] == [False, False, True,
                                                                          True]
  none = SimpleNamespace(time_budget_s=0.0, eval_points=0, eval_every=100, steps=100)
  assert not budget_spent(none, 0.0) and not budget_spent(none, 1e9)
  assert evaluation_due(train, 7, 6.0, 10.0)              # the step that spends it
  assert evaluation_due(train, 3, 4.0, 5.0)               # the point 5.0 of 10.0
  assert not evaluation_due(train, 4, 5.0, 9.0)           # neither
  assert not evaluation_due(none, 4, 5.0, 1e9) and evaluation_due(none, 100, 0.0, 1.0)


def test_corrupt_latest_checkpoint_falls_back_to_previous(shared, tmp_path):
  config = small_config(shared, steps=4)
  run(config, tmp_path)
  latest = tmp_path / "checkpoints" / "4"
  for path in (latest / "params").rglob("*"):
    if path.is_file() and path.stat().st_size > 0:
      path.write_bytes(b"\0" * 7)                          # damaged on disk
  messages = []
  trainer = Trainer(config, tmp_path, log=messages.append)
  try:
    assert trainer.step == 2
    assert [r["step"] for r in load_history(tmp_path)] == [1, 2]
    trainer.run()                                  # trains through step 4 again
  finally:
    trainer.close()
  assert any("checkpoint step 4" in m and "corrupt or incomplete" in m for m in messages)
  assert any("resumed from checkpoint step 2" in m for m in messages)
  assert [r["step"] for r in load_history(tmp_path)] == [1, 2, 3, 4]
  assert list((tmp_path / "checkpoints").glob("corrupt-4-*"))      # kept for inspection
  # Every checkpoint damaged: refuse to start over (and overwrite the run).
  for step_dir in (tmp_path / "checkpoints").iterdir():
    if step_dir.name.isdigit():
      for path in (step_dir / "params").rglob("*"):
        if path.is_file():
          path.write_bytes(b"\0")
  with pytest.raises(RuntimeError, match="none of the checkpoints"):
    Trainer(config, tmp_path, log=messages.append)


def test_resume_with_another_model_is_refused_and_changes_are_named(shared, tmp_path):
  """A resume whose model does not match the checkpoints is a config error: it names
  what differs and touches nothing (before: every checkpoint was quarantined, the
  run restarted from step 0 and metrics.jsonl was truncated)."""
  config = small_config(shared, steps=2)
  run(config, tmp_path)
  files = {name: (tmp_path / name).read_bytes() for name in ("config.json", "metrics.jsonl")}
  entries = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  other = small_config(shared, steps=2)
  other.model.tiny_family = "qwen2"               # the cached tiny model says "llama"
  with pytest.raises(ValueError, match="model.tiny_family='qwen2', but this workdir's tiny "
                                       "model was built with tiny_family='llama'"):
    Trainer(other, tmp_path, log=lambda m: None)
  # Another HF model folder (q/k/v biases: arrays the run never had).
  other.model.tiny_family = "llama"
  other.model.path = str(build_tiny_checkpoint(tmp_path.parent / f"{tmp_path.name}-qwen2",
                                               family="qwen2"))
  with pytest.raises(CheckpointMismatch, match=r"step 2 .*does not match this run .*"
                                               r"not in the checkpoint: .*bias"):
    Trainer(other, tmp_path, log=lambda m: None)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == entries
  assert {name: (tmp_path / name).read_bytes() for name in files} == files
  # A resumable change is applied and named.
  changed = small_config(shared, steps=2)
  changed.learner.lr = 2e-3
  messages = []
  trainer = Trainer(changed, tmp_path, log=messages.append)
  trainer.close()
  assert trainer.step == 2
  assert any("resuming with 1 changed setting(s): learner.lr: 0.001 -> 0.002" in m
             for m in messages), messages
  # Skipped (non-finite) updates in a row stop the run at train.max_consecutive_skipped
  # (default 5) before the step is checkpointed; one applied update resets the count.
  # (test_learner.py checks that a non-finite update is really skipped and counted.)
  trainer.state.check_skipped_updates({"learner/updates": 2.0, "learner/skipped_updates": 2.0})
  trainer.state.check_skipped_updates({"learner/updates": 2.0, "learner/skipped_updates": 1.0})
  trainer.state.check_skipped_updates({"learner/updates": 2.0, "learner/skipped_updates": 2.0})
  trainer.state.check_skipped_updates({"learner/updates": 2.0, "learner/skipped_updates": 2.0})
  with pytest.raises(RuntimeError, match=r"step 2: 6 learner updates in a row were skipped "
                                         r".*newest checkpoint is step 2"):
    trainer.state.check_skipped_updates({"learner/updates": 2.0, "learner/skipped_updates": 2.0})
  assert json.loads((tmp_path / "config.json").read_text())["learner"]["lr"] == 2e-3


def write_config_file(path: Path, shared, steps: int, *overrides: str) -> Path:
  """A config file for the CLI: ``small_config`` plus override statements on ``c``."""
  lines = ["import sys", f"sys.path.insert(0, {str(Path(__file__).parent)!r})",
           "from test_trainer import small_config", f"SHARED = {shared!r}",
           "def get_config():", f"  c = small_config(SHARED, steps={steps})",
           *(f"  {line}" for line in overrides), "  return c"]
  path.write_text("\n".join(lines) + "\n")
  return path


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, steps: int) -> None:
  """Waits until ``run_dir`` has logged ``steps`` steps (the process still running)."""
  deadline = time.time() + 600
  while time.time() < deadline and proc.poll() is None:
    if (run_dir / "metrics.jsonl").exists() and len(load_history(run_dir)) >= steps:
      break
    time.sleep(0.5)
  assert proc.poll() is None, proc.stdout.read()


def sigterm_after_steps(proc: subprocess.Popen, run_dir: Path, steps: int,
                        sig: int = signal.SIGTERM) -> str:
  """Waits until ``run_dir`` has logged ``steps`` steps, sends ``sig``, expects exit 0."""
  wait_for_steps(proc, run_dir, steps)
  proc.send_signal(sig)
  output, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, output
  return output


def _train_process(config_file: Path, workdir: Path) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "sagc_jax.train", f"--config={config_file}",
                           f"--workdir={workdir}"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("sig, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")])
def test_sigterm_writes_a_checkpoint_and_exits(shared, tmp_path, sig, name):
  """Preemption (SIGTERM) and a first Ctrl-C (SIGINT) both checkpoint after the current
  step and exit 0: nothing trained is lost."""
  config_file = write_config_file(tmp_path / "cfg.py", shared, 200,
                                  "c.train.checkpoint_every = 100")
  workdir = tmp_path / "run"
  proc = _train_process(config_file, workdir)
  output = sigterm_after_steps(proc, workdir, steps=2, sig=sig)
  assert f"{name} received" in output and "Traceback" not in output
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["preempted"] and summary["steps"] < 200
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [summary["steps"]]
  assert len(load_history(workdir)) == summary["steps"]


@pytest.mark.parametrize("phase, marker, overrides", [
    # No compilation cache: the warm-up compiles every program (tens of seconds).
    ("warm-up", "warm-up: tracing and compiling", ("c.train.compilation_cache = False",)),
    # 2,000 held-out problems: the evaluation before RL takes a while on 2 cores.
    ("the evaluation before RL", "eval before RL on",
     ("c.data.synthetic.num_test = 2000", "c.data.eval_examples = 2000",
      "c.rollout.eval_batch = 8")),
], ids=["warm-up", "eval-before-rl"])
def test_a_stop_signal_in_warm_up_or_evaluation_ends_the_run_at_once(shared, tmp_path, phase,
                                                                      marker, overrides):
  """Warm-up and evaluations can take minutes, a Spot VM gives ~30 s: SIGTERM there
  ends the process within seconds, exit 0, saying nothing new needed a checkpoint."""
  config_file = write_config_file(tmp_path / "cfg.py", shared, 3, *overrides)
  workdir = tmp_path / "run"
  proc = _train_process(config_file, workdir)
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if marker in line:
      break
  start = time.time()
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=120)              # then read: communicate() would lose the lines
  elapsed = time.time() - start       # the iteration above had buffered
  output = "".join(seen) + proc.stdout.read()
  assert proc.returncode == 0, output
  assert elapsed < 30, (elapsed, output)
  assert f"SIGTERM received during {phase}: stopping now" in output, output
  assert "nothing new to checkpoint (the newest checkpoint is none: no step ran)" in output
  assert "Traceback" not in output
  assert not [p for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
  assert json.loads((workdir / "summary.json").read_text())["preempted"]


def test_a_final_evaluation_stopped_by_a_signal_is_run_on_resume(shared, tmp_path):
  """SIGTERM during the evaluation after the last step: the step is checkpointed
  without it and the summary says preempted, with no end accuracy (not the start's
  copied). The rerun finds the evaluation missing, runs it, and finishes."""
  config = small_config(shared, steps=2)
  config.train.eval_every = 2
  trainer = Trainer(config, tmp_path, log=lambda m: None)
  original, calls = trainer.evaluate, []

  def evaluate_then_stop():
    calls.append(trainer.step)
    if trainer.step == 2:
      os.kill(os.getpid(), signal.SIGTERM)      # arrives inside the stoppable evaluation
    return original()

  trainer.evaluate = evaluate_then_stop
  try:
    summary = trainer.run()
  finally:
    trainer.close()
  assert calls == [0, 2] and summary["preempted"] and summary["steps"] == 2
  assert "eval_sampled_accuracy_end" not in summary and "eval_sampled_gain" not in summary
  logged = []
  summary, _, resumed = run(config, tmp_path, log=logged.append)
  assert any("the evaluation after step 2 was stopped before it finished" in m for m in logged)
  assert not summary["preempted"] and "eval_sampled_accuracy_end" in summary
  assert resumed.eval_history[-1]["step"] == 2 and len(resumed.eval_history) == 2
  # The redone evaluation joins step 2's row of metrics.jsonl (one row per step).
  rows = load_history(tmp_path)
  assert [r["step"] for r in rows] == [1, 2]
  assert rows[-1]["eval_sampled_accuracy"] == summary["eval_sampled_accuracy_end"]
  from sagc_jax.runtime.metrics import finished_summary
  assert finished_summary(tmp_path, config.train) is not None


@pytest.mark.parametrize("key, value, match", [
    ("rollout.mode", "async", "rollout.mode='async'"),
    ("learner.lr", -1.0, "learner.lr=-1.0"),
    ("rollout.response_buckets", (8,), "rollout.response_buckets=(8,): the largest bucket"),
    ("rollout.response_buckets", (8, 32), "must equal rollout.max_new_tokens=16"),
    ("rollout.top_k", -1, "rollout.top_k=-1"),
    ("learner.mini_batches", 3, "does not split into learner.mini_batches=3 x learner.grad_accum=1"),
    ("mesh.shape", (0, 1), "mesh.shape=(0, 1)"),
    ("controller.delta", 1.5, "controller: delta"),
    ("rollout.rollouts_per_step", 6, "rollout.rollouts_per_step=6 is not divisible"),
    ("data.name", "gsm8k_local", "data.manual_dir is empty"),
    ("data.synthetic.max_ops", 0, "data.synthetic:"),
    ("data.train_prompts", -1, "data.train_prompts=-1 must be an integer >= 0"),
    ("data.train_prompts", 10**9, "data.train_prompts=1000000000 is more than the train split"),
    ("train.steps", 0, "train.steps=0"),
    ("sft.warmup_steps", 8, "sft.warmup_steps=8 must be an int in"),
    ("reward.workers", -1, "reward.workers=-1 must be an integer >= 0"),
    ("sft.guess_stage_steps", -1, "sft.guess_stage_steps=-1 must be an integer >= 0"),
    ("sft.guess_stage_prob", 1.5, "sft.guess_stage_prob=1.5 must be in"),
    ("rollout.refill_slots", -2, "rollout.refill_slots=-2 must be an integer >= 0"),
    ("rollout.page_size", 0, "rollout.page_size=0 must be a positive integer"),
    ("rollout.refill_slots", 3, "rollout.refill_slots=3 must be a multiple of the mesh's 'data' axis (2"),
])
def test_invalid_config_fails_at_startup_naming_the_key(shared, key, value, match):
  config = small_config(shared)
  section, *rest = key.split(".")
  node = config[section]
  for part in rest[:-1]:
    node = node[part]
  node[rest[-1]] = value
  with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
    validate(config)


def test_per_prompt_groups_of_different_sizes_keep_their_rows_together(shared, tmp_path):
  """One round with G_i = 4, 2, 1, 1 (per_prompt): each prompt's rows are consecutive,
  scored against that prompt's answer, its group stats are numpy's over its own rows,
  and the warmed programs serve it."""
  from sagc_jax.runtime import compilation

  config = small_config(shared, steps=1)
  config.controller.kind = "per_prompt"
  trainer = Trainer(config, tmp_path, log=lambda m: None)
  try:
    trainer.warmup()
    before = compilation.compile_count()
    sizes = np.array([4, 2, 1, 1])
    batch, stats = trainer.rl_step.sample_round(0, 2, 0, sizes)
    assert compilation.compile_count() == before
    owner = np.repeat(np.arange(4), sizes)
    assert batch.row_valid.sum() == 8
    np.testing.assert_array_equal(batch.group_ids[:8], owner)
    np.testing.assert_array_equal(stats.group_sizes, sizes)
    examples = [trainer.loader.source[int(i)] for i in stats.prompt_ids]
    texts = [trainer.inputs.detokenize(batch.response_tokens[r, :batch.lengths[r]])
             for r in range(8)]
    expected = trainer.inputs.reward_fn(texts, [examples[g]["answer"] for g in owner])
    np.testing.assert_array_equal(stats.rewards.scores, expected.scores)
    for g in range(4):
      lengths = stats.lengths[owner == g]
      assert stats.group_max[g] == lengths.max()
      assert stats.group_median[g] == np.median(lengths)
  finally:
    trainer.close()


def test_per_prompt_needs_one_sampler_call_per_round(shared):
  config = small_config(shared)
  config.controller.kind = "per_prompt"
  validate(config)
  config.rollout.refill_slots = 4
  with pytest.raises(ValueError, match="per_prompt' needs rollout.refill_slots=0"):
    validate(config)
  config.rollout.refill_slots = 0
  config.rollout.max_rows_per_call = 4
  with pytest.raises(ValueError, match="per_prompt' needs rollout.max_rows_per_call=0 or >= 8"):
    validate(config)


def test_too_long_prompts_fail_at_startup_naming_the_bucket(shared, tmp_path):
  """...before the supervised warm start, not after minutes of it (#16)."""
  config = small_config(shared)
  config.rollout.prompt_buckets = (4,)
  messages = []
  with pytest.raises(ValueError, match=r"rollout.prompt_buckets=\(4,\): train example \d+ "
                                       r"\(field 'prompt'\) has a \d+-token prompt"):
    Trainer(config, tmp_path, log=messages.append)
  assert not (tmp_path / "sft_model").exists()
  assert not any("supervised warm start" in m for m in messages)


@pytest.mark.parametrize("name", ["qwen2_5_3b", "llama3_2_3b_16k"])
def test_tpu_presets_need_a_checkpoint_path(name, tmp_path):
  namespace = {}
  exec((REPO / "configs" / f"{name}.py").read_text(), namespace)
  config = namespace["get_config"]()
  with pytest.raises(ValueError, match="model.path is empty"):
    validate(config)
  config.model.path, config.data.manual_dir = str(tmp_path), str(tmp_path)
  validate(config)                       # otherwise valid (refill slots split over 'data')


def _tree_snapshot(root: Path) -> dict[str, bytes]:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
          if p.is_file()}


def test_eval_cli_reports_accuracy_of_the_latest_checkpoint_and_writes_nothing(shared, tmp_path):
  """Eval is read-only on the run (before: it rewrote config.json, truncated
  metrics.jsonl of a live run and could move checkpoints aside)."""
  workdir = tmp_path / "run"
  run(small_config(shared, steps=2), workdir)
  before = _tree_snapshot(workdir)
  out = tmp_path / "eval" / "result.json"
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.eval", f"--workdir={workdir}",
                         "--examples=16", f"--out={out}", "--config.train.eval_k=4"],
                        capture_output=True, text=True, env={**os.environ}, timeout=600)
  assert proc.returncode == 0, proc.stderr
  assert "held-out accuracy" in proc.stdout and "step 2" in proc.stdout
  assert "pass@4" in proc.stdout and "mean@4" in proc.stdout and "p90" in proc.stdout
  result = json.loads(out.read_text())
  assert result["eval_examples"] == 16 and 0 <= result["eval_accuracy"] <= 1
  assert 0 <= result["eval_mean@4"] <= result["eval_pass@4"] <= 1
  assert _tree_snapshot(workdir) == before
  # A bad setting is one line naming the flag, before anything is built.
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.eval", f"--workdir={workdir}",
                         "--config.train.eval_kk=4"], capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert "--config.train.eval_kk: no such config key (did you mean --config.train.eval_k?)" in (
      proc.stderr)


def test_eval_builds_only_what_evaluation_needs_and_matches_the_trainer(shared, tmp_path,
                                                                         monkeypatch):
  """``evaluate_run`` (the eval CLI) builds no learner, optimizer or controller, yet
  measures what the trainer measured for the same checkpoint; with the newest
  checkpoint damaged it falls back to the previous one and moves nothing."""
  from sagc_jax.training import evaluation as eval_cli
  from sagc_jax.rl import learner as learner_module
  from sagc_jax.control import controller as controller_module

  config = small_config(shared, steps=2)
  config.train.update(dict(eval_every=1, checkpoint_every=1))   # both at steps 1 and 2
  _, _, trainer = run(config, tmp_path)
  by_step = {e["step"]: e for e in trainer.eval_history}

  def refuse(*args, **kwargs):
    raise AssertionError("eval built a training-only component")
  monkeypatch.setattr(learner_module.Learner, "__init__", refuse)
  monkeypatch.setattr(controller_module, "controller_from_config", refuse)
  keys = ("eval_accuracy", "eval_sampled_accuracy", "eval_response_len",
          "eval_sampled_response_len")
  # Training-only settings do not stop an evaluation: a reward module that is not
  # importable here, a W&B project (accuracy comes from the task verifier).
  trained_elsewhere = config.copy_and_resolve_references()
  trained_elsewhere.reward.fns = ("module_only_on_the_training_host:bonus",)
  trained_elsewhere.train.wandb_project = "some-project"
  result = eval_cli.evaluate_run(trained_elsewhere, tmp_path, log=lambda m: None)
  assert result["step"] == 2
  assert {k: result[k] for k in keys} == {k: by_step[2][k] for k in keys}

  for path in (tmp_path / "checkpoints" / "2" / "params").rglob("*"):
    if path.is_file() and path.stat().st_size > 0:
      path.write_bytes(b"\0" * 7)                 # the newest checkpoint damaged on disk
  before = _tree_snapshot(tmp_path)
  messages = []
  result = eval_cli.evaluate_run(config, tmp_path, log=messages.append)
  assert result["step"] == 1 and any("checkpoint step 2" in m for m in messages)
  assert {k: result[k] for k in keys} == {k: by_step[1][k] for k in keys}
  assert _tree_snapshot(tmp_path) == before


def test_more_eval_examples_than_the_split_warns_once_with_both_numbers(shared, tmp_path):
  config = small_config(shared)
  config.data.eval_examples = 100                   # the test split holds 40
  messages = []
  trainer = Trainer(config, tmp_path, log=messages.append)
  try:
    first, second = trainer.evaluate(), trainer.evaluate()
  finally:
    trainer.close()
  warnings = [m for m in messages if "data.eval_examples=100" in m]
  assert len(warnings) == 1 and "holds 40 examples" in warnings[0]
  assert first["eval_examples"] == second["eval_examples"] == 40


def test_a_torn_last_metrics_line_is_dropped_on_resume(shared, tmp_path, capsys):
  """A kill -9 or a full disk can cut the last line of metrics.jsonl (or
  completions.jsonl) short; the resume drops it with one warning naming the file and
  rewrites the rows after the checkpoint."""
  config = small_config(shared, steps=3)
  run(config, tmp_path, max_steps=2)                    # checkpoint at step 2
  for name in ("metrics.jsonl", "completions.jsonl"):
    with open(tmp_path / name, "a", encoding="utf-8") as f:
      f.write('{"step": 3, "g": 4, "rew')               # a write cut short
  _, _, trainer = run(config, tmp_path)
  assert trainer.step == 3
  assert [r["step"] for r in load_history(tmp_path)] == [1, 2, 3]
  out = capsys.readouterr().out
  assert "metrics.jsonl: dropping its torn last line" in out
  assert "completions.jsonl: dropping its torn last line" in out
  # The torn row of a checkpointed step (not rerun) is written again from the checkpoint.
  straight = [deterministic_view(r) for r in load_history(tmp_path)]
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  lines[-1] = lines[-1][:len(lines[-1]) // 2]                 # step 3's row, cut
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
  messages = []
  config.train.steps = 4
  run(config, tmp_path, max_steps=1, log=messages.append)
  assert [r["step"] for r in load_history(tmp_path)] == [1, 2, 3, 4]
  assert [deterministic_view(r) for r in load_history(tmp_path)][:3] == straight
  assert any("the row of step 3 was missing; written again from checkpoint step 3" in m
             for m in messages), messages


def test_a_truncated_config_json_is_named_and_a_resume_rewrites_it(shared, tmp_path):
  """A cut-short workdir config.json: eval and export name the file and say how to
  recover; the resume that recovery names replaces it (with a warning) and goes on."""
  from sagc_jax.training import evaluation, export

  config = small_config(shared, steps=3)
  run(config, tmp_path, max_steps=2)
  path = tmp_path / "config.json"
  path.write_text(path.read_text()[:200])                # truncated by a full disk
  for call in (lambda: evaluation.load_run_config(tmp_path),
               lambda: export.export(str(tmp_path), str(tmp_path.parent / "out"))):
    with pytest.raises(ValueError, match=rf"{path} is not valid JSON .*python -m "
                                         r"sagc_jax.train --config"):
      call()
  messages = []
  trainer = Trainer(config, tmp_path, log=messages.append)
  try:
    trainer.run()
  finally:
    trainer.close()
  assert trainer.step == 3
  assert any(f"warning: {path} is not valid JSON" in m for m in messages)
  assert evaluation.load_run_config(tmp_path).train.steps == 3


def test_a_huge_prompt_record_is_refused_by_its_length_before_tokenizing(tmp_path):
  """A 20 MB record once took the token check 11 minutes and 7.9 GB: a prompt longer in
  characters than any bucket-sized prompt can be is refused at once, naming it."""
  from sagc_jax.models import load_tokenizer
  from sagc_jax.models.tokenizer import max_token_chars
  from sagc_jax.training.inputs import check_prompt_lengths

  tokenizer = load_tokenizer(build_tiny_checkpoint(tmp_path / "tiny"))
  config = preset("grpo", "sagc")
  config.rollout.prompt_buckets = (16, 32)
  source = [{"prompt": "1 + 2 ="}, {"prompt": "9" * 20_000_000}]
  start = time.perf_counter()
  with pytest.raises(ValueError, match=r"train example 1 \(field 'prompt'\) has 20,000,000 "
                                       r"characters, more than any 32-token prompt"):
    check_prompt_lengths(config, tokenizer, [("train", source)])
  assert time.perf_counter() - start < 5
  # The bound is safe: a prompt at the bound's length in one-character tokens is not
  # refused by it (the token check decides).
  assert max_token_chars(tokenizer) >= 1
  check_prompt_lengths(config, tokenizer, [("train", [{"prompt": "1 + 2 ="}])])


def test_a_too_long_record_in_a_jsonl_file_is_named_by_file_line_and_field(tmp_path):
  """The refusal names what a user can find: the file and line (1-based) and the
  field as the user's files call it, not an internal index and field."""
  from sagc_jax.data import example_location, load_split
  from sagc_jax.models import load_tokenizer
  from sagc_jax.training.inputs import check_prompt_lengths

  records = [{"question": f"{i} + 1 =", "answer": str(i + 1)} for i in range(60)]
  records[56]["question"] = "9" * 50_000                      # line 57
  (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  options = dict(files=("big.jsonl",), prompt_field="question")
  source = load_split("jsonl", "train", str(tmp_path / "tfds"), str(tmp_path), **options)
  config = preset("grpo", "sagc")
  config.data.update(dict(name="jsonl", manual_dir=str(tmp_path), **options))
  config.rollout.prompt_buckets = (32,)
  locate = lambda split, i: example_location("jsonl", split, i, str(tmp_path / "tfds"),
                                             str(tmp_path), **options)
  tokenizer = load_tokenizer(build_tiny_checkpoint(tmp_path / "tiny"))
  with pytest.raises(ValueError, match=r"big\.jsonl:57 \(field 'question'\) has 50,000 "
                                       r"characters"):
    check_prompt_lengths(config, tokenizer, [("train", source)], locate=locate)
