"""The report of a comparison (``python -m sagc_jax.compare``): one row per run of
``<workdir>/arms`` (``sagc_jax.experiments.arms``), the summary over seeds and claims.md.

The report: ``results.csv`` (one row per arm and seed: both straggler rates, total
and rollout wall-clock, mean step time and the speedup in it against the same seed's
largest static G of the same algorithm, rollouts generated, final train reward, held-out accuracy at the end, at
the horizon H and its mean over [0, H], mean response length, mean G),
``results.md`` (per arm: mean and 95% Student-t confidence interval over the seeds,
then the best model per hour: ``per_hour``), ``learning.csv`` and ``per_hour.json``
(``per_hour``) and PNG plots
(``plots.plot_comparison``: G and lambda over steps, running straggler rate and reward
vs wall-clock as the mean over seeds with a 95% band, posterior straggler probability
per G).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sagc_jax.experiments.arms import split_run_name
from sagc_jax.base.stats import Paired, paired_markdown, per_arm_markdown
from sagc_jax.experiments.claims import claims_markdown
from sagc_jax.experiments.machine import machine_info, machine_line
from sagc_jax.experiments.per_hour import analyse, write as write_per_hour, write_csv
from sagc_jax.experiments.per_hour_tables import per_hour_markdown
from sagc_jax.experiments.plots import plot_comparison, plot_learning
from sagc_jax.experiments.record import load_record, order_markdown
from sagc_jax.runtime.metrics import summarize
from sagc_jax.runtime.storage import read_json

RESULT_COLUMNS = ("arm", "seed", "run", "algorithm", "controller", "static_g", "steps",
                  "straggler_event", "straggler_rate", "group_straggler_rate",
                  "step_straggler_rate", "wall_clock_s", "seconds_per_step", "rollout_s",
                  "speedup_vs_largest_static", "rollouts",
                  "eval_accuracy_start", "eval_accuracy_end", "eval_sampled_accuracy_start",
                  "eval_sampled_accuracy_end", "final_reward",
                  "eval_sampled_gain", "response_len_mean", "response_len_start",
                  "response_len_end", "max_over_median_start", "max_over_median_end",
                  "mean_g", "sampled_accuracy_at_h", "mean_sampled_accuracy_over_h")
# The extra controller kinds (compare.contextual, compare.kinds) against SAGC of the same
# algorithm and seed, in claims.md (docs/controllers.md): the comparison's question.
CONTEXTUAL_PAIRED = (
    Paired("eval_sampled_accuracy_end", "held-out sampled accuracy at the end, arm - SAGC",
           "difference", "above"),
    Paired("mean_sampled_accuracy_over_h", "held-out sampled accuracy, mean over [0, H] "
           "of step time, arm - SAGC", "difference", "above"),
    Paired("sampled_accuracy_at_h", "held-out sampled accuracy at H, arm - SAGC",
           "difference", "above"),
    Paired("final_reward", "final train reward (last 10 steps), arm - SAGC", "difference",
           "above"),
    Paired("seconds_per_step", "mean step time, arm / SAGC", "ratio", "below"),
    Paired("group_straggler_rate", "group straggler rate, arm - SAGC", "difference", "below"),
    Paired("step_straggler_rate", "step straggler rate, arm - SAGC", "difference", "below"),
    Paired("mean_g", "mean G, arm - SAGC", "difference", None, "+.2f"),
)
# What results.md reports per arm, as mean +- 95% CI over the seeds: (column, header, format).
SUMMARY_COLUMNS = (
    ("group_straggler_rate", "group straggler rate", ".3f"),
    ("step_straggler_rate", "step straggler rate", ".3f"),
    ("wall_clock_s", "wall-clock s", ".1f"), ("seconds_per_step", "s per step", ".3f"),
    ("rollout_s", "rollout s", ".1f"),
    ("speedup_vs_largest_static", "speedup vs largest static G", ".2f"),
    ("rollouts", "rollouts generated", ".0f"),
    ("mean_sampled_accuracy_over_h", "held-out acc sampled, mean over [0, H]", ".3f"),
    ("final_reward", "final train reward", ".3f"),
    ("eval_accuracy_end", "held-out acc greedy (end)", ".3f"),
    ("eval_sampled_accuracy_end", "held-out acc sampled (end)", ".3f"),
    ("eval_sampled_gain", "sampled acc gain", "+.3f"),
    ("response_len_mean", "mean response len", ".1f"),
    ("response_len_start", "response len, first 5 steps", ".1f"),
    ("response_len_end", "response len, last 5 steps", ".1f"),
    ("max_over_median_start", "group max/median, first 5 steps", ".2f"),
    ("max_over_median_end", "group max/median, last 5 steps", ".2f"),
    ("mean_g", "mean G", ".2f"))
# (result column, its key in ``runtime.metrics.summarize``).
_SUMMARIZED = (("straggler_rate", "straggler_rate"),
               ("group_straggler_rate", "group_straggler_rate"),
               ("step_straggler_rate", "step_straggler_rate"), ("wall_clock_s", "time_total_s"),
               ("rollout_s", "time_rollout_s"), ("response_len_mean", "response_len_mean"),
               ("mean_g", "mean_g"))
TREND_WINDOW = 5       # steps averaged at each end of a run for the start / end trends


def load_arm(arm_dir: str | os.PathLike) -> dict[str, Any]:
  """An arm's config, metrics rows (with their evaluations), the evaluation before RL
  and the summary, from its run directory."""
  from sagc_jax.runtime.metrics import load_evaluation_before_rl, load_history

  arm_dir = Path(arm_dir)
  config = read_json(arm_dir / "config.json")
  summary_path = arm_dir / "summary.json"
  return {"name": arm_dir.name, "dir": str(arm_dir), "config": config,
          "rows": load_history(arm_dir),          # step rows (not the step-0 evaluation)
          "before_rl": load_evaluation_before_rl(arm_dir),
          "summary": read_json(summary_path) if summary_path.exists() else {}}


def load_comparison(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """Every arm under ``<workdir>/arms`` (or ``workdir`` itself if it is a single run)."""
  workdir = Path(workdir)
  if (workdir / "metrics.jsonl").exists():
    return [load_arm(workdir)]
  arms_dir = workdir / "arms"
  if not arms_dir.is_dir():
    raise FileNotFoundError(f"{workdir} holds neither arms/ nor a single run's metrics.jsonl")
  arms = [load_arm(d) for d in sorted(arms_dir.iterdir())
          if (d / "metrics.jsonl").exists() and (d / "config.json").exists()]
  arms = [a for a in arms if a["rows"]]          # an arm that has not finished a step yet
  seen: dict[tuple[str, int], str] = {}
  for arm in arms:         # "grpo_sagc" (before seeds) is seed 0 of "grpo_sagc_seed0"
    key = split_run_name(arm["name"])
    if key in seen:
      raise ValueError(f"{arms_dir}: {seen[key]} and {arm['name']} are both seed {key[1]} of "
                       f"arm {key[0]}; move one of them out of arms/")
    seen[key] = arm["name"]
  if not arms:
    raise FileNotFoundError(f"no finished arm (metrics.jsonl + config.json) under {arms_dir}")
  return arms


def window_mean(metrics: Sequence[dict[str, Any]], key: str, end: str,
                window: int = TREND_WINDOW) -> float:
  """Mean of ``key`` over the first (``end="start"``) or last ``window`` steps that
  carry it (nan when none do): how a run's lengths and straggler ratio moved."""
  values = [r[key] for r in metrics if key in r]
  values = values[:window] if end == "start" else values[-window:]
  return float(np.mean(values)) if values else float("nan")


