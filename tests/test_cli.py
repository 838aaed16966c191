"""Command-line configs: every learner key settable, ``learner.algorithm`` selects its
preset wherever it is set (explicit keys win), bad overrides end in one line and exit
status 2, and every CLI's --help exits 0."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from sagc_jax.config import base_config, learner_config
from sagc_jax.rl.config import ALGORITHM_PRESETS, DERIVED_FIELDS, LearnerConfig

REPO = Path(__file__).resolve().parents[1]


def _parsed(*args: str):
  """The ``--config`` of a fresh flag set after parsing ``args`` (as a CLI would)."""
  argv = ["prog", *args]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values(argv)
  return values


def test_every_learner_setting_is_in_the_config():
  fields = {f.name for f in dataclasses.fields(LearnerConfig)} - set(DERIVED_FIELDS)
  assert set(base_config().learner.keys()) == fields


def test_unset_optional_keys_take_command_line_values():
  config = _parsed(
      f"--config={REPO / 'configs/grpo_sagc.py'}", "--config.learner.normalize_std=False",
      "--config.learner.clip_c=3.0", "--config.controller.initial_g=8").config
  assert config.learner.normalize_std is False and config.learner.clip_c == 3.0
  assert config.controller.initial_g == 8
  assert learner_config(config).clip_c == 3.0
  assert learner_config(config).normalize_std is False


def _config_file(tmp_path, body: str) -> Path:
  path = tmp_path / "my_config.py"
  path.write_text("from sagc_jax.config import preset\n\n\ndef get_config():\n"
                  "  c = preset('grpo', 'sagc')\n" + body + "  return c\n")
  return path


def test_a_config_file_that_sets_only_the_algorithm_trains_dapo(tmp_path):
  """``c.learner.algorithm = 'dapo'`` on a GRPO config trains DAPO, not GRPO settings
  under the DAPO name (the preset is resolved when the config becomes a LearnerConfig,
  wherever the key was set)."""
  path = _config_file(tmp_path, '  c.learner.algorithm = "dapo"\n')
  config = _parsed(f"--config={path}").config
  got = learner_config(config)
  assert got.algorithm == "dapo"
  assert (got.clip_low, got.clip_high, got.kl_coef, got.agg, got.dynamic_sampling) == (
      0.2, 0.28, 0.0, "token-mean", True)
  assert got.overlong_buffer == config.rollout.max_new_tokens // 4
  # Reference values written out here, not read from ALGORITHM_PRESETS: the preset
  # itself is what is under test.
  assert got.kl_coef != LearnerConfig().kl_coef


def test_an_explicit_key_wins_over_the_algorithm_preset(tmp_path):
  path = _config_file(tmp_path, '  c.learner.algorithm = "dapo"\n  c.learner.clip_high = 0.3\n')
  got = learner_config(_parsed(f"--config={path}").config)
  assert got.algorithm == "dapo" and got.clip_high == 0.3 and got.agg == "token-mean"
  got = learner_config(_parsed(f"--config={path}", "--config.learner.clip_high=0.25",
                               "--config.learner.kl_coef=0.01").config)
  assert (got.clip_high, got.kl_coef, got.dynamic_sampling) == (0.25, 0.01, True)


def test_algorithm_on_the_command_line_applies_its_preset():
  config = _parsed(
      f"--config={REPO / 'configs/grpo_sagc.py'}", "--config.learner.algorithm=dapo",
      "--config.learner.clip_high=0.3", "--config.rollout.max_new_tokens=64",
      "--config.rollout.response_buckets=(64,)").config
  got = learner_config(config)
  dapo = ALGORITHM_PRESETS["dapo"]
  assert got.algorithm == "dapo"
  assert got.agg == dapo["agg"] == "token-mean"
  assert got.kl_coef == 0.0 and got.dynamic_sampling is True
  assert got.clip_high == 0.3                 # the user's own choice wins
  assert got.overlong_buffer == 64 // 4


def test_algorithm_on_the_command_line_back_to_grpo():
  got = learner_config(_parsed(
      f"--config={REPO / 'configs/dapo_sagc.py'}", "--config.learner.algorithm=grpo").config)
  assert (got.agg, got.kl_coef, got.dynamic_sampling, got.overlong_buffer, got.clip_high) == (
      "seq-mean-token-mean", 0.04, False, 0, 0.2)


def test_a_preset_that_sets_a_key_keeps_it_under_the_command_line_algorithm():
  plain = learner_config(_parsed(f"--config={REPO / 'configs/tiny_cpu.py'}").config)
  same = learner_config(_parsed(f"--config={REPO / 'configs/tiny_cpu.py'}",
                                "--config.learner.algorithm=grpo").config)
  assert same == plain
  assert plain.kl_coef == 0.01 != ALGORITHM_PRESETS["grpo"]["kl_coef"]   # the file's own


@pytest.mark.parametrize("arg, expected", [
    ("--config.train.stepz=3", "error: --config.train.stepz: no such config key "
                               "(did you mean --config.train.steps?)"),
    ("--config.trian.steps=3", "error: --config.trian.steps: no such config key "
                               "(did you mean --config.train.steps?)"),
    ("--config.train.steps=abc", "error: flag --config.train.steps=abc: invalid literal"),
    ("--config.controller.initial_g=3", "error: controller: initial_g=3 is not one of "
                                        "candidates (4, 8, 16)"),
    ("--config.reward.workers=-1", "error: reward.workers=-1 must be an integer >= 0"),
    ("--max_steps=-1", "error: --max_steps=-1 must be >= 1"),
    ("--max_steps=0", "error: --max_steps=0 must be >= 1"),
])
def test_bad_override_is_one_line_and_exit_2(commands, tmp_path, arg, expected):
  proc = commands.run("sagc_jax.train", f"--config={REPO / 'configs/tiny_cpu.py'}",
                      f"--workdir={tmp_path / 'run'}", arg, cwd=tmp_path)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
  assert not (tmp_path / "run").exists()                 # nothing was started


@pytest.mark.parametrize("tool, expected", [
    ("train", "Any ``--config.KEY=VALUE`` overrides"), ("eval", "--workdir"), ("export", "--out"),
    ("simulate", "--claims_seeds"), ("compare", "--merge_only"), ("claims", "--adaptation"),
    ("figures", "--only"), ("bench", "sampler"), ("aot", "--topology")])
def test_every_cli_help_exits_0(commands, tool, expected):
  """The flags are parsed before absl.app runs (for one-line errors): --help too."""
  proc = commands.run(f"sagc_jax.{tool}", "--help")
  assert proc.returncode == 0, proc.stderr
  assert expected in proc.stdout, proc.stdout
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("examples", ["0", "-5"])
def test_eval_refuses_a_non_positive_example_count(commands, tmp_path, examples):
  proc = commands.run("sagc_jax.eval", f"--workdir={tmp_path}", f"--examples={examples}")
  assert proc.returncode == 2, proc.stderr
  assert f"--examples {examples} must be >= 1" in proc.stderr
  assert "Traceback" not in proc.stderr


def test_a_config_key_given_twice_is_refused_and_an_empty_tuple_clears(commands, tmp_path):
  """ml_collections joins a tuple key given twice ((4, 8) + (16, 32)): refused, in the
  config-file tools (one line, exit 2, nothing started) and in eval's overrides."""
  from sagc_jax.cli import apply_config_overrides
  from sagc_jax.config import preset

  proc = commands.run("sagc_jax.train", f"--config={REPO / 'configs/tiny_cpu.py'}",
                      f"--workdir={tmp_path / 'run'}", "--config.controller.candidates=(4,8)",
                      "--config.controller.candidates=(16,32)", cwd=tmp_path)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines == ["error: --config.controller.candidates is given twice ('(4,8)' and "
                   "'(16,32)'): give it once (a tuple whole, e.g. "
                   "--config.controller.candidates='(4, 8)'; '()' clears it)"], proc.stderr
  assert not (tmp_path / "run").exists()
  config = preset("grpo", "sagc")
  with pytest.raises(ValueError, match=r"--config.train.steps is given twice \('3' and '4'\): "
                     r"give it once$"):       # a scalar: no tuple hint
    apply_config_overrides(config, ["--config.train.steps=3", "--config.train.steps=4"])
  config.data.eval_files = ("a.jsonl",)
  assert apply_config_overrides(config, ["--config.data.eval_files=()"]).data.eval_files == ()
  parsed = _parsed(f"--config={REPO / 'configs/tiny_cpu.py'}",
                   "--config.controller.candidates=(4, 16)").config
  assert parsed.controller.candidates == (4, 16)


