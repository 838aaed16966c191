"""A controller kind outside the package, named by import path and nothing else: the
config's ``controller.kind`` (and its ``options``), ``simulate --kinds``, ``compare.kinds``
and the learning check all reach it through the registry (``control.controller``).

``LargestUnderTime`` reads the step time the protocol now carries: it runs the largest
G whose last step took under ``max_step_s`` (a G never timed counts as fast), else the
smallest. It is defined here, in a test module, as a user would define one in theirs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_collections
import pytest

from sagc_jax.control.protocol import GroupPlan, Needs

REPO = Path(__file__).resolve().parents[1]
# Importable wherever the repository root is on the path: pytest and ``python -m`` from it.
KIND = "tests.test_custom_kind:LargestUnderTime"
ARM = "tests.test_custom_kind.LargestUnderTime"
TRACE = "configs/traces/smollm2_word_problems_after_rl.jsonl"


@dataclasses.dataclass(frozen=True)
class LargestUnderTimeSettings:
  candidates: tuple = (4, 8, 16)
  max_step_s: float = 60.0


class LargestUnderTime:
  """The largest G whose last step took under ``max_step_s`` seconds."""

  kind = KIND
  Settings = LargestUnderTimeSettings
  needs = Needs()

  def __init__(self, settings: LargestUnderTimeSettings):
    self.settings = settings
    self.last_s: dict[int, float] = {}
    self.g = min(settings.candidates)

  @classmethod
  def from_settings(cls, settings, *, prompts_for=None):
    return cls(settings)

  def plan(self, context=None) -> GroupPlan:
    fast = [g for g in self.settings.candidates
            if self.last_s.get(g, 0.0) < self.settings.max_step_s]
    self.g = max(fast) if fast else min(self.settings.candidates)
    return GroupPlan(self.g)

  def observe_step(self, groups) -> dict[str, float]:
    self.last_s[self.g] = groups.time.total_s
    return {"toy/last_step_s": groups.time.total_s,
            "toy/rollout_share": groups.time.rollout_s / groups.time.total_s,
            "toy/rewarded_groups": float(sum(r.max() > 0 for r in groups.rewards))}

  def state_dict(self) -> dict:
    return {"last_s": {str(g): s for g, s in self.last_s.items()}, "g": self.g}

  def load_state_dict(self, state) -> None:
    self.last_s = {int(g): float(s) for g, s in state["last_s"].items()}
    self.g = int(state["g"])


@pytest.mark.slow
def test_the_kind_trains_two_steps_of_the_tiny_config(shared, tmp_path, monkeypatch):
  """Its settings come from the section (``candidates``) and ``options``; it sees the
  step's rewards and process 0's seconds, measured before it observes; the run's
  straggler columns are measured for it at ``controller.tau``."""
  from sagc_jax.runtime.metrics import load_history
  from test_trainer import run, small_config

  monkeypatch.chdir(REPO)
  config = small_config(shared, steps=2)
  config.controller.update(dict(kind=KIND, options={"max_step_s": 1e9}))
  run(config, tmp_path)
  rows = load_history(tmp_path)
  assert [r["g"] for r in rows] == [4.0, 4.0]                 # the largest of (2, 4)
  for r in rows:
    assert 0 < r["toy/last_step_s"] == pytest.approx(r["time_total_s"])
    assert 0 < r["toy/rollout_share"] < 1
    assert 0 <= r["toy/rewarded_groups"] <= r["n_groups"]
    assert 0 <= r["group_straggler_rate"] <= r["step_straggler"] <= 1
    assert r["new_compilations"] == 0 or r["step"] == 1


def test_an_unknown_option_of_the_kind_is_refused_by_name():
  from sagc_jax.config import base_config, run_config

  config = base_config()
  config.controller.update(dict(kind=KIND, options={"max_step": 1.0}))
  with pytest.raises(ValueError, match="controller.options.max_step is not a setting of kind"):
    run_config(config)
  config.controller.update(dict(kind="tests.test_custom_kind:Nothing", options={}))
  with pytest.raises(ValueError, match="has no 'Nothing'"):
    run_config(config)


def test_the_kind_is_an_arm_of_a_trace_replay_and_gets_predictions(commands, tmp_path):
  """``simulate --trace --kinds``: the arm replays the committed trace, priced by its
  measured cost, and the learning check predicts its pairs and checks them against a
  comparison that resolved one."""
  proc = commands.run("sagc_jax.simulate", f"--trace={TRACE}", "--cost=cpu",
                      "--algorithms=grpo", "--replicates=3", "--steps=20",
                      f"--kinds=sagc,{KIND}", f"--out={tmp_path / 'r.json'}", cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((tmp_path / "r.json").read_text())
  assert {r["arm"] for r in result["rows"]} == {"static_G4", "static_G8", "static_G16",
                                                "sagc", ARM, "oracle"}
  pairs = next(iter(result["predictions"].values()))["informative_groups"]
  assert {(p["first"], p["second"]) for p in pairs if ARM in (p["first"], p["second"])}
  from sagc_jax.experiments.signals import check_learning

  per_hour = {"pairs": {"grpo": {"pairs": [{
      "first": f"grpo_{ARM}", "second": "grpo_static16", "significant": True,
      "p_holm": 0.01, "mean_accuracy_over_h": {"mean": 0.05, "half_width": 0.01, "n": 8}}]}}}
  checked = check_learning({"grpo": next(iter(result["predictions"].values()))}, per_hour)
  assert checked["informative_groups"]["grpo"]["resolved"] == 1      # predicted, checked
  assert not checked["informative_groups"]["grpo"]["unpredicted"]


@pytest.mark.slow
def test_the_kind_runs_as_an_arm_of_a_compare_in_its_child_process(shared, tmp_path,
                                                                    monkeypatch):
  """``compare.kinds``: the arm's training run is a child process that imports the kind
  from its path (the repository root, the directory compare starts in)."""
  from sagc_jax.experiments import arms as arms_lib
  from test_trainer import small_config

  monkeypatch.chdir(REPO)
  config = small_config(shared, steps=2)
  config.compare = ml_collections.ConfigDict(dict(algorithms=("grpo",), kinds=(KIND,)))
  runs = arms_lib.run_configs(config)
  assert f"grpo_{ARM}_seed0" in runs
  chosen = arms_lib.select_arms(runs, f"grpo_{ARM}")
  arms_lib.run_arms(config, tmp_path, chosen, log=lambda m: None)
  rows = [json.loads(line) for line in
          (tmp_path / "arms" / f"grpo_{ARM}_seed0" / "metrics.jsonl").read_text().splitlines()]
  assert [r["g"] for r in rows if r.get("step", 0) >= 1] == [4.0, 4.0]
  assert all(r["toy/last_step_s"] > 0 for r in rows if r.get("step", 0) >= 1)
