"""Rollout traces, their replay and calibration (numpy only: no model).

The replay is checked on the committed real trace of SmolLM2-135M-Instruct
(configs/traces/), against statistics computed here by plain loops.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sagc_jax.control import trace as trace_lib
from sagc_jax.control.calibration import calibration_report
from sagc_jax.control.trace_replay import DecodeCost, TraceWorld, replay, replay_config

TRACES = Path(__file__).resolve().parents[1] / "configs" / "traces"
BEFORE = TRACES / "smollm2_word_problems_before_rl.jsonl"
AFTER = TRACES / "smollm2_word_problems_after_rl.jsonl"
AOT_REPORT = TRACES / "llama3_2_3b_16k_v5e_4x4.json"


def _header(**extra):
  return {"sampling": {"max_new_tokens": 64},
          "controller": {"candidates": [2, 4], "tau": 1.5, "delta": 0.25, "seed": 0},
          "rollout": {"mode": "hold_prompts", "prompts_per_step": 4, "rollouts_per_step": 16},
          "decode_cost": {"a_s": 0.5, "b_s": 0.01}, **extra}


def _synthetic(tmp_path, prompts=12, k=8, seed=0, offset=0, name="t.jsonl"):
  rng = np.random.default_rng(seed)
  records = []
  for i in range(prompts):
    lengths = np.clip(rng.lognormal(3, 0.6, k), 1, 64).astype(int) + offset
    correct = rng.random(k) < (i % 4) / 3
    records.append(trace_lib.trace_record(i, 10 + i, lengths, correct.astype(float), correct,
                                          lengths >= 64))
  path = tmp_path / name
  trace_lib.write_trace(path, _header(), records)
  return path


def test_a_trace_round_trips_through_its_file(tmp_path):
  trace = trace_lib.read_trace(_synthetic(tmp_path))
  assert (trace.prompts, trace.responses, trace.max_new_tokens) == (12, 8, 64)
  assert trace.header["schema"] == trace_lib.SCHEMA
  assert trace.ids.tolist() == list(range(12))
  assert trace.lengths.dtype == np.int64 and trace.correct.dtype == bool


@pytest.mark.parametrize("corrupt, match", [
    (lambda lines: lines[:1], "holds no prompt"),
    (lambda lines: [lines[0], "{not json"], "line 2 is not JSON"),
    (lambda lines: lines[1:], "header"),
    (lambda lines: [lines[0], lines[1], json.dumps({**json.loads(lines[2]), "lengths": [3]})],
     "line 3: lengths, rewards, correct and truncated must be lists of one equal"),
    (lambda lines: [lines[0], json.dumps({**json.loads(lines[1]), "lengths": [0] * 8})],
     "line 2: lengths must be positive"),
])
def test_a_bad_trace_names_its_first_bad_line(tmp_path, corrupt, match):
  path = _synthetic(tmp_path)
  path.write_text("\n".join(corrupt(path.read_text().splitlines())) + "\n")
  with pytest.raises(ValueError, match=match):
    trace_lib.read_trace(path)
  with pytest.raises(ValueError, match="is not a file"):
    trace_lib.read_trace(tmp_path / "missing.jsonl")


def test_straggler_rates_match_a_loop_over_each_prompts_chunks(tmp_path):
  trace = trace_lib.read_trace(_synthetic(tmp_path, prompts=20, k=8))
  tau = 1.5
  for g in (2, 4):
    flags = []
    for row in trace.lengths:
      for c in range(len(row) // g):
        chunk = sorted(row[c * g:(c + 1) * g])
        median = (chunk[(g - 1) // 2] + chunk[g // 2]) / 2
        flags.append(chunk[-1] > tau * median)
    rates = trace_lib.straggler_rates(trace, g, tau, groups_per_step=4)
    assert rates["group_rate"] == pytest.approx(np.mean(flags))
    assert rates["group_low"] <= rates["group_rate"] <= rates["group_high"]
    # A step of 4 groups straggles at least as often as one group, at most 4 times as often.
    assert rates["group_rate"] - 0.05 <= rates["step_rate"] <= min(1, 4 * rates["group_rate"])
  curve = trace_lib.tau_curve(trace, (2, 4), (1.2, 1.5, 2.0, 3.0))
  assert all(np.diff(curve["G4"]) <= 0) and all(np.diff(curve["G2"]) <= 0)


def test_the_world_drifts_from_the_first_trace_to_the_second(tmp_path):
  first = trace_lib.read_trace(_synthetic(tmp_path, seed=1))
  second = trace_lib.read_trace(_synthetic(tmp_path, seed=1, offset=1000, name="after.jsonl"))
  world = TraceWorld([first, second], per_step=6, rounds=1, max_g=4, steps=50, seed=3,
                     length_cap=2000)
  assert (world.draw(0)[0]["lengths"] < 1000).all()
  assert (world.draw(49)[0]["lengths"] > 1000).all()
  middle = np.concatenate([(world.draw(s)[0]["lengths"] > 1000).ravel() for s in range(20, 30)])
  assert 0.2 < middle.mean() < 0.8
  # A group's responses are distinct draws from its prompt's pool.
  step = world.draw(7)[0]
  for pid, row in zip(step["ids"], step["lengths"]):
    pool = list(first.lengths[pid])
    for value in row:
      pool.remove(value)        # raises if drawn more often than recorded


def test_dapo_replays_the_rounds_that_the_recorded_rewards_call_for(tmp_path):
  trace = trace_lib.read_trace(_synthetic(tmp_path, prompts=16))
  config = replay_config(trace.header["controller"], trace.header["rollout"], steps=30)
  cost = DecodeCost.of(trace)
  grpo = replay([trace], config, cost, kinds=("sagc",), seed=0)["summary"]
  dapo = replay([trace], config, cost, kinds=("sagc",), dapo=True, max_rounds=3,
                seed=0)["summary"]
  # Prompts 0, 4, 8, 12 never pass and 3, 7, ... always do: their groups are dropped,
  # so DAPO samples more rounds and pays for them.
  for arm in ("static_G2", "static_G4"):
    assert grpo[arm]["rounds_per_step"] == 1.0
    assert 1.0 < dapo[arm]["rounds_per_step"] <= 3.0
    assert dapo[arm]["wall_clock_s"] > grpo[arm]["wall_clock_s"]


def test_decode_cost_prices_rows_times_the_longest_row():
  cost = DecodeCost(0.5, 0.01)
  got = cost([(np.array([3, 9, 4]), np.array([10])), (np.array([2, 2]), np.array([10]))])
  assert got["total_s"] == pytest.approx(0.5 + 0.01 * 3 * 9 + 0.5 + 0.01 * 2 * 2)


def test_the_replay_is_deterministic_in_its_seed(tmp_path):
  trace = trace_lib.read_trace(_synthetic(tmp_path))
  config = replay_config(trace.header["controller"], trace.header["rollout"], steps=40)
  run = lambda seed: replay([trace], config, DecodeCost.of(trace), seed=seed,
                            bootstrap=True)["summary"]
  assert run(4) == run(4)
  assert run(4) != run(5)


@pytest.mark.skipif(not BEFORE.exists(), reason="the committed SmolLM2 trace is missing")
def test_the_replay_predicts_the_held_out_half_of_a_real_trace():
  """The replay's straggler rate of each static G on one half of each prompt's recorded
  responses falls inside the bootstrap interval of the other half's empirical rate."""
  trace = trace_lib.read_trace(BEFORE)
  k = trace.responses // 2
  fit, held_out = trace.take(responses=np.arange(k)), trace.take(responses=np.arange(k, 2 * k))
  header = trace.header
  config = replay_config(header["controller"], header["rollout"], steps=400)
  summary = replay([fit], config, DecodeCost.of(trace), kinds=(), seed=0)["summary"]
  tau = float(header["controller"]["tau"])
  for g in header["controller"]["candidates"]:
    if g > k:
      continue
    interval = trace_lib.straggler_rates(held_out, g, tau, groups_per_step=1)
    replayed = summary[f"static_G{g}"]["group_straggler_rate"]
    assert interval["group_low"] <= replayed <= interval["group_high"], (g, replayed, interval)


@pytest.mark.skipif(not BEFORE.exists(), reason="the committed SmolLM2 trace is missing")
def test_calibration_recommends_the_cheapest_setting_per_unit_of_signal():
  trace = trace_lib.read_trace(BEFORE)
  report = calibration_report(trace, DecodeCost.of(trace), steps=60, replicates=2,
                              taus=(1.5, 2.5), deltas=(0.25,), log=lambda m: None)
  arms = report["replay"]["arms"]
  sagc = {k: v["seconds_per_signal"] for k, v in arms.items() if k.startswith("sagc")}
  rec = report["recommended"]
  assert sagc[rec["arm"]] == min(sagc.values())
  assert f"--config.controller.tau={rec['tau']:g}" in rec["overrides"]
  assert set(report["straggler_rates"]) == {f"G{g}" for g in report["candidates"]}
  json.dumps(report)                       # report.json holds it
