"""Which arm trains the best model per hour: learning curves at equal wall-clock.

A comparison with ``compare.time_budget_s`` gives every arm the same budget H of
step time (``train.time_budget_s``) and evaluates it on the same held-out examples
at the first step boundary after each of ``compare.eval_points`` evenly spaced
points of H (``train.eval_points``). Each evaluation is a point of the arm's
learning curve, recorded (``learning.csv``) with the arm's cumulative step time, its
priced time, and deterministic measures of its work (decoded slot-steps, learner
tokens, informative groups), which the machine's noise does not move.

The rule, fixed before any result (docs/claims.md, "The best model per hour"):

* a curve is held-out sampled accuracy against cumulative step time, from the
  evaluation before RL at t = 0, linear between evaluations;
* **the primary measure** is the mean accuracy over [0, H]: the area under the
  curve up to H divided by H; the accuracy at H is read off the same curve. A run
  whose last evaluation falls before H (it hit ``train.steps``) has neither;
* the time to a target accuracy (``compare.targets``) is where the curve first
  reaches it within [0, H]; a run that does not is censored at H (or at its last
  evaluation, if that came first);
* arms are compared in pairs, seed-paired, within an algorithm: the mean of the
  per-seed differences with a 95% Student-t interval and a two-sided paired t
  p-value (zero spread: 0 for a nonzero mean), Holm-corrected over that algorithm's
  pairs (the Holm family: every pair of its arms, on the primary measure; everything
  else is descriptive). A pair is worded by ``stats.pair_verdict``: resolved,
  borderline (Holm p in [0.01, 0.05)), equivalent within ``compare.equivalence_margin``
  (two one-sided tests), or not resolved;
* a pair's time to each target is the geometric mean of the per-seed ratios over the n
  seeds where at least one arm reached it by H, with how many of each arm's seeds are
  censored (only the second: an upper bound; only the first: a lower bound); seeds
  where neither did, or where one reached it at t = 0, are left out and counted;
* an arm's rank is 1 + the number of arms Holm-significantly better than it on the
  primary measure.

Everything is computed twice: on the wall-clock, and on a priced clock
(``experiments.priced_clock``: each step priced from the work it logged by one fixed
cost), which the machine's drift does not move, over the longest priced window every
run covers; the report lists the arms whose rank differs between the two.

Without a budget (an older comparison) H is the shortest run's total step time,
so that every run covers [0, H]. The GRPO step-size question this answers is the
one the SAGC paper leaves open: SAGC buys steps with smaller groups, and only
accuracy against time, for every arm run for the same time, shows what that buys.
"""

from __future__ import annotations

import csv
import itertools
from collections import Counter
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sagc_jax.base.stats import (ALPHA, by_seed, equivalence_test, geometric_ratio, holm,
                                 mean_ci, pair_verdict, paired_test)
from sagc_jax.config.compare import CompareSection
from sagc_jax.experiments.arms import split_run_name
from sagc_jax.experiments.priced_clock import Price, price_from_setting

LEARNING_COLUMNS = ("arm", "algorithm", "seed", "step", "step_time_s", "priced_s", "rollouts",
                    "slot_steps", "learner_tokens", "informative_groups", "sampled_accuracy",
                    "greedy_accuracy", "train_reward")
CLOCKS = {"wall": "step_time_s", "priced": "priced_s"}
# compare.equivalence_margin of a comparison whose record predates it.
DEFAULT_MARGIN = CompareSection.equivalence_margin


