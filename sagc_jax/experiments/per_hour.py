"""Which arm trains the best model per hour: learning curves at equal wall-clock.

A comparison with ``compare.time_budget_s`` gives every arm the same budget H of
step time (``train.time_budget_s``) and evaluates it on the same held-out examples
at the first step boundary after each of ``compare.eval_points`` evenly spaced
points of H (``train.eval_points``). Each evaluation is a point of the arm's
learning curve, recorded (``learning.csv``) with the arm's cumulative step time and
two deterministic measures of its work, decoded slot-steps and learner tokens,
which the machine's noise does not move.

The rule, fixed before any result (docs/claims.md, "The best model per hour"):

* a curve is held-out sampled accuracy against cumulative step time, from the
  evaluation before RL at t = 0, linear between evaluations;
* **the primary measure** is the mean accuracy over [0, H]: the area under the
  curve up to H divided by H; the accuracy at H is read off the same curve. A run
  whose last evaluation falls before H (it hit ``train.steps``) has neither;
* the time to a target accuracy (``compare.targets``) is where the curve first
  reaches it; a run that never does is censored at its last evaluation ("> that
  time");
* arms are compared in pairs, seed-paired, within an algorithm: the mean of the
  per-seed differences with a 95% Student-t interval and a two-sided paired t
  p-value (zero spread: 0 for a nonzero mean), Holm-corrected over that algorithm's pairs (the Holm family: every pair
  of its arms, on the primary measure; everything else is descriptive);
* an arm's rank is 1 + the number of arms Holm-significantly better than it on the
  primary measure.

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

from sagc_jax.experiments.arms import split_run_name
from sagc_jax.base.stats import by_seed, format_ci, holm, mean_ci, paired_test

LEARNING_COLUMNS = ("arm", "algorithm", "seed", "step", "step_time_s", "rollouts",
                    "slot_steps", "learner_tokens", "sampled_accuracy", "greedy_accuracy",
                    "train_reward")
ALPHA = 0.05


def learning_rows(arm: dict[str, Any]) -> list[dict[str, Any]]:
  """One ``LEARNING_COLUMNS`` row per evaluation of a run (``compare.load_arm``):
  the evaluation before RL at step 0, then every step row with an evaluation, with
  the run's cumulative step time, rollouts, decoded slot-steps and learner tokens at
  that step, and the mean train reward of the steps since the previous evaluation."""
  name, seed = split_run_name(arm["name"])
  base = {"arm": name, "algorithm": arm["config"]["learner"]["algorithm"], "seed": seed}
  before = arm.get("before_rl") or {}
  nan = float("nan")
  totals = dict(step_time_s=0.0, rollouts=0.0, slot_steps=0.0, learner_tokens=0.0)
  out = [{**base, "step": 0, **totals, "sampled_accuracy": before.get("eval_sampled_accuracy", nan),
          "greedy_accuracy": before.get("eval_accuracy", nan), "train_reward": nan}]
  rewards: list[float] = []
  for row in arm["rows"]:
    totals["step_time_s"] += row["time_total_s"]
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


def time_to_target(times: Sequence[float], accuracy: Sequence[float],
                   target: float) -> tuple[float, bool]:
  """``(t, True)``: where the linear curve first reaches ``target``; ``(last, False)``
  when it never does (censored at the run's last evaluation). Points without a
  value (an evaluation that did not measure sampled accuracy) are left out."""
  t, a = np.asarray(times, float), np.asarray(accuracy, float)
  t, a = t[np.isfinite(a)], a[np.isfinite(a)]
  if not a.size:
    return float(times[-1]), False
  if a[0] >= target:
    return float(t[0]), True
  for j in range(1, t.size):
    if a[j] >= target:
      share = (target - a[j - 1]) / (a[j] - a[j - 1])
      return float(t[j - 1] + share * (t[j] - t[j - 1])), True
  return float(t[-1]), False


def run_measures(rows: Sequence[dict[str, Any]], horizon: float,
                 targets: Sequence[float]) -> list[dict[str, Any]]:
  """Per run (arm and seed) of ``learning_rows``: accuracy at H, mean accuracy over
  [0, H], the time to each target and whether it was reached, its last evaluation."""
  runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
  for row in rows:
    runs.setdefault((row["arm"], int(row["seed"])), []).append(row)
  out = []
  for (arm, seed), points in runs.items():
    points = sorted(points, key=lambda r: r["step_time_s"])
    times = [p["step_time_s"] for p in points]
    accuracy = [p["sampled_accuracy"] for p in points]
    at_h, mean_h = curve_measures(times, accuracy, horizon)
    reached = {f"{target:g}": time_to_target(times, accuracy, target) for target in targets}
    out.append({"arm": arm, "algorithm": points[0]["algorithm"], "seed": seed,
                "accuracy_at_h": at_h, "mean_accuracy_over_h": mean_h,
                "time_to_target_s": reached, "last_eval_s": times[-1],
                "steps": int(points[-1]["step"])})
  return out


def compare_pairs(measures: Sequence[dict[str, Any]],
                  targets: Sequence[float]) -> dict[str, Any]:
  """Per algorithm: every pair of its arms, seed-paired (difference first - second of
  the primary measure and of accuracy at H, Holm-adjusted p on the primary, the
  ratio of times to each target over the seeds where both reached it) and each arm's
  rank."""
  out: dict[str, Any] = {}
  for algorithm in dict.fromkeys(m["algorithm"] for m in measures):
    arms = list(dict.fromkeys(m["arm"] for m in measures if m["algorithm"] == algorithm))
    pairs = []
    for first, second in itertools.combinations(arms, 2):
      a, b = (by_seed(measures, lambda m, arm=arm: m["arm"] == arm) for arm in (first, second))
      seeds = sorted(set(a) & set(b))
      pair = {"first": first, "second": second}
      for key in ("mean_accuracy_over_h", "accuracy_at_h"):
        pair[key] = paired_test([a[s][key] - b[s][key] for s in seeds])
      pair["time_ratio"] = {}
      for target in targets:
        key = f"{target:g}"
        times = [(a[s]["time_to_target_s"][key], b[s]["time_to_target_s"][key]) for s in seeds]
        ratios = [x / y for (x, x_reached), (y, y_reached) in times
                  if x_reached and y_reached and y > 0]
        pair["time_ratio"][key] = dict(zip(("mean", "half_width", "n"), mean_ci(ratios)))
      pairs.append(pair)
    adjusted = holm([p["mean_accuracy_over_h"]["p"] for p in pairs])
    for pair, p in zip(pairs, adjusted):
      pair["p_holm"] = p
      pair["significant"] = bool(math.isfinite(p) and p < ALPHA)
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


def _ci(stat: dict[str, Any] | tuple, fmt: str) -> str:
  if isinstance(stat, dict):
    stat = (stat["mean"], stat["half_width"], stat["n"])
  return format_ci(stat, fmt)


def _target_cell(entry: dict[str, Any]) -> str:
  reached, of = entry["reached"], entry["of"]
  if not reached:
    return f"0/{of} (> {min(entry['censored_at_s']):.0f} s)"
  cell = f"{reached}/{of}: {_ci(entry['time_s'], '.1f')} s"
  if entry["censored_at_s"]:
    cell += f"; others > {min(entry['censored_at_s']):.0f} s"
  return cell


def per_hour_markdown(result: dict[str, Any]) -> str:
  """The per-arm table, the all-pairs table and the ranking, as markdown."""
  horizon, targets = result["horizon_s"], result["targets"]

  def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
  lines = [f"## The best model per hour\n\nHorizon H = {horizon:.1f} s of step time "
           f"({result['horizon_source']}). Held-out sampled accuracy against cumulative "
           "step time, linear between evaluations; mean ± 95% t-interval over seeds. "
           "Rank: 1 + the arms Holm-significantly better on the mean over [0, H].\n"]
  head = (["arm", "seeds", "rank", "mean acc over [0, H]", "acc at H"]
          + [f"time to {t:g}" for t in targets])
  lines += [row(head), "|" + "---|" * len(head)]
  ranks = {arm: rank for group in result["pairs"].values() for arm, rank in group["rank"].items()}
  for arm in result["arms"]:
    rank = ranks[arm["arm"]]
    lines.append(row([arm["arm"], str(arm["seeds"]), "–" if rank is None else str(rank),
                      _ci(arm["mean_accuracy_over_h"], ".3f"), _ci(arm["accuracy_at_h"], ".3f")]
                     + [_target_cell(arm["targets"][f"{t:g}"]) for t in targets]))
  head = (["pair", "mean acc over [0, H]", "p (Holm)", "acc at H"]
          + [f"time to {t:g}, first / second" for t in targets])
  lines += ["", "Pairs, seed-paired (first - second); p Holm-adjusted over each algorithm's "
            "pairs on the mean over [0, H] (* below 0.05); time ratios over the seeds where "
            "both reached the target:\n", row(head), "|" + "---|" * len(head)]
  for group in result["pairs"].values():
    for pair in group["pairs"]:
      star = " *" if pair["significant"] else ""
      lines.append(row([f"{pair['first']} - {pair['second']}",
                        _ci(pair["mean_accuracy_over_h"], "+.3f") + star,
                        f"{pair['p_holm']:.3g}", _ci(pair["accuracy_at_h"], "+.3f")]
                       + [_ci(pair["time_ratio"][f"{t:g}"], ".2f") for t in targets]))
  if result["short"]:
    lines.append("\nRuns without a value at H (their last evaluation came before it): "
                 + "; ".join(f"{name} ({why})" for name, why in result["short"].items()) + ".")
  return "\n".join(lines)


def analyse(arms: Sequence[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
  """Learning rows, per-run measures, per-arm summary and all pairs of a comparison's
  runs (``compare.load_comparison``), at the budget (``settings["time_budget_s"]``,
  else the runs' own ``train.time_budget_s``; without one, the shortest finished
  run's step time) and ``settings["targets"]``."""
  rows = [r for arm in arms for r in learning_rows(arm)]
  budgets = {float(arm["config"]["train"].get("time_budget_s") or 0.0) for arm in arms}
  budget = float(settings.get("time_budget_s") or 0.0)
  if not budget and len(budgets) == 1:
    budget = budgets.pop()               # arms merged without the comparison's record
  finished = [arm for arm in arms if arm["summary"] and not arm["summary"].get("preempted")]
  totals = [sum(r["time_total_s"] for r in arm["rows"]) for arm in finished or arms]
  horizon, source = ((budget, "the time budget") if budget
                     else (float(min(totals)), "no budget: the shortest run's step time"))
  targets = [float(t) for t in settings.get("targets") or ()]
  measures = run_measures(rows, horizon, targets)
  by_run = {(m["arm"], m["seed"]): m for m in measures}
  short = {}
  for arm in arms:
    if not math.isfinite(by_run[split_run_name(arm["name"])]["mean_accuracy_over_h"]):
      summary = arm["summary"]
      short[arm["name"]] = (
          "no summary: not finished" if not summary else "stopped by a signal"
          if summary.get("preempted") else "hit train.steps"
          if summary.get("steps") == arm["config"]["train"]["steps"] else "no evaluation")
  return {"horizon_s": horizon, "horizon_source": source, "targets": targets,
          "learning": rows, "runs": measures, "arms": arm_summary(measures, targets),
          "pairs": compare_pairs(measures, targets), "short": short}


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