def results_table(arms: Sequence[dict[str, Any]],
                  per_hour: dict[str, Any]) -> list[dict[str, Any]]:
  """One result row per run (arm and seed; see ``RESULT_COLUMNS``); the equal
  wall-clock columns come from ``per_hour.analyse``."""
  at_h = {(m["arm"], m["seed"]): m for m in per_hour["runs"]}
  nan = float("nan")
  rows = []
  for arm in arms:
    cfg, metrics, summary = arm["config"], arm["rows"], arm["summary"]
    stats = summarize(metrics)
    evals = [r for r in metrics if "eval_sampled_accuracy" in r]
    last_eval, last = (evals or [{}])[-1], (metrics or [{}])[-1]
    controller = cfg["controller"]["kind"]
    name, seed = split_run_name(arm["name"])
    row = {
        "arm": name, "seed": seed, "run": arm["name"],
        "algorithm": cfg["learner"]["algorithm"], "controller": controller,
        "static_g": cfg["controller"]["static_g"] if controller == "static" else "",
        "steps": len(metrics),
        "straggler_event": cfg["controller"].get("event", "group"),
        **{column: stats.get(key, nan) for column, key in _SUMMARIZED},
        "rollouts": (float(sum(r["rollouts"] for r in metrics))
                     if metrics and all("rollouts" in r for r in metrics) else nan),
        "eval_accuracy_start": summary.get("eval_accuracy_start", nan),
        "eval_accuracy_end": last_eval.get("eval_accuracy", nan),
        "eval_sampled_accuracy_start": summary.get("eval_sampled_accuracy_start", nan),
        "eval_sampled_accuracy_end": last_eval.get("eval_sampled_accuracy", nan),
        "final_reward": float(np.mean([r["reward_mean"] for r in metrics[-10:]]))
        if metrics else nan,
    }
    row["seconds_per_step"] = row["wall_clock_s"] / len(metrics) if metrics else nan
    row["sampled_accuracy_at_h"] = at_h[(name, seed)]["accuracy_at_h"]
    row["mean_sampled_accuracy_over_h"] = at_h[(name, seed)]["mean_accuracy_over_h"]
    row["eval_sampled_gain"] = (row["eval_sampled_accuracy_end"]
                                - row["eval_sampled_accuracy_start"])
    # The final posterior means of the smallest and largest candidate (claims.py).
    candidates = sorted(cfg["controller"]["candidates"])
    row["p_smallest_end"] = last.get(f"p_mean/G{candidates[0]}", nan)
    row["p_largest_end"] = last.get(f"p_mean/G{candidates[-1]}", nan)
    for key, column in (("response_len_mean", "response_len"),
                        ("group_max_over_median", "max_over_median")):
      for end in ("start", "end"):
        row[f"{column}_{end}"] = window_mean(metrics, key, end)
    rows.append(row)
  for row, arm in zip(rows, arms):
    # Against the same seed's static run at the largest candidate G (nan if that run is
    # not in the comparison, e.g. a partial merge).
    largest_g = max(arm["config"]["controller"]["candidates"])
    largest = [r for r in rows if r["algorithm"] == row["algorithm"] and r["seed"] == row["seed"]
               and r["controller"] == "static" and r["static_g"] == largest_g]
    row["speedup_vs_largest_static"] = (
        largest[0]["seconds_per_step"] / row["seconds_per_step"] if largest else nan)
  return rows