def learning_rows(arm: dict[str, Any], price: Price | None = None) -> list[dict[str, Any]]:
  """One ``LEARNING_COLUMNS`` row per evaluation of a run (``compare.load_arm``):
  the evaluation before RL at step 0, then every step row with an evaluation, with
  the run's cumulative step time, priced time (``price``; nan without one), rollouts,
  decoded slot-steps, learner tokens and informative groups at that step, and the mean
  train reward of the steps since the previous evaluation."""
  name, seed = split_run_name(arm["name"])
  base = {"arm": name, "algorithm": arm["config"]["learner"]["algorithm"], "seed": seed}
  before = arm.get("before_rl") or {}
  nan = float("nan")
  totals = dict(step_time_s=0.0, priced_s=0.0 if price else nan, rollouts=0.0,
                slot_steps=0.0, learner_tokens=0.0, informative_groups=0.0)
  out = [{**base, "step": 0, **totals, "sampled_accuracy": before.get("eval_sampled_accuracy", nan),
          "greedy_accuracy": before.get("eval_accuracy", nan), "train_reward": nan}]
  rewards: list[float] = []
  for row in arm["rows"]:
    totals["step_time_s"] += row["time_total_s"]
    totals["priced_s"] += price(row) if price else nan
    totals["informative_groups"] += row.get("informative_groups", nan)
    totals["rollouts"] += row.get("rollouts", nan)
    slots = row.get("decode_slots")
    if slots is None:            # rows from before decode_slots was logged
      slots = row.get("generated_tokens", nan) / (row.get("padding_efficiency") or nan)
    totals["slot_steps"] += slots
    totals["learner_tokens"] += row.get("learner/padded_tokens", nan)
    rewards.append(row["reward_mean"])
    if "eval_sampled_accuracy" in row or "eval_accuracy" in row:
      out.append({**base, "step": row["step"], **totals,
                  "sampled_accuracy": row.get("eval_sampled_accuracy", nan),
                  "greedy_accuracy": row.get("eval_accuracy", nan),
                  "train_reward": float(np.mean(rewards))})
      rewards = []
  return out


def curve_measures(times: Sequence[float], accuracy: Sequence[float],
                   horizon: float) -> tuple[float, float]:
  """``(accuracy at H, mean accuracy over [0, H])`` of a curve linear between its
  points (``times`` increasing from 0); both nan when the curve ends before H."""
  t, a = np.asarray(times, float), np.asarray(accuracy, float)
  used = int(np.searchsorted(t, horizon)) + 1         # the points up to the first >= H
  if t.size < 2 or t[-1] < horizon or not np.all(np.isfinite(a[:used])):
    return float("nan"), float("nan")
  t, a = t[:used], a[:used]
  at_h = float(np.interp(horizon, t, a))
  inside = t < horizon
  xs = np.concatenate([t[inside], [horizon]])
  ys = np.concatenate([a[inside], [at_h]])
  # The mean over [0, H]: the area under the curve (trapezoids) divided by H.
  return at_h, float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2)) / horizon


def time_to_target(times: Sequence[float], accuracy: Sequence[float], target: float,
                   horizon: float = math.inf) -> tuple[float, bool]:
  """``(t, True)``: where the linear curve first reaches ``target``, at or before
  ``horizon``; else ``(censored, False)``, censored at ``horizon`` or at the run's last
  evaluation if that came first. Points without a value (an evaluation that did not
  measure sampled accuracy) are left out."""
  t, a = np.asarray(times, float), np.asarray(accuracy, float)
  censored = (float(min(horizon, times[-1])), False)
  t, a = t[np.isfinite(a)], a[np.isfinite(a)]
  hits = np.flatnonzero(a >= target)
  if not hits.size:
    return censored
  j = int(hits[0])
  reached = float(t[0]) if j == 0 else float(
      t[j - 1] + (target - a[j - 1]) / (a[j] - a[j - 1]) * (t[j] - t[j - 1]))
  return (reached, True) if reached <= horizon else censored


def run_measures(rows: Sequence[dict[str, Any]], horizon: float, targets: Sequence[float],
                 clock: str = "step_time_s") -> list[dict[str, Any]]:
  """Per run (arm and seed) of ``learning_rows``, on the time axis ``clock``: accuracy
  at H, mean accuracy over [0, H], the time to each target and whether it was reached
  by H, its last evaluation."""
  runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
  for row in rows:
    runs.setdefault((row["arm"], int(row["seed"])), []).append(row)
  out = []
  for (arm, seed), points in runs.items():
    points = sorted(points, key=lambda r: r[clock])
    times = [p[clock] for p in points]
    accuracy = [p["sampled_accuracy"] for p in points]
    at_h, mean_h = curve_measures(times, accuracy, horizon)
    reached = {f"{target:g}": time_to_target(times, accuracy, target, horizon)
               for target in targets}
    out.append({"arm": arm, "algorithm": points[0]["algorithm"], "seed": seed,
                "accuracy_at_h": at_h, "mean_accuracy_over_h": mean_h,
                "time_to_target_s": reached, "last_eval_s": times[-1],
                "steps": int(points[-1]["step"])})
  return out


