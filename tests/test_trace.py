"""Rollout traces, their replay and calibration (numpy only: no model).

The replay is checked on the committed real trace of SmolLM2-135M-Instruct
(configs/traces/), against statistics computed here by plain loops.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sagc_jax.config import controller_settings
from sagc_jax.replay import trace as trace_lib
from sagc_jax.experiments.calibration import calibration_report
from sagc_jax.replay.costs import DecodeCost
from sagc_jax.replay.engine import sagc_arm_name
from sagc_jax.replay.entry_points import replay
from sagc_jax.replay.worlds import TraceWorld

TRACES = Path(__file__).resolve().parents[1] / "configs" / "traces"
BEFORE = TRACES / "smollm2_word_problems_before_rl.jsonl"
AFTER = TRACES / "smollm2_word_problems_after_rl.jsonl"
AOT_REPORT = TRACES.parent / "aot" / "llama3_2_3b_16k_v5e_4x4.json"


def _header(**extra):
  return {"sampling": {"max_new_tokens": 64},
          "controller": {"candidates": [2, 4], "tau": 1.5, "delta": 0.25, "seed": 0},
          "rollout": {"mode": "hold_prompts", "prompts_per_step": 4, "rollouts_per_step": 16},
          "decode_cost": {"step_s": 0.5, "slot_s": 0.01}, **extra}


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


def replay_run(trace, cost, steps, **kwargs):
  """``replay`` of one trace with its run's controller section and rollout budget."""
  kwargs.setdefault("max_rounds", 1)
  return replay([trace], controller_settings(trace.header["controller"]), cost,
                rollout=trace.header["rollout"], steps=steps, **kwargs)


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
  world = TraceWorld([first, second], max_g=4, steps=50, seed=3, length_cap=2000)
  assert (world.block(0, 6, step=0)["lengths"] < 1000).all()
  assert (world.block(0, 6, step=49)["lengths"] > 1000).all()
  middle = np.concatenate([(world.block(6 * s, 6, s)["lengths"] > 1000).ravel()
                           for s in range(20, 30)])
  assert 0.2 < middle.mean() < 0.8
  # A group's responses are distinct draws from its prompt's pool in its source trace,
  # and an epoch hands out every prompt once.
  block = world.block(12, 12, step=25)
  assert sorted(block["ids"].tolist()) == list(range(12))
  for pid, row in zip(block["ids"], block["lengths"]):
    source = second if row[0] > 1000 else first
    pool = list(source.lengths[pid])
    for value in row:
      pool.remove(value)        # raises if drawn more often than recorded
  # The same position at the same step is the same rollout for every caller.
  np.testing.assert_array_equal(world.block(12, 12, 25)["lengths"], block["lengths"])


def test_a_second_trace_must_hold_the_same_prompts_and_responses(tmp_path):
  first = trace_lib.read_trace(_synthetic(tmp_path))
  fewer = first.take(responses=np.arange(6))
  with pytest.raises(ValueError, match="with 8 responses each, like the first"):
    TraceWorld([first, fewer], max_g=4, steps=10, seed=0)


def _uniform_trace(tmp_path, rewards_vary: bool, name: str):
  """16 prompts x 8 responses of 20 tokens; every prompt half right with all rewards
  distinct (any group's rewards vary) or all wrong with equal rewards."""
  records = []
  for i in range(16):
    correct = np.arange(8) % 2 == 0 if rewards_vary else np.zeros(8, bool)
    rewards = correct + 0.01 * np.arange(8) if rewards_vary else np.zeros(8)
    records.append(trace_lib.trace_record(i, 10, np.full(8, 20), rewards, correct,
                                          np.zeros(8, bool)))
  path = tmp_path / name
  trace_lib.write_trace(path, _header(), records)
  return trace_lib.read_trace(path)


def test_dapo_keeps_only_groups_whose_rewards_vary_and_pays_for_every_round(tmp_path):
  cost = DecodeCost(0.0, 1.0)            # seconds = the round's response tokens
  for vary in (False, True):
    trace = _uniform_trace(tmp_path, vary, f"t{vary}.jsonl")
    result = replay_run(trace, cost, 5, kinds=(), dapo=True, max_rounds=3, seed=0)
    for g in (2, 4):
      col = result["traces"][f"static_G{g}"]
      # 4 prompts per round (hold_prompts): all dropped -> 3 rounds, each observed;
      # all kept -> one round.
      rounds = 1 if vary else 3
      assert col["rounds"] == [rounds] * 5
      assert col["n_groups"] == [4 * rounds] * 5
      assert col["total_s"] == [rounds * 4 * g * 20.0] * 5
      # Signal from kept groups only: 4 p (1 - p) log2 G = log2 G at p = 1/2.
      assert col["signal"] == ([4 * np.log2(g)] * 5 if vary else [0.0] * 5)


