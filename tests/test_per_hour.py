"""The best model per hour (``experiments/per_hour.py``): learning curves read off a
hand-made learning table, checked against values computed by hand (the paired test and
Holm's correction themselves: tests/test_stats.py)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from sagc_jax.experiments import per_hour, per_hour_tables


def curve_rows(arm, seed, points, algorithm="grpo"):
  return [{"arm": arm, "algorithm": algorithm, "seed": seed, "step": i, "step_time_s": t,
           "sampled_accuracy": a} for i, (t, a) in enumerate(points)]


def test_accuracy_at_h_and_mean_over_h_by_hand():
  # Points (0, 0.2), (4, 0.4), (12, 0.6), (14, 0.5); H = 10.
  # At H: 0.4 + (10 - 4) / 8 * 0.2 = 0.55.
  # Area on [0, 10]: 4 * (0.2 + 0.4) / 2 = 1.2, plus 6 * (0.4 + 0.55) / 2 = 2.85 -> 4.05.
  at_h, mean_h = per_hour.curve_measures([0, 4, 12, 14], [0.2, 0.4, 0.6, 0.5], 10.0)
  assert at_h == pytest.approx(0.55) and mean_h == pytest.approx(0.405)
  # An evaluation exactly at H, and a flat curve.
  assert per_hour.curve_measures([0, 10], [0.3, 0.5], 10.0) == pytest.approx((0.5, 0.4))
  assert per_hour.curve_measures([0, 3, 11], [0.5] * 3, 10.0) == pytest.approx((0.5, 0.5))
  # A run that stopped before H (its step cap) has neither value.
  assert all(np.isnan(per_hour.curve_measures([0, 4, 9], [0.2, 0.4, 0.6], 10.0)))


def test_time_to_target_interpolates_and_censors():
  times, accuracy = [0, 4, 12, 14], [0.2, 0.4, 0.6, 0.5]
  # 0.5 is half-way from 0.4 (t = 4) to 0.6 (t = 12): t = 8.
  assert per_hour.time_to_target(times, accuracy, 0.5) == (pytest.approx(8.0), True)
  assert per_hour.time_to_target(times, accuracy, 0.4) == (4.0, True)
  assert per_hour.time_to_target(times, accuracy, 0.2) == (0.0, True)   # reached at start
  assert per_hour.time_to_target(times, accuracy, 0.7) == (14.0, False)  # censored at 14
  # Reached after H (t = 8 > H = 6): censored at H, like a run that never reaches it.
  assert per_hour.time_to_target(times, accuracy, 0.5, horizon=6.0) == (6.0, False)
  assert per_hour.time_to_target(times, accuracy, 0.5, horizon=8.0) == (
      pytest.approx(8.0), True)
  assert per_hour.time_to_target(times, accuracy, 0.7, horizon=20.0) == (14.0, False)
  # A point without a value is left out, never counted as reached.
  assert per_hour.time_to_target([0, 4, 12], [float("nan"), 0.4, 0.6], 0.5) == (
      pytest.approx(8.0), True)
  assert per_hour.time_to_target([0, 4], [float("nan")] * 2, 0.5) == (4, False)
  # A missing value after H does not cost the run its value at H.
  assert per_hour.curve_measures([0, 10, 14], [0.3, 0.5, float("nan")], 10.0) == (
      pytest.approx((0.5, 0.4)))


def test_a_hand_made_learning_table_ranks_arms_and_censors_targets(tmp_path):
  """Three arms x 3 seeds with known curves: static4 climbs fastest, sagc a constant
  0.1 below it, static16 flat. Every measure is checked against hand values."""
  H = 10.0
  rows = []
  for seed in range(3):
    lift = 0.01 * seed
    rows += curve_rows("grpo_static4", seed, [(0, 0.2), (5, 0.6 + lift), (11, 0.8 + lift)])
    rows += curve_rows("grpo_sagc", seed, [(0, 0.1), (5, 0.5 + lift), (11, 0.7 + lift)])
    rows += curve_rows("grpo_static16", seed, [(0, 0.2), (12, 0.2 + lift)])
  runs = per_hour.run_measures(rows, H, targets=(0.5, 0.9))
  by = {(r["arm"], r["seed"]): r for r in runs}
  # static4 seed 0: at H = 0.6 + 5/6 * 0.2; area = 5 * 0.8 / 2 + 5 * (0.6 + at_h) / 2.
  at_h = 0.6 + 5 / 6 * 0.2
  assert by[("grpo_static4", 0)]["accuracy_at_h"] == pytest.approx(at_h)
  assert by[("grpo_static4", 0)]["mean_accuracy_over_h"] == pytest.approx(
      (2.0 + 2.5 * (0.6 + at_h)) / H)
  # time to 0.5 for static4 seed 0: 0.2 -> 0.6 over [0, 5]: t = 3.75; sagc: 0.1 -> 0.5: 5.0
  assert by[("grpo_static4", 0)]["time_to_target_s"]["0.5"] == (pytest.approx(3.75), True)
  assert by[("grpo_sagc", 0)]["time_to_target_s"]["0.5"] == (pytest.approx(5.0), True)
  assert by[("grpo_static16", 0)]["time_to_target_s"]["0.5"] == (10.0, False)   # at H
  summary = {a["arm"]: a for a in per_hour.arm_summary(runs, (0.5, 0.9))}
  assert summary["grpo_static16"]["targets"]["0.5"]["reached"] == 0
  assert summary["grpo_static4"]["targets"]["0.9"]["censored_at_s"] == [10.0] * 3
  result = per_hour.compare_pairs(runs, (0.5,))["grpo"]
  pairs = {(p["first"], p["second"]): p for p in result["pairs"]}
  assert len(pairs) == 3
  # static4 - sagc: the curves differ by 0.1 at every point, so everywhere: a constant
  # 0.1 per seed, zero spread -> p = 0, significant.
  diff = pairs[("grpo_static4", "grpo_sagc")]
  assert diff["mean_accuracy_over_h"]["mean"] == pytest.approx(0.1)
  assert diff["significant"]
  # Time to 0.5: static4 5 * 0.3 / (0.4 + lift), sagc
  # 5 * 0.4 / (0.4 + lift): a ratio of 0.75 in every seed, none censored.
  ratio = diff["time_ratio"]["0.5"]
  assert (ratio["n"], ratio["censored_first"], ratio["censored_second"]) == (3, 0, 0)
  assert ratio["ratio"] == pytest.approx(0.75)
  # Against static16, which never reaches 0.5: every seed censored (at H), and the pair
  # the other way round is the exact inverse, interval included.
  censored = pairs[("grpo_static4", "grpo_static16")]["time_ratio"]["0.5"]
  assert (censored["n"], censored["censored_first"], censored["censored_second"]) == (3, 0, 3)
  assert "censored: first 0, second 3: upper bound" in per_hour_tables._ratio_cell(censored)
  # Neither reached 0.9 in any seed: no ratio, and the cell says why.
  both = per_hour.compare_pairs(runs, (0.9,))["grpo"]["pairs"]
  never = {(p["first"], p["second"]): p for p in both}[("grpo_static4", "grpo_static16")]
  assert per_hour_tables._ratio_cell(never["time_ratio"]["0.9"]) == "– (neither reached 3)"
  first_seen = sorted((r for r in runs if r["arm"] != "grpo_sagc"),
                      key=lambda r: r["arm"] != "grpo_static16")
  inverse = per_hour.compare_pairs(first_seen, (0.5,))["grpo"]["pairs"][0]
  assert (inverse["first"], inverse["second"]) == ("grpo_static16", "grpo_static4")
  got = inverse["time_ratio"]["0.5"]
  assert got["ratio"] == pytest.approx(1 / censored["ratio"])
  assert (got["low"], got["high"]) == (pytest.approx(1 / censored["high"]),
                                       pytest.approx(1 / censored["low"]))
  # Ranks: static4 beats both, sagc beats static16 -> 1, 2, 3.
  assert result["rank"] == {"grpo_static4": 1, "grpo_sagc": 2, "grpo_static16": 3}
  # The written files.
  per_hour.write({"learning": rows, "horizon_s": H, "runs": runs, "pairs": {"grpo": result}},
                 tmp_path)
  with open(tmp_path / "learning.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert len(table) == len(rows) and list(table[0]) == list(per_hour.LEARNING_COLUMNS)
  assert json.loads((tmp_path / "per_hour.json").read_text())["horizon_s"] == H


def test_learning_rows_accumulate_work_and_time_from_the_metrics_rows():
  arm = {"name": "dapo_sagc_seed2", "config": {"learner": {"algorithm": "dapo"}},
         "before_rl": {"step": 0, "eval_sampled_accuracy": 0.25, "eval_accuracy": 0.5}}
  arm["rows"] = [
      {"step": 1, "time_total_s": 2.0, "rollouts": 32.0, "decode_slots": 100.0,
       "learner/padded_tokens": 50.0, "reward_mean": 0.2},
      {"step": 2, "time_total_s": 3.0, "rollouts": 16.0, "generated_tokens": 60.0,
       "padding_efficiency": 0.5, "learner/padded_tokens": 40.0, "reward_mean": 0.4,
       "eval_sampled_accuracy": 0.375, "eval_accuracy": 0.625}]
  rows = per_hour.learning_rows(arm)
  assert [r["step"] for r in rows] == [0, 2]
  assert rows[0]["sampled_accuracy"] == 0.25 and rows[0]["step_time_s"] == 0.0
  last = rows[1]
  assert (last["arm"], last["algorithm"], last["seed"]) == ("dapo_sagc", "dapo", 2)
  # slot-steps of step 2 from its generated tokens / padding efficiency (older rows)
  assert (last["step_time_s"], last["rollouts"], last["slot_steps"],
          last["learner_tokens"]) == (5.0, 48.0, 220.0, 90.0)
  assert last["train_reward"] == pytest.approx(0.3)          # steps 1-2 since step 0
  assert (last["sampled_accuracy"], last["greedy_accuracy"]) == (0.375, 0.625)


def test_analyse_uses_the_budget_as_horizon_and_names_runs_that_hit_the_step_cap():
  def arm(name, times, accuracy, summary):
    rows = [{"step": i + 1, "time_total_s": t, "reward_mean": 0.5} for i, t in
            enumerate(np.diff([0.0, *times]))]
    rows[-1]["eval_sampled_accuracy"] = accuracy
    return {"name": name, "config": {"learner": {"algorithm": "grpo"},
                                     "train": {"steps": len(rows)}},
            "rows": rows, "before_rl": {"eval_sampled_accuracy": 0.2}, "summary": summary}
  arms = [arm("grpo_static4_seed0", [3.0, 6.0, 10.5], 0.6,
              {"steps": 3, "budget_spent": True}),
          arm("grpo_static16_seed0", [4.0, 8.0], 0.4, {"steps": 2, "budget_spent": False})]
  result = per_hour.analyse(arms, {"time_budget_s": 10.0, "targets": [0.5]})
  assert result["horizon_s"] == 10.0 and result["horizon_source"] == "the time budget"
  assert result["short"] == {"grpo_static16_seed0": "hit train.steps"}
  runs = {r["arm"]: r for r in result["runs"]}
  assert np.isnan(runs["grpo_static16"]["mean_accuracy_over_h"])      # ended at 8 s < H
  # static4: (0, 0.2) -> (10.5, 0.6): at H 0.2 + 0.4 * 10 / 10.5; mean = (0.2 + at H) / 2
  at_h = 0.2 + 0.4 * 10 / 10.5
  assert runs["grpo_static4"]["accuracy_at_h"] == pytest.approx(at_h)
  assert runs["grpo_static4"]["mean_accuracy_over_h"] == pytest.approx((0.2 + at_h) / 2)
  text = per_hour_tables.per_hour_markdown(result)
  assert "grpo_static16_seed0 (hit train.steps)" in text
  # One measured seed each: no arm can be ranked.
  assert result["pairs"]["grpo"]["rank"] == {"grpo_static4": None, "grpo_static16": None}
  assert "| grpo_static4 | 1 | – |" in text
  # Without a budget the horizon is the shortest run's step time (8 s); the runs' own
  # train.time_budget_s stands in for a missing compare.json.
  assert per_hour.analyse(arms, {})["horizon_s"] == pytest.approx(8.0)
  for a in arms:
    a["config"]["train"]["time_budget_s"] = 10.0
  assert per_hour.analyse(arms, {})["horizon_s"] == 10.0
  # No targets: the tables have no empty columns.
  lines = per_hour_tables.per_hour_markdown(per_hour.analyse(arms, {})).splitlines()
  tables = [line for line in lines if line.startswith("|")]
  assert all(line.count("|") == tables[0].count("|") for line in tables[:4])
  assert all(" |  |" not in line for line in tables)


def test_every_resolved_pair_of_any_kind_is_predicted_by_the_replay():
  """The pairs ``compare_pairs`` resolves are checked against the replay's order of the
  same arms (``signals.check_learning``): every pair of arms, whatever their kind."""
  from sagc_jax.experiments import signals

  value = {"static_G4": 1.0, "sagc": 2.0, "mymod.MyKind": 3.0}
  rows = [{"arm": arm, "seed": s, "utility_per_h": v + 0.1 * s}
          for s in range(2) for arm, v in value.items()]
  predicted = signals.predictions(rows, ("utility",))
  assert len(predicted["utility"]) == 3
  pair = lambda first, second, mean: {"first": first, "second": second, "significant": True,
                                      "mean_accuracy_over_h": {"mean": mean}}
  resolved = {"pairs": {"grpo": {"pairs": [pair("grpo_mymod.MyKind", "grpo_static4", 0.1),
                                           pair("grpo_sagc", "grpo_mymod.MyKind", -0.1),
                                           pair("grpo_static4", "grpo_sagc", -0.1)]}}}
  got = signals.check_learning({"grpo": predicted}, resolved)["utility"]["grpo"]
  assert (got["agree"], got["unpredicted"], got["verdict"]) == (3, [], "passes")


def test_the_priced_clock_prices_logged_work_and_ignores_the_machines_drift():
  """Two arms do the same work per step, but one arm's steps ran on a machine twice as
  slow: on the wall-clock it loses, on the priced clock (a price fitted to every
  step) the two tie, and the report names the rank that moved."""
  from sagc_jax.experiments import priced_clock

  row = {"decode_longest": 10.0, "generated_tokens": 100.0, "learner/sequence_tokens": 300.0}
  price = priced_clock.Price(0.01, 0.001, 0.5, 0.002, source="by hand")
  assert price(row) == pytest.approx(0.1 + 0.1 + 0.5 + 0.6)
  # An older row: its longest response times its sampling rounds, and no update.
  assert price({"response_len_max": 7.0, "sampling_rounds": 2.0, "generated_tokens": 50.0}) == (
      pytest.approx(0.14 + 0.05))

  def arm(name, seed, slow):
    rows, rng = [], np.random.default_rng(seed)
    for step in range(1, 13):
      work = {"decode_longest": float(rng.integers(5, 15)),
              "generated_tokens": float(rng.integers(50, 150)),
              "learner/sequence_tokens": float(rng.integers(200, 400))}
      rows.append({"step": step, "reward_mean": 0.5, **work,
                   "time_total_s": price(work) * (2.0 if slow else 1.0)})
      if step % 3 == 0:
        rows[-1]["eval_sampled_accuracy"] = 0.2 + 0.05 * step
    return {"name": f"{name}_seed{seed}", "config": {"learner": {"algorithm": "grpo"},
                                                    "train": {"steps": 12}},
            "rows": rows, "before_rl": {"eval_sampled_accuracy": 0.2},
            "summary": {"steps": 12}}
  arms = [arm(name, seed, name == "grpo_slow") for seed in range(3)
          for name in ("grpo_fast", "grpo_slow")]
  wall_h = min(sum(r["time_total_s"] for r in a["rows"]) for a in arms)
  result = per_hour.analyse(arms, {"time_budget_s": wall_h, "targets": [0.5]})
  # The fitted price is the one the steps were made with (the slow arm's doubled
  # seconds are averaged into one price that both arms pay).
  fitted = result["priced"]["price"]
  assert fitted["source"].startswith("fit")
  wall = {p["first"]: p for p in result["pairs"]["grpo"]["pairs"]}["grpo_fast"]
  priced = {p["first"]: p for p in result["priced"]["pairs"]["grpo"]["pairs"]}["grpo_fast"]
  assert wall["mean_accuracy_over_h"]["mean"] > 0.05 and wall["verdict"] == "resolved"
  assert priced["mean_accuracy_over_h"]["mean"] == pytest.approx(0.0, abs=1e-12)
  assert result["priced"]["rank_differs"] == {"grpo_slow": (2, 1)}
  text = per_hour_tables.per_hour_markdown(result)
  assert "### On the priced clock" in text and "grpo_slow 2 -> 1" in text
  # The learning rows carry the priced time, cumulative, which the fitted price gives.
  first = next(r for r in result["learning"] if r["arm"] == "grpo_slow" and r["step"] == 3)
  fit = priced_clock.Price(**{k: v for k, v in fitted.items()})
  assert first["priced_s"] == pytest.approx(sum(fit(r) for r in arms[1]["rows"][:3]))


def test_a_time_ratio_censored_on_both_sides_is_not_called_a_bound():
  def run(arm, seed, time, reached):
    return {"arm": arm, "algorithm": "grpo", "seed": seed, "mean_accuracy_over_h": 0.5,
            "accuracy_at_h": 0.5, "time_to_target_s": {"0.5": (time, reached)}}
  measures = [run("grpo_a", 0, 10.0, False), run("grpo_b", 0, 2.0, True),
              run("grpo_a", 1, 3.0, True), run("grpo_b", 1, 10.0, False)]
  ratio = per_hour.compare_pairs(measures, (0.5,))["grpo"]["pairs"][0]["time_ratio"]["0.5"]
  assert (ratio["n"], ratio["censored_first"], ratio["censored_second"]) == (2, 1, 1)
  assert ratio["ratio"] == pytest.approx(math.sqrt(5.0 * 0.3))
  assert "censored: first 1, second 1: not a bound" in per_hour_tables._ratio_cell(ratio)