def compare_pairs(measures: Sequence[dict[str, Any]], targets: Sequence[float],
                  margin: float = DEFAULT_MARGIN) -> dict[str, Any]:
  """Per algorithm: every pair of its arms, seed-paired (difference first - second of
  the primary measure and of accuracy at H, Holm-adjusted p on the primary, the
  equivalence test at ``margin``, the verdict, and the geometric mean ratio of times to
  each target) and each arm's rank."""
  out: dict[str, Any] = {}
  for algorithm in dict.fromkeys(m["algorithm"] for m in measures):
    arms = list(dict.fromkeys(m["arm"] for m in measures if m["algorithm"] == algorithm))
    pairs = []
    for first, second in itertools.combinations(arms, 2):
      a, b = (by_seed(measures, lambda m, arm=arm: m["arm"] == arm) for arm in (first, second))
      seeds = sorted(set(a) & set(b))
      pair = {"first": first, "second": second}
      differences = {key: [a[s][key] - b[s][key] for s in seeds]
                     for key in ("mean_accuracy_over_h", "accuracy_at_h")}
      pair.update({key: paired_test(d) for key, d in differences.items()})
      pair["equivalence"] = equivalence_test(differences["mean_accuracy_over_h"], margin)
      pair["time_ratio"] = {}
      for target in targets:
        key = f"{target:g}"
        times = [(a[s]["time_to_target_s"][key], b[s]["time_to_target_s"][key]) for s in seeds]
        # A seed where neither arm reached the target says nothing of their ratio, nor
        # one where an arm reached it at t = 0 (no ratio); both are counted.
        used = [(x, y) for x, y in times if x[0] > 0 and y[0] > 0 and (x[1] or y[1])]
        pair["time_ratio"][key] = {
            **geometric_ratio([x[0] / y[0] for x, y in used]),
            "censored_first": sum(not x[1] for x, _ in used),
            "censored_second": sum(not y[1] for _, y in used),
            "neither": sum(not (x[1] or y[1]) for x, y in times),
            "at_start": sum((x[1] or y[1]) and min(x[0], y[0]) <= 0 for x, y in times)}
      pairs.append(pair)
    adjusted = holm([p["mean_accuracy_over_h"]["p"] for p in pairs])
    # Equivalence is a claim too: its TOST p-values are Holm-adjusted over the family.
    equivalent = holm([p["equivalence"]["p"] for p in pairs])
    for pair, p, q in zip(pairs, adjusted, equivalent):
      pair["p_holm"] = p
      pair["significant"] = bool(math.isfinite(p) and p < ALPHA)
      pair["equivalence"]["p_holm"] = q
      pair["verdict"] = pair_verdict(p, pair["equivalence"])
    # Per arm, how many arms are significantly better: the pairs it lost.
    better = Counter(p["second"] if p["mean_accuracy_over_h"]["mean"] > 0 else p["first"]
                     for p in pairs if p["significant"])
    measured = {arm: sum(math.isfinite(m["mean_accuracy_over_h"])
                         for m in measures if m["arm"] == arm) for arm in arms}
    # An arm without two measured seeds cannot lose a test: it has no rank.
    out[algorithm] = {"pairs": pairs, "rank": {arm: 1 + better[arm] if measured[arm] >= 2
                                               else None for arm in arms}}
  return out