def test_decode_cost_prices_the_longest_row_and_every_decoded_token():
  cost = DecodeCost(0.5, 0.01, learner_step_s=0.2, learner_token_s=0.001)
  rounds = [(np.array([3, 9, 4]), np.array([10])), (np.array([2, 2]), np.array([10]))]
  trained = (np.array([3, 9]), np.array([10, 10]))        # two rows: 22 prompt + 12 response
  got = cost(rounds, trained)
  assert got["rollout_s"] == pytest.approx(0.5 * 9 + 0.01 * 16 + 0.5 * 2 + 0.01 * 4)
  assert got["learner_s"] == pytest.approx(0.2 + 0.001 * 32)
  assert got["total_s"] == pytest.approx(got["rollout_s"] + got["learner_s"])


def _half_varied_trace(tmp_path):
  """16 prompts x 8 responses of 20 tokens: even prompts half right with distinct
  rewards (any group of theirs varies), odd prompts always wrong (none varies)."""
  records = []
  for i in range(16):
    vary = i % 2 == 0
    correct = np.arange(8) % 2 == 0 if vary else np.zeros(8, bool)
    rewards = correct + 0.01 * np.arange(8) if vary else np.zeros(8)
    records.append(trace_lib.trace_record(i, 10, np.full(8, 20), rewards, correct,
                                          np.zeros(8, bool)))
  trace_lib.write_trace(tmp_path / "half.jsonl", _header(), records)
  return trace_lib.read_trace(tmp_path / "half.jsonl")


def test_each_learning_measure_matches_hand_counts(tmp_path):
  """GRPO at G = 2 and 4 under hold_prompts (4 prompts a step), first step."""
  from sagc_jax.rl.losses import group_advantages

  trace = _half_varied_trace(tmp_path)
  col = replay_run(trace, DecodeCost(0.0, 1.0), 5, kinds=(), seed=0)["traces"]
  block = TraceWorld([trace], max_g=4, steps=5, seed=0).block(0, 4, 0)   # the first step
  varied = block["ids"] % 2 == 0
  for g in (2, 4):
    step = {key: col[f"static_G{g}"][key][0] for key in
            ("signal", "informative", "informative_rows", "advantage_mass")}
    p = np.where(varied, 0.5, 0.0)
    assert step["signal"] == pytest.approx(float(np.sum(4 * p * (1 - p) * np.log2(g))))
    assert step["informative"] == pytest.approx(float(np.sum(1 - p ** g - (1 - p) ** g)))
    assert step["informative_rows"] == g * varied.sum()
    # The learner's own advantages of the varied groups' drawn rewards (a pair of distinct
    # rewards: |A| = 1/sqrt(2) each).
    rewards = block["rewards"][varied, :g]
    ids = np.repeat(np.arange(len(rewards)), g)
    mass = float(np.abs(np.asarray(group_advantages(rewards.ravel(), ids))).sum())
    assert step["advantage_mass"] == pytest.approx(mass, rel=1e-4)
    if g == 2:
      assert step["advantage_mass"] == pytest.approx(np.sqrt(2) * varied.sum(), rel=1e-4)


def test_the_stragglers_share_cuts_each_row_at_tau_times_its_groups_median(tmp_path):
  """Each prompt: seven responses of 20 tokens and one of 60 (the cap is 64); every group
  of 8 holds all of them, so tau 1.5 cuts the 60 to 30: a group of G = 8 costs 200
  tokens, 170 without stragglers (seconds = tokens)."""
  from sagc_jax.experiments.calibration import straggler_savings

  records = [trace_lib.trace_record(i, 10, np.array([20] * 7 + [60]), np.zeros(8),
                                    np.zeros(8, bool), np.zeros(8, bool)) for i in range(8)]
  trace_lib.write_trace(tmp_path / "tail.jsonl", _header(), records)
  trace = trace_lib.read_trace(tmp_path / "tail.jsonl")
  section = dict(controller_settings(trace.header["controller"]), candidates=(8,))
  got = straggler_savings(trace, DecodeCost(0.0, 1.0), section, rollout=trace.header["rollout"],
                          steps=4, replicates=3, dapo=False, max_rounds=1)
  for mode in ("hold_prompts", "hold_rollouts"):
    assert got[mode]["straggler_share"]["static_G8"]["mean"] == pytest.approx(30 / 200)
  assert got["hold_prompts"]["rollout_without_stragglers_vs_largest_g"]["static_G8"][
      "mean"] == pytest.approx(1.0)


