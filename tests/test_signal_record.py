"""The replay's budget flag, the learning measures' record of predictions and the rule
that validates a measure."""

import datetime
import json

import numpy as np
import pytest

from sagc_jax.config import controller_settings
from sagc_jax.control.budget import budget_from_flag
from sagc_jax.experiments import signal_record
from sagc_jax.experiments.signals import validated_measures
from sagc_jax.replay import trace as trace_lib
from sagc_jax.replay.costs import DecodeCost
from sagc_jax.replay.entry_points import replay


def _half_right_trace(tmp_path):
  """16 prompts x 8 responses of 20 tokens, every prompt half right with distinct
  rewards (every group informative), traced under hold_prompts with 4 prompts."""
  header = {"sampling": {"max_new_tokens": 64},
            "controller": {"candidates": [2, 4], "tau": 1.5, "delta": 0.25, "seed": 0},
            "rollout": {"mode": "hold_prompts", "prompts_per_step": 4, "rollouts_per_step": 16},
            "decode_cost": {"step_s": 1.0, "slot_s": 0.01}}
  records = [trace_lib.trace_record(i, 10, np.full(8, 20), np.arange(8) % 2 + 0.01 * np.arange(8),
                                    np.arange(8) % 2 == 0, np.zeros(8, bool)) for i in range(16)]
  trace_lib.write_trace(tmp_path / "t.jsonl", header, records)
  return trace_lib.read_trace(tmp_path / "t.jsonl")


@pytest.mark.parametrize("flag, rows, groups", [
    ("hold_prompts:3", {2: 6, 4: 12}, {2: 3, 4: 3}),      # 3 prompts at every G
    ("hold_rollouts:8", {2: 8, 4: 8}, {2: 4, 4: 2}),      # 8 rows: 8 / G prompts
])
def test_the_budget_flag_replays_a_trace_under_either_mode(tmp_path, flag, rows, groups):
  trace = _half_right_trace(tmp_path)
  rollout = budget_from_flag(flag, trace.header["rollout"], [2, 4])
  result = replay([trace], controller_settings(trace.header["controller"]), DecodeCost.of(trace),
                  rollout=rollout, steps=3, kinds=(), max_rounds=1)
  for g in (2, 4):
    col = result["traces"][f"static_G{g}"]
    assert col["rows"] == [rows[g]] * 3 and col["n_groups"] == [groups[g]] * 3
    # One round: 1 s per decode step to the longest row (20) + 0.01 s per decoded token.
    assert col["rollout_s"] == pytest.approx([20 * 1.0 + 0.01 * 20 * rows[g]] * 3)
    # Informative groups: 1 - p^G - (1 - p)^G per group at p = 1/2.
    assert col["informative"] == pytest.approx([groups[g] * (1 - 2 * 0.5 ** g)] * 3)


@pytest.mark.parametrize("flag, match", [
    ("hold_prompt:8", "is not MODE:SIZE"), ("hold_prompts:0", "is not MODE:SIZE"),
    ("hold_rollouts", "is not MODE:SIZE"), ("hold_rollouts:6", r"not divisible by group size\(s\) \[4\]"),
])
def test_a_bad_budget_flag_is_named(flag, match):
  with pytest.raises(ValueError, match=match):
    budget_from_flag(flag, {}, [2, 4])


def _checked(**verdicts):
  return {"checked": {m: {"grpo": {"verdict": v}} for m, v in verdicts.items()}}


def test_a_measure_is_validated_only_when_it_passes_every_workload_mode_that_tests_it():
  checks = {"workloads": {"mod10": _checked(a="passes", b="passes", c="passes"),
                          "mod7": _checked(a="passes", b="passes", c="passes"),
                          "extreme_prompts": _checked(a="passes", b="fails", c="cannot test"),
                          "extreme_rollouts": {"predictions": {}}}}
  assert validated_measures(checks) == ["a", "c"]
  # One algorithm failing one workload-mode is enough.
  checks["workloads"]["extreme_rollouts"] = {"checked": {"a": {"grpo": {"verdict": "passes"},
                                                               "dapo": {"verdict": "fails"}}}}
  assert validated_measures(checks) == ["c"]
  # And a measure tested on one workload-mode only is not validated.
  assert validated_measures({"workloads": {"x": _checked(a="passes")}}) == []