def arm_summary(measures: Sequence[dict[str, Any]],
                targets: Sequence[float]) -> list[dict[str, Any]]:
  """Per arm: mean ± 95% CI over seeds of the primary measure and of accuracy at H;
  per target, how many seeds reached it and the mean time of those that did."""
  out = []
  for arm in dict.fromkeys(m["arm"] for m in measures):
    runs = [m for m in measures if m["arm"] == arm]
    entry = {"arm": arm, "algorithm": runs[0]["algorithm"], "seeds": len(runs),
             "mean_accuracy_over_h": mean_ci([r["mean_accuracy_over_h"] for r in runs]),
             "accuracy_at_h": mean_ci([r["accuracy_at_h"] for r in runs]),
             "targets": {}}
    for target in targets:
      key = f"{target:g}"
      hits = [r["time_to_target_s"][key] for r in runs]
      reached = [t for t, ok in hits if ok]
      entry["targets"][key] = {"reached": len(reached), "of": len(runs),
                               "time_s": mean_ci(reached),
                               "censored_at_s": [t for t, ok in hits if not ok]}
    out.append(entry)
  return out


def arm_ranks(part: dict[str, Any]) -> dict[str, int | None]:
  return {arm: rank for group in part["pairs"].values() for arm, rank in group["rank"].items()}


def clock_analysis(rows: Sequence[dict[str, Any]], horizon: float, targets: Sequence[float],
                   clock: str, margin: float) -> dict[str, Any]:
  """Per-run measures, per-arm summary and all pairs on the time axis ``clock``."""
  measures = run_measures(rows, horizon, targets, clock)
  return {"horizon_s": horizon, "runs": measures, "arms": arm_summary(measures, targets),
          "pairs": compare_pairs(measures, targets, margin)}


def priced_analysis(rows: Sequence[dict[str, Any]], wall: dict[str, Any],
                    targets: Sequence[float], margin: float) -> dict[str, Any] | None:
  """The analysis on the priced clock (None when the rows have no priced time), over
  the runs with a value at the wall-clock H. A run stopped by the wall-clock budget did
  less work where the machine was slow, so the priced H is the longest window every
  such run covers: the least priced time of their last evaluations. Its source names
  the run that sets it and the median run's priced time, so a reader sees how much of
  the other curves lies beyond it."""
  covered = {(m["arm"], m["seed"]) for m in wall["runs"]
             if math.isfinite(m["mean_accuracy_over_h"])}
  last: dict[tuple[str, int], float] = {}
  for r in rows:
    key = (r["arm"], int(r["seed"]))
    if key in covered:
      last[key] = max(last.get(key, 0.0), float(r["priced_s"]))
  if not last or not all(math.isfinite(v) and v > 0 for v in last.values()):
    return None
  shortest = min(last, key=last.get)
  priced = clock_analysis([r for r in rows if (r["arm"], int(r["seed"])) in covered],
                          last[shortest], targets, CLOCKS["priced"], margin)
  wall_ranks, priced_ranks = arm_ranks(wall), arm_ranks(priced)
  priced["rank_differs"] = {arm: (rank, priced_ranks.get(arm))
                            for arm, rank in wall_ranks.items() if rank != priced_ranks.get(arm)}
  priced["horizon_source"] = (f"the least priced time of a run's last evaluation, "
                              f"{shortest[0]}_seed{shortest[1]}'s; the median run's is "
                              f"{float(np.median(list(last.values()))):.1f} priced s")
  return priced


