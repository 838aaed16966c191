"""Calibration of SAGC on a policy's own rollouts: ``python -m sagc_jax.calibrate``'s report.

From a trace (``control.trace``) it measures the length distribution, the group and
step straggler probabilities per candidate G at the run's ``tau`` (bootstrap
intervals by prompt) and how they move with ``tau``; then it recommends a setting.

The rule (docs/calibrate.md): a setting is judged by what it costs, not by how far
apart the candidates' rates are. Every SAGC setting of a ``tau`` x ``delta`` grid and
every static G replay the trace (the replay engine's trace world, ``control.replay``: the run's rollout budget and
algorithm, the chosen cost model, bootstrap replicates) and the recommended one has
the smallest projected time to a fixed learning signal: seconds per unit of
``sum 4 p (1 - p) log2 G`` over the trained groups. That signal is SAGC's utility
``log2 G`` weighted by each prompt's reward variance (no gradient from a prompt always
or never solved). When a static G beats every SAGC setting the report says so.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Sequence

import numpy as np

from sagc_jax.control.budget import prompts_for
from sagc_jax.control.engine import sagc_arm_name
from sagc_jax.control.replay import replay
from sagc_jax.control.tables import arm_intervals
from sagc_jax.control.trace import Trace, length_summary, straggler_rates, tau_curve

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
                       log: Callable[[str], None] = print) -> dict[str, Any]:
  """The calibration report of ``trace`` (module docstring): the controllers are the
  complete controller ``section`` of the traced run (``ControllerSection.to_dict()``),
  replayed under ``rollout`` (the budget P(G) the replay and the step rates use),
  ``candidates`` and ``max_rounds`` (``cost.settings(trace)`` gives them)."""
  header = trace.header
  controller = dict(section)
  budget = types.SimpleNamespace(**rollout)
  wanted = sorted(candidates)
  candidates = [g for g in wanted if 2 * g <= trace.responses]
  if not candidates:
    raise ValueError(f"the trace holds {trace.responses} responses per prompt: a replay needs "
                     f"at least twice a candidate G (candidates {wanted})")
  if candidates != wanted:
    log(f"calibrate: candidates {[g for g in wanted if g not in candidates]} need more than "
        f"{trace.responses // 2} responses per prompt; calibrating {candidates}")
  tau = float(controller["tau"])
  rates = {f"G{g}": straggler_rates(trace, g, tau, prompts_for(budget, g)) for g in candidates}
  dapo = bool(header.get("learner", {}).get("dynamic_sampling", False))
  taus = sorted({*map(float, taus), tau})
  rows = []
  for rep in range(replicates):
    log(f"calibrate: replaying {len(taus) * len(deltas)} SAGC settings and "
        f"{len(candidates)} static G, replicate {rep + 1}/{replicates} ({steps} steps)")
    reseeded = dict(controller, seed=int(controller["seed"]) + rep,
                    candidates=tuple(candidates))
    result = replay([trace], reseeded, cost, rollout=rollout, steps=steps, dapo=dapo,
                    max_rounds=max_rounds, kinds=(), grid=[(t, d) for t in taus for d in deltas],
                    seed=rep, bootstrap=True, length_scale=length_scale, length_cap=length_cap)
    rows += [dict(s, arm=arm, seed=rep) for arm, s in result["summary"].items()]
  reference = f"static_G{max(candidates)}"
  table = arm_intervals(rows, ("seconds_per_signal", "group_straggler_rate",
                               "step_straggler_rate", "mean_g"), reference,
                        ratios=("time_to_target_s", "seconds_per_signal"))
  static = {k: v for k, v in table.items() if k.startswith("static")}
  settings = [(t, d) for t in taus for d in deltas]
  best_tau, best_delta = min(settings,
                             key=lambda s: table[sagc_arm_name(*s)]["seconds_per_signal"])
  best = sagc_arm_name(best_tau, best_delta)
  best_static = min(static, key=lambda k: static[k]["seconds_per_signal"])
  return {
      "trace": {k: header.get(k) for k in ("model", "config_digest", "date", "split", "prompts",
                                          "responses", "checkpoint_step", "sampling")},
      "cost_model": getattr(cost, "name", "custom"),
      "rollout": rollout, "algorithm": "dapo" if dapo else "grpo",
      "length_scale": length_scale,
      "lengths": length_summary(trace),
      "tau": tau, "candidates": candidates,
      "straggler_rates": rates,
      "tau_curve": tau_curve(trace, candidates, CURVE_TAUS),
      "rule": "smallest projected seconds per unit of learning signal "
              "(sum over trained groups of 4 p (1 - p) log2 G)",
      "replay": {"steps": steps, "replicates": replicates, "taus": taus,
                 "deltas": list(deltas), "arms": table, "reference": reference},
      "recommended": {
          "tau": best_tau, "delta": best_delta, "candidates": candidates, "arm": best,
          "seconds_per_signal": table[best]["seconds_per_signal"],
          "static_beats_it": static[best_static]["seconds_per_signal"]
                             < table[best]["seconds_per_signal"],
          "best_static": best_static,
          "predicted_rates": {f"G{g}": straggler_rates(trace, g, best_tau,
                                                       prompts_for(budget, g))
                              for g in candidates},
          "overrides": f"--config.controller.tau={best_tau:g} "
                       f"--config.controller.delta={best_delta:g} "
                       f"--config.controller.candidates='({','.join(map(str, candidates))})'",
      },
  }


def format_report(report: dict[str, Any]) -> str:
  """The report as the lines calibrate prints."""
  n = report["lengths"]
  lines = [f"response lengths (tokens): p50 {n['p50']:.0f}  p90 {n['p90']:.0f}  p99 "
           f"{n['p99']:.0f}  max {n['max']:.0f} of {n['max_new_tokens']:.0f}; truncated "
           f"{n['truncated_share']:.3f}; pass rate {n['pass_rate']:.3f}",
           f"straggler probability at tau {report['tau']:g} (95% bootstrap interval by prompt):"]
  for g, r in report["straggler_rates"].items():
    lines.append(f"  {g:>4}: groups {r['group_rate']:.3f} [{r['group_low']:.3f}, "
                 f"{r['group_high']:.3f}]  steps of {r['groups_per_step']} groups "
                 f"{r['step_rate']:.3f} [{r['step_low']:.3f}, {r['step_high']:.3f}]")
  replay_ = report["replay"]
  lines.append(f"replay ({report['algorithm']}, cost {report['cost_model']}, "
               f"{replay_['replicates']} replicates x {replay_['steps']} steps): seconds per "
               f"unit of signal, vs {replay_['reference']}")
  arms = replay_["arms"]
  ranked = sorted(arms, key=lambda k: arms[k]["seconds_per_signal"])
  for name in ranked[:5] + [k for k in ranked[5:] if k.startswith("static")]:
    a = arms[name]
    vs = f"seconds_per_signal_vs_{replay_['reference']}"
    lines.append(f"  {name:<24} {a['seconds_per_signal']:.4g} s  x{a[vs]:.3f} "
                 f"[{a[vs + '_low']:.3f}, {a[vs + '_high']:.3f}]  mean G "
                 f"{a['mean_g']:.2f}  groups straggling {a['group_straggler_rate']:.3f}")
  rec = report["recommended"]
  lines.append(f"recommended ({report['rule']}): {rec['overrides']}")
  if rec["static_beats_it"]:
    lines.append(f"  note: {rec['best_static']} costs less per unit of signal than every SAGC "
                 "setting on this trace and cost model")
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
  sizes = sorted({int(g[1:]) for g in observed} | set(trace.header["controller"]["candidates"]))
  title = f" predicted at tau {other_tau:g} |" if other_tau is not None else ""
  lines = [f"| G | predicted at tau {tau:g} | observed at tau {tau:g} (groups, steps) |{title}",
           "|---|---|---|" + ("---|" if other_tau is not None else "")]
  cell = lambda r: f"{r['group_rate']:.3f} [{r['group_low']:.3f}, {r['group_high']:.3f}]"
  for g in sizes:
    if g > trace.responses:
      continue
    predicted = straggler_rates(trace, g, tau, prompts_for(budget, g))
    seen = observed.get(f"G{g}")
    row = (f"| {g} | {cell(predicted)} | "
           + (f"{cell(seen)} ({seen['groups']}, {seen['steps']})" if seen else "not used")
           + " |")
    if other_tau is not None:
      row += f" {cell(straggler_rates(trace, g, other_tau, prompts_for(budget, g)))} |"
    lines.append(row)
  return "\n".join(lines)