def test_a_measure_passes_only_when_it_orders_every_resolved_pair_like_learning():
  from sagc_jax.experiments.signals import check_learning, validated_measures

  pair = lambda first, second, mean, significant=True: {
      "first": first, "second": second, "significant": significant,
      "mean_accuracy_over_h": {"mean": mean}}
  per_hour = {"pairs": {"grpo": {"pairs": [
      pair("grpo_sagc", "grpo_static16", +0.1), pair("grpo_sagc", "grpo_static4", -0.05),
      pair("grpo_static16", "grpo_static4", -0.2), pair("grpo_static4", "grpo_static8", +0.1),
      pair("grpo_sagc", "grpo_static8", +0.01, significant=False),
      pair("grpo_prompt_aware", "grpo_sagc", +0.02)]}}}
  order = lambda first, second, mean: {"first": first, "second": second, "mean": mean}
  small_first = [order("sagc", "static_G16", 3.0), order("sagc", "static_G4", -1.0),
                 order("static_G16", "static_G4", -4.0), order("static_G4", "static_G8", 2.0)]
  large_first = [dict(p, mean=-p["mean"]) for p in small_first]
  got = check_learning({"grpo": {"small": small_first, "large": large_first,
                                 "few": small_first[:2]}}, per_hour)
  assert got["small"]["grpo"] == {"resolved": 4, "agree": 4, "disagreements": [],
                                  "unpredicted": ["grpo_prompt_aware vs grpo_sagc"],
                                  "verdict": "passes"}
  assert got["large"]["grpo"]["agree"] == 0 and got["large"]["grpo"]["verdict"] == "fails"
  assert got["few"]["grpo"]["verdict"] == "cannot test"        # 2 of the resolved predicted
  workload = lambda verdict: {"checked": {"small": {"grpo": {"verdict": verdict},
                                                    "dapo": {"verdict": "passes"}}}}
  assert validated_measures({"workloads": {"a": workload("passes")}}) == []
  assert validated_measures({"workloads": {"a": workload("passes"),
                                           "b": workload("passes")}}) == ["small"]
  assert validated_measures({"workloads": {"a": workload("passes"),
                                           "b": workload("fails")}}) == []


def test_calibrate_withholds_a_recommendation_without_a_validated_measure_that_agrees(tmp_path):
  # Rare successes (p = 1/8) and heavy-tailed lengths under a fixed row budget priced by
  # its tokens: per step, the utility favours small G (P(G) log2 G) and the rows whose
  # rewards vary favour large G (a group of 4 varies more often than one of 2).
  rng = np.random.default_rng(3)
  records = []
  for i in range(16):
    lengths = np.clip(rng.lognormal(3, 0.6, 8), 1, 64).astype(int)
    correct = rng.random(8) < 1 / 8
    records.append(trace_lib.trace_record(i, 10, lengths, correct.astype(float), correct,
                                          lengths >= 64))
  header = _header()
  header["rollout"] = {"mode": "hold_rollouts", "prompts_per_step": 4, "rollouts_per_step": 16}
  trace_lib.write_trace(tmp_path / "rare.jsonl", header, records)
  trace = trace_lib.read_trace(tmp_path / "rare.jsonl")
  cost = DecodeCost(0.0, 1e-3)
  section = controller_settings(trace.header["controller"])
  report = lambda validated: calibration_report(
      trace, cost, section, steps=40, replicates=3, taus=(1.5, 3.0), deltas=(0.1, 0.5),
      validated=validated, log=lambda m: None, **cost.settings(trace))
  none = report(())
  assert "no learning measure has passed" in none["recommended"]["withheld"]
  assert set(none["signals"]) == {"utility", "informative_groups", "informative_rows",
                                  "advantage_mass"}
  sagc_best = lambda measure: next(a for a in none["signals"][measure]["ranking"]
                                   if a.startswith("sagc"))
  assert sagc_best("utility") != sagc_best("informative_rows")       # the trace's disagreement
  both = report(("utility", "informative_rows"))["recommended"]
  assert "the validated measures disagree on the best setting" in both["withheld"]
  one = report(("utility",))["recommended"]
  assert one["arm"] == sagc_best("utility") and one["measure"] == "utility"
  savings = none["straggler_savings"]
  assert set(savings) == {"hold_prompts", "hold_rollouts"}
  assert all(0.0 <= v["mean"] < 1.0 for v in savings["hold_prompts"]["straggler_share"].values())


