"""Calibration of SAGC on a policy's own rollouts: ``python -m sagc_jax.calibrate``'s report.

From a trace (``replay.trace``) it measures the length distribution, the group and
step straggler probabilities per candidate G at the run's ``tau`` (bootstrap
intervals by prompt) and how they move with ``tau``; then it recommends a setting.

The rule (docs/calibrate.md): a setting is judged by what it costs, not by how far
apart the candidates' rates are. Every SAGC setting of a ``tau`` x ``delta`` grid and
every static G replay the trace (the replay engine's trace world, ``replay.entry_points``:
the run's rollout budget and algorithm, the chosen cost model, bootstrap replicates).
The report ranks them under every learning measure (``experiments.signals``), and
recommends the setting that gathers the most of a measure per hour of priced time
only under a validated measure (``validated``: it passed its check against measured
learning on every workload-mode that tested it, ``signals.validated_measures``;
docs/results.md holds the checks). Otherwise it withholds
the ranking and says why. When a static G beats every SAGC setting the report says
so.

``straggler_savings``: per way of changing G, the share of rollout time the
stragglers cost (every row above ``tau x`` its group's median cut to that length and
priced again) per static G, and under ``hold_prompts`` what a smaller G saves by
decoding fewer rows, apart from stragglers (its rollout without stragglers against the
largest G's).
"""

from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import numpy as np

from sagc_jax.control.budget import ROLLOUT_MODES, prompts_for
from sagc_jax.replay.engine import sagc_arm_name
from sagc_jax.experiments.signals import agree, chosen, measure_values, signals
from sagc_jax.replay.entry_points import replay_replicates
from sagc_jax.base.stats import arm_intervals
from sagc_jax.replay.trace import (Trace, length_summary, pass_rate_histogram, straggler_rates,
                                   tau_curve)

__all__ = ["DELTAS", "TAUS", "calibration_report", "format_report", "observed_rates",
           "prediction_check"]

TAUS = (1.5, 1.8, 2.0, 2.25, 2.5, 3.0, 4.0)
DELTAS = (0.1, 0.25, 0.5)
CURVE_TAUS = tuple(np.round(np.arange(1.2, 4.01, 0.1), 2))