def test_rerunning_a_finished_run_prints_its_summary_without_building_anything(commands,
                                                                                tmp_path):
  """summary.json of a run that finished train.steps: printed, nothing rebuilt (no data
  prepared, no compilation); a run stopped early, or asked for more steps, trains on."""
  import json

  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "summary.json").write_text(json.dumps({
      "steps": 3, "preempted": False, "eval_sampled_accuracy_start": 0.25,
      "eval_sampled_accuracy_end": 0.5}))
  proc = commands.run("sagc_jax.train", f"--config={REPO / 'configs/tiny_cpu.py'}",
                      f"--workdir={workdir}", "--config.train.steps=3", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  assert f"{workdir} finished all 3 steps earlier" in proc.stdout
  assert "0.250 before RL -> 0.500 after 3 steps" in proc.stdout
  assert sorted(p.name for p in workdir.iterdir()) == ["summary.json"]   # nothing built
  from types import SimpleNamespace
  from sagc_jax.runtime.metrics import finished_summary
  train = lambda steps, budget=0.0: SimpleNamespace(steps=steps, time_budget_s=budget)
  assert finished_summary(str(workdir), train(4)) is None               # more steps: train
  (workdir / "summary.json").write_text(json.dumps({"steps": 3, "preempted": True}))
  assert finished_summary(str(workdir), train(3)) is None               # stopped early
  # A budget-stopped run is finished for the same budget only.
  (workdir / "summary.json").write_text(json.dumps({"steps": 3, "preempted": False,
                                                    "time_budget_s": 9.0,
                                                    "budget_spent": True}))
  assert finished_summary(str(workdir), train(100, 9.0)) is not None
  assert finished_summary(str(workdir), train(100, 20.0)) is None       # a larger budget


def test_commands_start_without_transformers_torch_advice():
  """On an install without torch transformers prints "PyTorch was not found ..." at
  import; every command turns that advisory off before importing it."""
  hide_torch = "import sys; sys.modules['torch'] = None; "
  env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
  plain = subprocess.run([sys.executable, "-c", hide_torch + "import transformers"],
                         capture_output=True, text=True, env=env, timeout=120)
  assert "PyTorch was not found" in plain.stderr + plain.stdout    # the message exists
  ours = subprocess.run(
      [sys.executable, "-c", hide_torch + "from sagc_jax.runtime.platform import "
       "prepare_process; prepare_process(); import transformers"],
      capture_output=True, text=True, env=env, timeout=120)
  assert ours.returncode == 0 and "PyTorch" not in ours.stderr + ours.stdout, ours.stderr


def test_a_host_without_a_tpu_runs_our_commands_on_cpu_without_the_tpu_probe():
  """choose_platform (called by every CLI before JAX starts): JAX_PLATFORMS=cpu on a
  host with no TPU device file, no TPU environment and no GPU plugin; an explicit
  JAX_PLATFORMS or any TPU sign is left alone (pods keep their platform)."""
  from sagc_jax.runtime import platform

  env = {}
  expected = None if platform.has_tpu({}) or platform._has_gpu_plugin() else "cpu"
  assert platform.choose_platform(env) == expected and env.get("JAX_PLATFORMS") == expected
  for env in ({"JAX_PLATFORMS": "tpu"}, {"TPU_ACCELERATOR_TYPE": "v5litepod-16"},
              {"TPU_WORKER_HOSTNAMES": "a,b"}):
    before = dict(env)
    assert platform.choose_platform(env) is None and env == before
  if expected == "cpu":
    # With libtpu installed, a plain JAX start logs its TPU probe; ours does not.
    script = ("from sagc_jax.runtime.platform import choose_platform; choose_platform(); "
              "import jax; print(jax.devices()[0].platform)")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.stdout.strip() == "cpu", proc.stderr
    assert "host bounds" not in proc.stderr and "libtpu" not in proc.stderr.lower()