def test_the_replay_is_deterministic_in_its_seed(tmp_path):
  trace = trace_lib.read_trace(_synthetic(tmp_path))
  timed = {"controller_us"}
  run = lambda seed: {arm: {k: v for k, v in s.items() if k not in timed} for arm, s in
                      replay_run(trace, DecodeCost.of(trace), 40, seed=seed,
                                 bootstrap=True)["summary"].items()}
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
  summary = replay_run(fit, DecodeCost(1.0, 0.0), 400, kinds=(), seed=0)["summary"]
  tau = float(header["controller"]["tau"])
  for g in header["controller"]["candidates"]:
    if g > k:
      continue
    interval = trace_lib.straggler_rates(held_out, g, tau, groups_per_step=1)
    replayed = summary[f"static_G{g}"]["group_straggler_rate"]
    assert interval["group_low"] <= replayed <= interval["group_high"], (g, replayed, interval)


@pytest.mark.skipif(not BEFORE.exists(), reason="the committed SmolLM2 trace is missing")
def test_the_recommended_setting_replays_to_the_cost_the_report_gives_it():
  """The report's recommended tau / delta, replayed alone with the same replicates,
  costs what the report says (the arm names and the settings agree), and its rates
  cover every candidate."""
  trace = trace_lib.read_trace(BEFORE)
  cost = DecodeCost(0.05, 1e-3)
  settings = cost.settings(trace)
  section = controller_settings(trace.header["controller"])
  report = calibration_report(trace, cost, section, steps=60, replicates=2, taus=(1.5, 2.5),
                              deltas=(0.1, 0.5), validated=("utility",), log=lambda m: None,
                              **settings)
  rec = report["recommended"]
  alone = []
  for rep in range(2):
    mine = dict(section, candidates=tuple(report["candidates"]), seed=section["seed"] + rep)
    alone.append(replay([trace], mine, cost, rollout=settings["rollout"], steps=60, kinds=(),
                        grid=[(rec["tau"], rec["delta"])], seed=rep, bootstrap=True,
                        max_rounds=settings["max_rounds"])["summary"][
                            sagc_arm_name(rec["tau"], rec["delta"])])
  assert rec["per_hour"] == pytest.approx(
      np.mean([a["signal"] / (a["wall_clock_s"] / 3600) for a in alone]))
  assert f"--config.controller.tau={rec['tau']:g}" in rec["overrides"]
  assert set(report["straggler_rates"]) == {f"G{g}" for g in report["candidates"]}
  json.dumps(report)                       # report.json holds it


def test_observed_rates_pool_each_sizes_groups_with_a_wilson_interval():
  from sagc_jax.experiments.calibration import observed_rates

  rows = [{"g": 4, "n_groups": 8, "n_stragglers": s} for s in (1, 3, 2, 6)]
  rows += [{"g": 16, "n_groups": 2, "n_stragglers": s} for s in (2, 1)]
  got = observed_rates(rows)
  assert got["G4"]["group_rate"] == pytest.approx(12 / 32)
  assert got["G16"]["group_rate"] == pytest.approx(3 / 4)
  assert (got["G4"]["steps"], got["G16"]["groups"]) == (4, 4)
  from scipy.stats import binomtest     # the reference Wilson score interval

  wilson = binomtest(12, 32).proportion_ci(method="wilson")
  assert (got["G4"]["group_low"], got["G4"]["group_high"]) == pytest.approx(
      (wilson.low, wilson.high), abs=1e-6)