def _at(iso):
  return datetime.datetime.fromisoformat(iso).timestamp()


def test_the_check_says_whether_the_predictions_came_before_the_first_run(tmp_path):
  replay_out = {"predictions": {
      "grpo tau 1.8": {"m": [{"first": "static_G4", "second": "static_G8", "mean": 2.0}]},
      "grpo tau 2": {"m": [{"first": "static_G4", "second": "static_G8", "mean": -2.0}]}}}
  checks = signal_record.add_predictions({"workloads": {}}, "w", replay_out,
                                         config_digest="abc", now=_at("2026-12-05T05:00:00+00:00"))
  entry = checks["workloads"]["w"]
  assert entry["predicted_at"] == "2026-12-05T05:00:00+00:00"
  assert entry["predictions"] == {"grpo": replay_out["predictions"]["grpo tau 1.8"]}
  with pytest.raises(ValueError, match="already holds predictions"):
    signal_record.add_predictions(checks, "w", replay_out, config_digest="abc", now=0.0)
  stretch = lambda iso: {"started": _at(iso)}
  record = {"config_digest": "abc", "runs": {"a_seed0": [stretch("2026-12-05T05:30:00+00:00")],
                                             "b_seed0": [stretch("2026-12-05T05:10:00+00:00"),
                                                         stretch("2026-12-05T06:00:00+00:00")]}}
  got = signal_record.prediction_timing(entry, record)
  assert got == {"predicted_at": "2026-12-05T05:00:00+00:00",
                 "first_run_started": "2026-12-05T05:10:00+00:00",
                 "predicted_before_learning": True, "config_matches": True}
  record["runs"]["c_seed0"] = [stretch("2026-12-05T04:59:59+00:00")]
  record["config_digest"] = "other"
  got = signal_record.prediction_timing(entry, record)
  assert not got["predicted_before_learning"] and not got["config_matches"]
  with pytest.raises(ValueError, match="records no run start time"):
    signal_record.prediction_timing(entry, {})
  # The check reads the committed predictions and the comparison's two files.
  (tmp_path / "compare.json").write_text(json.dumps(record))
  pair = {"first": "grpo_static4", "second": "grpo_static8", "significant": True,
          "mean_accuracy_over_h": {"mean": 0.1}}
  (tmp_path / "per_hour.json").write_text(json.dumps({"pairs": {"grpo": {"pairs": [pair]}}}))
  checked = signal_record.check_workload(checks, "w", tmp_path)["workloads"]["w"]
  assert checked["predicted_before_learning"] is False
  assert checked["checked"]["m"]["grpo"]["agree"] == 1


def test_the_pass_rate_histogram_counts_prompts_per_bin(tmp_path):
  header = {"sampling": {"max_new_tokens": 8}, "controller": {"candidates": [2], "tau": 1.5},
            "rollout": {"mode": "hold_prompts", "prompts_per_step": 1, "rollouts_per_step": 2}}
  records = [trace_lib.trace_record(i, 3, [4] * 10, [0.0] * 10, [j < right for j in range(10)],
                                    [0] * 10) for i, right in enumerate((0, 1, 5, 9, 10))]
  trace_lib.write_trace(tmp_path / "t.jsonl", header, records)
  got = trace_lib.pass_rate_histogram(trace_lib.read_trace(tmp_path / "t.jsonl"))
  # p = 0, 0.1, 0.5, 0.9, 1: one prompt in each of five bins, none in (0.1, 0.5).
  assert got["bins"] == {"0": 0.2, "(0, 0.1]": 0.2, "(0.1, 0.5)": 0.0, "[0.5, 0.9)": 0.2,
                         "[0.9, 1)": 0.2, "1": 0.2}
  assert got["extreme_share"] == pytest.approx(0.4)