def calibration_report(trace: Trace, cost: Callable, section: dict[str, Any], *,
                       rollout: dict[str, Any],
                       candidates: Sequence[int], max_rounds: int, length_scale: float = 1.0,
                       length_cap: int | None = None, steps: int = 200, replicates: int = 10,
                       taus: Sequence[float] = TAUS, deltas: Sequence[float] = DELTAS,
                       validated: Sequence[str] = (), measures: Sequence[str] = (),
                       kinds: Sequence[str] = (), log: Callable[[str], None] = print
                       ) -> dict[str, Any]:
  """The calibration report of ``trace`` (module docstring): the controllers are the
  complete controller ``section`` of the traced run (``ControllerSection.to_dict()``),
  replayed under ``rollout`` (the budget P(G) the replay and the step rates use),
  ``candidates`` and ``max_rounds`` (``cost.settings(trace)`` gives them)."""
  header = trace.header
  budget = types.SimpleNamespace(**rollout)
  wanted = sorted(candidates)
  candidates = [g for g in wanted if 2 * g <= trace.responses]
  if not candidates:
    raise ValueError(f"the trace holds {trace.responses} responses per prompt: a replay needs "
                     f"at least twice a candidate G (candidates {wanted})")
  if candidates != wanted:
    log(f"calibrate: candidates {[g for g in wanted if g not in candidates]} need more than "
        f"{trace.responses // 2} responses per prompt; calibrating {candidates}")
  section = dict(section, candidates=tuple(candidates))
  tau = float(section["tau"])
  rates = lambda at: {f"G{g}": straggler_rates(trace, g, at, prompts_for(budget, g))
                      for g in candidates}
  dapo = bool(header.get("learner", {}).get("dynamic_sampling", False))
  taus = sorted({*map(float, taus), tau})
  settings = [(t, d) for t in taus for d in deltas]
  rows, lambdas = [], {}
  for rep, result in replay_replicates(
      [trace], section, cost, replicates=replicates, log=log,
      progress=f"calibrate: replaying {len(settings)} SAGC settings and "
      f"{len(candidates)} static G{' and ' + ', '.join(kinds) if kinds else ''}, replicate "
      f"{{k}}/{replicates} ({steps} steps)",
      rollout=rollout, steps=steps, dapo=dapo, max_rounds=max_rounds, kinds=kinds,
      grid=settings, length_scale=length_scale, length_cap=length_cap):
    rows += [dict(s, **measure_values(s), arm=arm, seed=rep, step_s=s["wall_clock_s"] / steps)
             for arm, s in result["summary"].items()]
    for arm, columns in result["traces"].items():
      if arm.startswith("sagc_tau"):        # the dual's equilibrium: its second half's mean
        lambdas.setdefault(arm, []).append(float(np.mean(columns["lambda"][steps // 2:])))
  reference = f"static_G{max(candidates)}"
  table = arm_intervals(rows, ("seconds_per_signal", "step_s", "rollout_s",
                               "group_straggler_rate", "step_straggler_rate", "mean_g"),
                        reference, ratios=("time_to_target_s", "seconds_per_signal", "step_s"))
  found = signals(rows, chosen(measures))
  bests = {m: max(settings, key=lambda s, m=m: found[m]["arms"][sagc_arm_name(*s)]["mean"])
           for m in validated if m in found}
  if len(set(bests.values())) != 1:
    why = ("no learning measure has passed its check against measured learning on every "
           "workload-mode that tested it (docs/results.md)" if not validated else
           f"the validated measures ({', '.join(validated)}) are not among --signal"
           if not bests else
           "the validated measures disagree on the best setting (" + ", ".join(
               f"{m}: {sagc_arm_name(*s)}" for m, s in bests.items()) + ")")
    recommended = {"withheld": why + ", so the replay cannot say which setting trains "
                   "faster; read the step time and the straggler rates",
                   "candidates": candidates}
  else:
    measure, (best_tau, best_delta) = next(iter(bests.items()))
    value = lambda arm: found[measure]["arms"][arm]["mean"]
    best = sagc_arm_name(best_tau, best_delta)
    best_static = max((a for a in table if a.startswith("static")), key=value)
    recommended = {
        "measure": measure, "tau": best_tau, "delta": best_delta, "candidates": candidates,
        "arm": best, "per_hour": value(best), "static_beats_it": value(best_static) > value(best),
        "best_static": best_static,
        "predicted_rates": rates(best_tau),
        "overrides": f"--config.controller.tau={best_tau:g} "
                     f"--config.controller.delta={best_delta:g} "
                     f"--config.controller.candidates='({','.join(map(str, candidates))})'"}
  warm = sagc_arm_name(tau, float(section["delta"]))      # the run's own setting
  if warm in lambdas:
    value = float(np.median(lambdas[warm]))
    recommended["initial_lambda"] = {
        "arm": warm, "value": value, "override": f"--config.controller.initial_lambda={value:.3g}",
        "rule": "the median over replicates of the dual's mean over the second half of the "
                "replay at the run's tau and delta: SAGC warm-started at its equilibrium"}
  seed = cost.cost_seed(trace) if hasattr(cost, "cost_seed") else None
  if seed is not None:
    recommended["cost_seed"] = {"value": list(seed), "override": (
        "--config.controller.cost_seed='(" + ",".join(f"{v:.4g}" for v in seed) + ")'")}
  return {
      "trace": {k: header.get(k) for k in ("model", "config_digest", "date", "split", "prompts",
                                          "responses", "checkpoint_step", "sampling")},
      "cost_model": getattr(cost, "name", "custom"),
      "rollout": rollout, "algorithm": "dapo" if dapo else "grpo",
      "length_scale": length_scale,
      "lengths": length_summary(trace),
      "pass_rates": pass_rate_histogram(trace),
      "tau": tau, "candidates": candidates,
      "straggler_rates": rates(tau),
      "tau_curve": tau_curve(trace, candidates, CURVE_TAUS),
      "rule": "the most of a validated learning measure per hour of priced time "
              "(experiments.signals); withheld when no measure is validated",
      "replay": {"steps": steps, "replicates": replicates, "taus": taus,
                 "deltas": list(deltas), "arms": table, "reference": reference},
      "signals": found, "measures_agree": agree(found), "validated": list(validated),
      "recommended": recommended,
      "straggler_savings": straggler_savings(
          trace, cost, section, rollout=rollout, steps=steps, replicates=replicates, dapo=dapo,
          max_rounds=max_rounds, length_scale=length_scale, length_cap=length_cap),
  }


def straggler_savings(trace: Trace, cost: Callable, section: dict[str, Any], *,
                      rollout: dict[str, Any], steps: int, replicates: int, dapo: bool,
                      max_rounds: int, length_scale: float = 1.0,
                      length_cap: int | None = None) -> dict[str, Any]:
  """Per way of changing G (module docstring): every static G's share of rollout time
  the stragglers cost, and its rollout without stragglers against the largest G's,
  each a mean and 95% interval over bootstrap replicates."""
  out = {}
  reference = f"static_G{max(section['candidates'])}"
  for mode in ROLLOUT_MODES:
    rows = [dict(s, arm=arm, seed=rep) for rep, result in replay_replicates(
        [trace], section, cost, replicates=replicates, rollout=dict(rollout, mode=mode),
        steps=steps, dapo=dapo, max_rounds=max_rounds, kinds=(), length_scale=length_scale,
        length_cap=length_cap) for arm, s in result["summary"].items()]
    table = arm_intervals(rows, ("straggler_share", "straggler_step_share"), reference,
                          ratios=("rollout_cut_s",))
    out[mode] = {"cost_model": getattr(cost, "name", "custom"),
                 **{key: {a: _interval(t, key) for a, t in table.items()}
                    for key in ("straggler_share", "straggler_step_share")}}
    if mode == "hold_prompts":
      out[mode]["rollout_without_stragglers_vs_largest_g"] = {
          a: _interval(t, f"rollout_cut_s_vs_{reference}") for a, t in table.items()}
  return out


def _interval(row: dict[str, float], key: str) -> dict[str, float]:
  return {"mean": row[key], "low": row[f"{key}_low"], "high": row[f"{key}_high"]}


def format_report(report: dict[str, Any]) -> str:
  """The report as the lines calibrate prints."""
  n = report["lengths"]
  lines = [f"response lengths (tokens): p50 {n['p50']:.0f}  p90 {n['p90']:.0f}  p99 "
           f"{n['p99']:.0f}  max {n['max']:.0f} of {n['max_new_tokens']:.0f}; truncated "
           f"{n['truncated_share']:.3f}; pass rate {n['pass_rate']:.3f}",
           "prompts by pass rate: " + ", ".join(
               f"{name} {share:.0%}" for name, share in report["pass_rates"]["bins"].items())
           + f"; at 0 < p <= 0.1 or 0.9 <= p < 1: {report['pass_rates']['extreme_share']:.0%}",
           f"straggler probability at tau {report['tau']:g} (95% bootstrap interval by prompt):"]
  for g, r in report["straggler_rates"].items():
    lines.append(f"  {g:>4}: groups {r['group_rate']:.3f} [{r['group_low']:.3f}, "
                 f"{r['group_high']:.3f}]  steps of {r['groups_per_step']} groups "
                 f"{r['step_rate']:.3f} [{r['step_low']:.3f}, {r['step_high']:.3f}]")
  replay_ = report["replay"]
  lines.append(f"replay ({report['algorithm']}, cost {report['cost_model']}, "
               f"{replay_['replicates']} replicates x {replay_['steps']} steps): step time "
               f"(95% interval over replicates), vs {replay_['reference']}")
  arms = replay_["arms"]
  vs = f"step_s_vs_{replay_['reference']}"
  for name in sorted(arms, key=lambda k: arms[k]["step_s"]):
    if name.startswith("static") or name == report["recommended"].get("arm"):
      a = arms[name]
      lines.append(f"  {name:<24} {a['step_s']:.4g} s  x{a[vs]:.3f} [{a[vs + '_low']:.3f}, "
                   f"{a[vs + '_high']:.3f}]  rollout {a['rollout_s'] / replay_['steps']:.4g} s"
                   f"  mean G {a['mean_g']:.2f}  groups straggling "
                   f"{a['group_straggler_rate']:.3f}")
  lines.append("per hour of priced time, each learning measure ranks the settings:")
  for measure, entry in report["signals"].items():
    lines.append(f"  {measure:<20} best {', '.join(entry['ranking'][:3])}")
  rec = report["recommended"]
  if not report["measures_agree"]:
    lines.append("  the measures disagree on the best setting: " + (
        "the replay cannot rank the settings; read the step and rollout times and the "
        "straggler rates" if "withheld" in rec else
        f"the recommendation uses only the validated ones ({', '.join(report['validated'])}), "
        "which agree" if len(report["validated"]) > 1 else
        f"the recommendation uses only the validated one ({report['validated'][0]})"))
  if "withheld" in rec:
    lines.append(f"no recommendation: {rec['withheld']}")
  else:
    lines.append(f"recommended (the most {rec['measure']} per hour): {rec['overrides']}")
    if rec["static_beats_it"]:
      lines.append(f"  note: {rec['best_static']} gathers more {rec['measure']} per hour than "
                   "every SAGC setting on this trace and cost model")
  if "initial_lambda" in rec:
    lines.append(f"SAGC warm start ({rec['initial_lambda']['arm']}'s equilibrium): "
                 f"{rec['initial_lambda']['override']}")
  if "cost_seed" in rec:
    source = ("the AOT report, at this trace's lengths" if report["cost_model"].startswith(
        "aot") else "this trace's fit")
    lines.append(f"signal_rate's cost model from {source}: {rec['cost_seed']['override']}")
  for mode, entry in report["straggler_savings"].items():
    share = "; ".join(f"{a} {v['mean']:.1%} [{v['low']:.1%}, {v['high']:.1%}]"
                      for a, v in entry["straggler_share"].items())
    lines.append(f"rollout time the stragglers cost ({mode}): {share}")
    for a, v in entry.get("rollout_without_stragglers_vs_largest_g", {}).items():
      lines.append(f"  {a} without stragglers decodes x{v['mean']:.3f} of the largest G's "
                   "rollout time")
  return "\n".join(lines)


def observed_rates(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
  """Per G a run used: the group straggler rate it observed over its steps at that G
  (``metrics.jsonl`` rows: ``g``, ``n_groups``, ``n_stragglers``) with a 95% Wilson
  score interval over those groups (each group is a different prompt's)."""
  out = {}
  for g in sorted({int(r["g"]) for r in rows}):
    steps = [r for r in rows if int(r["g"]) == g]
    n = float(sum(r["n_groups"] for r in steps))
    k = float(sum(r["n_stragglers"] for r in steps))
    p, z = k / n, 1.959964
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    out[f"G{g}"] = {"group_rate": p, "group_low": float(centre - half),
                    "group_high": float(centre + half), "steps": len(steps), "groups": int(n)}
  return out


def prediction_check(trace: Trace, rows: Sequence[dict[str, Any]], tau: float,
                     rollout: dict[str, Any], other_tau: float | None = None) -> str:
  """Markdown: per G, the group straggler rate ``trace`` predicts at ``tau`` (and at
  ``other_tau``) beside the one a run at ``tau`` observed (``observed_rates``)."""
  budget = types.SimpleNamespace(**rollout)
  observed = observed_rates(rows)
  sizes = {int(g[1:]) for g in observed} | set(trace.header["controller"]["candidates"])
  title = f" predicted at tau {other_tau:g} |" if other_tau is not None else ""
  lines = [f"| G | predicted at tau {tau:g} | observed at tau {tau:g} (groups, steps) |{title}",
           "|---|---|---|" + ("---|" if other_tau is not None else "")]
  cell = lambda r: f"{r['group_rate']:.3f} [{r['group_low']:.3f}, {r['group_high']:.3f}]"
  for g in sorted(g for g in sizes if g <= trace.responses):
    predicted = straggler_rates(trace, g, tau, prompts_for(budget, g))
    seen = observed.get(f"G{g}")
    row = (f"| {g} | {cell(predicted)} | "
           + (f"{cell(seen)} ({seen['groups']}, {seen['steps']})" if seen else "not used")
           + " |")
    if other_tau is not None:
      row += f" {cell(straggler_rates(trace, g, other_tau, prompts_for(budget, g)))} |"
    lines.append(row)
  return "\n".join(lines)
