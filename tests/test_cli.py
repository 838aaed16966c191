"""Command-line configs: every learner key settable, the algorithm override re-applies
its preset, and bad overrides end in one line and exit status 2."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from sagc_jax.cli import config_with_algorithm_override
from sagc_jax.config import base_config, learner_config
from sagc_jax.rl.learner import ALGORITHM_PRESETS, DERIVED_FIELDS, LearnerConfig

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
  config = config_with_algorithm_override(_parsed(
      f"--config={REPO / 'configs/grpo_sagc.py'}", "--config.learner.normalize_std=False",
      "--config.learner.clip_c=3.0", "--config.controller.initial_g=8"))
  assert config.learner.normalize_std is False and config.learner.clip_c == 3.0
  assert config.controller.initial_g == 8
  assert learner_config(config).clip_c == 3.0


def test_algorithm_override_applies_the_preset_and_keeps_explicit_keys():
  config = config_with_algorithm_override(_parsed(
      f"--config={REPO / 'configs/grpo_sagc.py'}", "--config.learner.algorithm=dapo",
      "--config.learner.clip_high=0.3", "--config.rollout.max_new_tokens=64"))
  dapo = ALGORITHM_PRESETS["dapo"]
  assert config.learner.algorithm == "dapo"
  assert config.learner.agg == dapo["agg"] == "token-mean"
  assert config.learner.kl_coef == 0.0 and config.learner.dynamic_sampling is True
  assert config.learner.clip_high == 0.3                 # the user's own choice wins
  assert config.learner.overlong_buffer == 64 // 4


def test_algorithm_override_back_to_grpo():
  config = config_with_algorithm_override(_parsed(
      f"--config={REPO / 'configs/dapo_sagc.py'}", "--config.learner.algorithm=grpo"))
  grpo = ALGORITHM_PRESETS["grpo"]
  assert (config.learner.agg, config.learner.kl_coef, config.learner.dynamic_sampling,
          config.learner.overlong_buffer, config.learner.clip_high) == (
              grpo["agg"], grpo["kl_coef"], False, 0, grpo["clip_high"])


def test_same_algorithm_override_changes_nothing_else():
  plain = _parsed(f"--config={REPO / 'configs/tiny_cpu.py'}").config
  same = config_with_algorithm_override(_parsed(
      f"--config={REPO / 'configs/tiny_cpu.py'}", "--config.learner.algorithm=grpo"))
  assert same.to_dict() == plain.to_dict()
  assert plain.learner.kl_coef != ALGORITHM_PRESETS["grpo"]["kl_coef"]   # the file's own


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
def test_bad_override_is_one_line_and_exit_2(tmp_path, arg, expected):
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.train",
                         f"--config={REPO / 'configs/tiny_cpu.py'}",
                         f"--workdir={tmp_path / 'run'}", arg],
                        capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
  assert not (tmp_path / "run").exists()                 # nothing was started


def test_help_still_works():
  """The flags are parsed before absl.app runs (for one-line errors): --help too."""
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.train", "--helpshort"],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1, proc.stderr          # absl's help flags exit with 1
  assert "--workdir" in proc.stdout and "one training run" in proc.stdout
  assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("examples", ["0", "-5"])
def test_eval_refuses_a_non_positive_example_count(tmp_path, examples):
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.eval", f"--workdir={tmp_path}",
                         f"--examples={examples}"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr
  assert f"--examples {examples} must be >= 1" in proc.stderr
  assert "Traceback" not in proc.stderr
