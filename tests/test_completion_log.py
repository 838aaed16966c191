"""Sampled completions logged for reading (#15): completions.jsonl, TensorBoard text,
optional Weights & Biases (offline here)."""

from __future__ import annotations

import json
import re

import pytest

from sagc_jax.config import preset, validate


def _exact_match(completion: str, answer: str) -> float:
  """The synthetic task's reward, re-derived: the integer of the last 'answer N' line."""
  lines = re.findall(r"^answer (.*)$", completion, re.MULTILINE)
  return float(bool(lines) and re.fullmatch(r"-?\d+", lines[-1].strip()) is not None
               and lines[-1].strip() == answer.strip())


def test_completions_are_logged_every_n_steps_with_their_rewards(shared, tmp_path,
                                                                 monkeypatch):
  from test_trainer import run, small_config
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
  config = small_config(shared, steps=4)
  config.train.update(dict(log_completions_every=2, log_completions=3,
                           wandb_project="sagc-test"))
  run(config, tmp_path / "run")
  records = [json.loads(line) for line in
             (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [2, 2, 2, 4, 4, 4]
  for r in records:
    assert set(r) >= {"group", "prompt", "completion", "answer", "reward", "terms", "correct",
                      "length"}
    assert r["reward"] == _exact_match(r["completion"], r["answer"]) == r["correct"]
    assert r["terms"] == {"exact_match": r["reward"]}
    assert r["prompt"].strip() and 0 < r["length"] <= 16
  # Rows spread over the batch: the first and the last group of the step are shown.
  assert records[0]["group"] == 0 and records[2]["group"] > 0
  events = b"".join(p.read_bytes() for p in (tmp_path / "run" / "tensorboard").glob("events*"))
  assert b"completions" in events and records[0]["prompt"][:20].encode() in events
  # W&B (offline mode): the run was created and finished.
  offline = list((tmp_path / "run").parent.rglob("offline-run-*"))
  assert offline, list((tmp_path).rglob("*"))[:20]
  run_id = (tmp_path / "run" / "wandb_run_id").read_text().strip()
  assert re.fullmatch(r"[0-9a-f]{16}", run_id) and any(run_id in p.name for p in offline)


def test_wandb_without_a_login_falls_back_to_offline_and_says_so(shared, tmp_path,
                                                                 monkeypatch):
  """W&B installed, no API key anywhere (no WANDB_API_KEY, no netrc, no WANDB_MODE):
  the run logs offline and says how to upload, instead of failing after start-up."""
  import wandb

  from test_trainer import run, small_config
  wandb.teardown()          # wandb keeps the settings of an earlier run in this process
  for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_CONFIG_DIR", "NETRC"):
    monkeypatch.delenv(key, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
  (tmp_path / "home").mkdir()
  config = small_config(shared, steps=1)
  config.train.wandb_project = "sagc-test"
  messages = []
  summary, _, _ = run(config, tmp_path / "run", log=messages.append)
  assert summary["steps"] == 1
  said = [m for m in messages if m.startswith("W&B: not logged in")]
  assert len(said) == 1 and "logs offline to" in said[0], messages
  offline = list(tmp_path.rglob("offline-run-*"))
  assert len(offline) == 1 and f"`wandb sync {offline[0]}`" in said[0], said


def test_a_resumed_run_drops_the_completions_of_steps_it_redoes(tmp_path):
  from sagc_jax.runtime.metrics import MetricsWriter
  writer = MetricsWriter(tmp_path, 10, tensorboard=False)
  for step in (1, 2, 3):
    writer.write_completions(step, [{"group": 0, "prompt": "p", "completion": "c",
                                     "answer": "1", "reward": 0.0, "terms": {},
                                     "correct": False, "length": 1}])
  writer.truncate_after(2)
  writer.close()
  steps = [json.loads(line)["step"] for line in
           (tmp_path / "completions.jsonl").read_text().splitlines()]
  assert steps == [1, 2]


def test_wandb_project_needs_the_package(monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  c = preset("grpo", "sagc")
  c.train.wandb_project = "x"
  with pytest.raises(ValueError, match="train.wandb_project='x' needs the wandb package"):
    validate(c)