def contextual_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """'' without arms of other kinds (``compare.contextual``, ``compare.kinds``); else a
  section for claims.md: each such arm against SAGC of its algorithm, seed-paired
  (``CONTEXTUAL_PAIRED``)."""
  pairs = []
  for algorithm in dict.fromkeys(str(r["algorithm"]) for r in rows):
    # The run's own arm name: a user's kind "module:Class" is the arm "<alg>_module.Class".
    kinds = {r["arm"]: r["controller"] for r in rows if str(r["algorithm"]) == algorithm
             and r["controller"] not in ("sagc", "static")}
    pairs += [(f"{algorithm} {kind}", arm, f"{algorithm}_sagc") for arm, kind in kinds.items()]
  if not pairs:
    return ""
  seeds = len({int(r["seed"]) for r in rows})
  return ("\n\n## Contextual controllers against SAGC\n\nPer seed, the arm against SAGC of "
          f"the same algorithm and seed, then mean ± 95% CI over the {seeds} seeds:\n\n"
          + paired_markdown(rows, pairs, CONTEXTUAL_PAIRED))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  """Per arm: mean ± 95% CI over its seeds (n = seeds) of ``SUMMARY_COLUMNS``."""
  return per_arm_markdown(rows, SUMMARY_COLUMNS, seeds_column=True)


def report(workdir: Path, log=print) -> list[dict[str, Any]]:
  """Writes results.csv, results.md (with the best model per hour), claims.md,
  learning.csv, per_hour.json and the plots of the runs under ``workdir``; returns
  the result rows."""
  arms = load_comparison(workdir)
  settings = load_record(workdir)
  # The machine the arms ran on (recorded when they were launched), not this one.
  machine = settings.get("machine")
  measured_on = (machine_line(machine) if machine is not None else "not recorded (the runs "
                 f"predate machine records); report built on {machine_line(machine_info())}")
  caption = f"Measured on: {measured_on}.\n\n"
  if order_markdown(settings):
    caption += order_markdown(settings) + "\n\n"
  per_hour = analyse(arms, settings)
  rows = results_table(arms, per_hour)
  # Per arm: mean ± 95% CI over its seeds (n = seeds) of SUMMARY_COLUMNS.
  table = (markdown_table(rows) + "\n\n"
           + per_hour_markdown(per_hour))
  claims = claims_markdown(rows) + contextual_markdown(rows)
  write_per_hour(per_hour, workdir)
  write_csv(workdir / "results.csv", RESULT_COLUMNS, rows)
  (workdir / "results.md").write_text(caption + table + "\n", encoding="utf-8")
  (workdir / "claims.md").write_text(caption + claims + "\n", encoding="utf-8")
  plot_comparison(arms, workdir, machine)
  plot_learning(per_hour["learning"], per_hour["horizon_s"], workdir, machine)
  log(table)
  log(claims)
  log(f"wrote {workdir / 'results.csv'} (one row per arm and seed), {workdir / 'results.md'} "
      f"(mean ± 95% CI over seeds, the best model per hour), {workdir / 'claims.md'} (the "
      f"paper's claims, per seed-paired comparison), {workdir / 'learning.csv'} (every "
      f"evaluation), {workdir / 'per_hour.json'} (every pair of arms at equal step time) "
      f"and plots in {workdir}")
  return rows