@pytest.mark.skipif(not AOT_REPORT.exists(), reason="the committed AOT report is missing")
def test_the_compiled_cost_brackets_the_aot_reports_own_projections():
  """Against the AOT report's independent figures: every row at the cap costs the
  report's projected learner step and at least its simulated refill schedule, and
  fewer tokens cost less."""
  from sagc_jax.replay.costs import CompiledStepCost

  cost = CompiledStepCost.load(AOT_REPORT)
  report = cost.report
  assert cost.cap == 16384 and cost.rollout["rollouts_per_step"] == 512
  prompt_max = max(report["rollout"]["prompt_buckets"])
  rows = np.full(512, 16384)
  prompts = np.full(512 // 4, prompt_max)
  full = cost([(rows, prompts)], (rows, np.full(512, prompt_max)))
  assert full["learner_s"] == pytest.approx(report["projected_learner_s"])
  simulated = report["refill"]["by_length_model"]["cap"]["seconds"]
  assert simulated <= full["rollout_s"] <= simulated / min(cost.bound_ratios.values()) * 1.01
  short = cost([(rows // 8, prompts)], (rows // 8, np.full(512, prompt_max)))
  assert short["rollout_s"] < full["rollout_s"] / 4 and short["learner_s"] < full["learner_s"]


def _one_step(cost, trace, lengths):
  """(the seed's linear price: rollout, learner) and the cost's own price of ``lengths``
  (``[prompts, responses]``, the trace's prompts) as one step: signal_rate's form counts
  the longest row and rows x the mean over prompts of the median length."""
  step_s, slot_s, update_s, token_s = cost.cost_seed(trace)
  rows, prompts = lengths.reshape(-1), np.repeat(trace.prompt_tokens, trace.responses)
  per_rows = rows.size * max(np.median(lengths, axis=1).mean(), 1.0)
  linear = (step_s * rows.max() + slot_s * per_rows, update_s + token_s * per_rows)
  return linear, update_s, cost([(rows, prompts)], (rows, prompts))


def test_the_cpu_cost_seed_prices_a_step_as_the_decode_cost_does():
  """signal_rate's linear form with the seed calibrate prints for a trace's CPU fit prices
  the trace's responses as one step at the decode cost's own seconds: its per-row terms
  count rows x the median length, the fit's count every decoded and trained token."""
  trace = trace_lib.read_trace(BEFORE)
  cost = DecodeCost(step_s=0.05, slot_s=0.004, learner_step_s=2.0, learner_token_s=0.001)
  (rollout, learner), _, priced = _one_step(cost, trace, trace.lengths)
  assert rollout == pytest.approx(priced["rollout_s"], rel=1e-9)
  assert learner == pytest.approx(priced["learner_s"], rel=1e-9)


def test_the_aot_cost_seed_prices_a_step_as_the_compiled_cost_does():
  """signal_rate's linear form with the seed calibrate prints for an AOT report prices
  the trace's responses, scaled to the preset's cap, as one step (a multiple of the
  refill's slots) at the compiled cost's own seconds: it is linearised there."""
  from sagc_jax.replay.costs import CompiledStepCost

  cost, trace = CompiledStepCost.load(AOT_REPORT), trace_lib.read_trace(BEFORE)
  lengths = np.minimum(trace.lengths * (cost.cap / trace.max_new_tokens), cost.cap)
  assert lengths.size % cost.report["refill"]["slots"] == 0
  (rollout, learner), _, priced = _one_step(cost, trace, lengths)
  assert rollout == pytest.approx(priced["rollout_s"], rel=1e-9)
  assert learner == pytest.approx(priced["learner_s"], rel=1e-9)


def test_the_aot_cost_seed_of_a_dense_sampler_report():
  """The dense sampler's branch: one call per round decodes to the round's longest row,
  its prefill a per-step constant (the seed's update term); the seed prices the trace's
  responses as one step at the compiled cost's own seconds."""
  from sagc_jax.replay.costs import CompiledStepCost

  rollout = dict(mode="hold_rollouts", rollouts_per_step=2048, prompts_per_step=8,
                 max_new_tokens=1024, prompt_buckets=[256], group_sizes=[4, 8, 16],
                 dynamic_max_rounds=3)
  cost = CompiledStepCost(dict(rollout=rollout, refill=None, generate_ms=900.0,
                               decode_step_ms=12.0, projected_learner_s=30.0))
  trace = trace_lib.read_trace(BEFORE)
  lengths = np.minimum(np.rint(trace.lengths * (1024 / trace.max_new_tokens)), 1024)
  (rollout_s, learner_s), update_s, priced = _one_step(cost, trace, lengths)
  assert rollout_s + update_s == pytest.approx(priced["rollout_s"], rel=1e-9)
  assert learner_s - update_s == pytest.approx(priced["learner_s"], rel=1e-9)


def test_signal_names_the_measures_a_replay_ranks_by(tmp_path):
  from sagc_jax.experiments.signals import chosen
  from sagc_jax.experiments.replay_tables import trace_tables

  trace = trace_lib.read_trace(_synthetic(tmp_path))
  settings = DecodeCost.of(trace).settings(trace)
  table, _, found = trace_tables([trace], controller_settings(trace.header["controller"]),
                                 DecodeCost.of(trace), algorithms=["grpo"], taus=[1.5],
                                 replicates=3, steps=10, measures=chosen(["informative_rows"]),
                                 log=lambda m: None, **settings)
  assert list(found["signals"]) == ["informative_rows"]
  assert list(found["predictions"]["grpo tau 1.5"]) == ["informative_rows"]
  assert "| informative_rows | per hour of priced time |" in table
  assert chosen([]) == ("utility", "informative_groups", "informative_rows", "advantage_mass")
  with pytest.raises(ValueError, match="'bogus' is not a learning measure"):
    chosen(["utility", "bogus"])