def work_per_step(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per arm, what a step bought and what it cost, from each run's logs up to its last
  evaluation (``learning_rows``): informative groups per step, wall-clock and priced
  seconds per step, and informative groups per second on each clock, each a mean and
  95% t-interval over seeds. Why an arm trains faster per hour is this trade: a larger
  G turns more of its prompts' groups informative, for seconds that grow with rows."""
  last: dict[tuple[str, int], dict[str, Any]] = {}
  for row in rows:
    key = (row["arm"], row["seed"])
    if row["step"] and row["step"] >= last.get(key, {"step": 0})["step"]:
      last[key] = row
  out = []
  for arm in dict.fromkeys(r["arm"] for r in rows):
    runs = [r for (name, _), r in sorted(last.items()) if name == arm]
    ratio = lambda key, per: mean_ci([r[key] / r[per] for r in runs if r[per]])
    out.append({"arm": arm, "seeds": len(runs),
                "informative_per_step": ratio("informative_groups", "step"),
                "wall_s_per_step": ratio("step_time_s", "step"),
                "priced_s_per_step": ratio("priced_s", "step"),
                "informative_per_wall_s": ratio("informative_groups", "step_time_s"),
                "informative_per_priced_s": ratio("informative_groups", "priced_s")})
  return out


def analyse_rows(rows: Sequence[dict[str, Any]], settings: dict[str, Any], horizon: float,
                 price: dict[str, Any] | None = None) -> dict[str, Any]:
  """Both clocks' analyses of a comparison's learning rows (``learning.csv``, as
  ``learning_rows`` makes them) at wall-clock ``horizon``, with ``settings``' targets
  and equivalence margin (``compare.json``); ``price`` describes the priced clock
  (None: no priced analysis)."""
  targets = [float(t) for t in settings.get("targets") or ()]
  margin = float(settings.get("equivalence_margin") or DEFAULT_MARGIN)
  result = {"targets": targets, "equivalence_margin": margin,
            **clock_analysis(rows, horizon, targets, CLOCKS["wall"], margin)}
  priced = priced_analysis(rows, result, targets, margin) if price else None
  if priced:
    priced["price"] = price
  result["priced"] = priced
  result["work"] = work_per_step(rows)
  return result


def analyse(arms: Sequence[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
  """Learning rows and both clocks' analyses (``analyse_rows``) of a comparison's runs
  (``compare.load_comparison``), at the budget (``settings["time_budget_s"]``, else the
  runs' own ``train.time_budget_s``; without one, the shortest finished run's step
  time), priced by ``settings["priced_cost"]`` (``priced_clock``; default ``fit``)."""
  price, priced_error = None, ""
  try:
    price = price_from_setting(settings.get("priced_cost") or "fit",
                               [r for arm in arms for r in arm["rows"]])
  except ValueError as err:
    priced_error = str(err)
  rows = [r for arm in arms for r in learning_rows(arm, price)]
  budgets = {float(arm["config"]["train"].get("time_budget_s") or 0.0) for arm in arms}
  budget = float(settings.get("time_budget_s") or 0.0)
  if not budget and len(budgets) == 1:
    budget = budgets.pop()               # arms merged without the comparison's record
  finished = [arm for arm in arms if arm["summary"] and not arm["summary"].get("preempted")]
  totals = [sum(r["time_total_s"] for r in arm["rows"]) for arm in finished or arms]
  horizon, source = ((budget, "the time budget") if budget
                     else (float(min(totals)), "no budget: the shortest run's step time"))
  result = analyse_rows(rows, settings, horizon, price.describe() if price else None)
  by_run = {(m["arm"], m["seed"]): m for m in result["runs"]}
  short = {}
  for arm in arms:
    if not math.isfinite(by_run[split_run_name(arm["name"])]["mean_accuracy_over_h"]):
      summary = arm["summary"]
      short[arm["name"]] = (
          "no summary: not finished" if not summary else "stopped by a signal"
          if summary.get("preempted") else "hit train.steps"
          if summary.get("steps") == arm["config"]["train"]["steps"] else "no evaluation")
  return {"horizon_s": horizon, "horizon_source": source, "learning": rows, **result,
          "priced_error": priced_error, "short": short}


def write(result: dict[str, Any], workdir: Path) -> None:
  """``learning.csv`` (one row per evaluation of every run) and ``per_hour.json``."""
  write_csv(workdir / "learning.csv", LEARNING_COLUMNS, result["learning"])
  body = _json_safe({k: v for k, v in result.items() if k != "learning"})
  (workdir / "per_hour.json").write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
  """``rows`` as a CSV file of ``columns`` (a row's other keys are left out)."""
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


def _json_safe(value: Any) -> Any:
  """Tuples as lists, numpy numbers as floats and NaN / inf as null (strict JSON)."""
  if isinstance(value, dict):
    return {k: _json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_safe(v) for v in value]
  if isinstance(value, (float, np.floating)):
    return float(value) if math.isfinite(value) else None
  return value

