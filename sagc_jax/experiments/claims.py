"""The SAGC paper's claims, each checked on per-seed results of a comparison.

Input rows are one run each (an arm and a seed): ``algorithm`` (the table's column
group, e.g. GRPO and DAPO, or the simulator), ``controller`` (``"sagc"`` or
``"static"``), ``static_g``, ``seed`` and the measured values. Every claim compares
SAGC with static arms *of the same seed*, so the dice that both saw cancel:

* rates, lengths: the per-seed difference SAGC - static max-G;
* time: the per-seed speedup static max-G / SAGC of the mean step time (at equal
  steps the wall-clock ratio; under a time budget every arm's wall-clock is the
  budget, and the step time is what differs);
* reward and accuracy at the end: SAGC's mean against the best static arm's 95%
  interval (the claim is "competitive", not "better");
* held-out accuracy at equal wall-clock: the per-seed difference SAGC - static G of
  the mean accuracy over [0, H] (``per_hour``), against every static G;
* the posterior: SAGC's final p(max G) - p(min G) per seed.

Each is reported as mean ± 95% Student-t half-width over the seeds with a verdict:
``✓`` when the interval lies on the claimed side, ``✗`` otherwise, ``?`` with fewer
than two seeds (no interval) and ``n/a`` when the rows lack the value (the simulator
has no policy, so no reward or accuracy). Nothing here is tuned per run: the verdicts
are a fixed function of the rows.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Sequence

from sagc_jax.base.stats import (by_seed, finite, format_ci, interval_side, mean_ci,
                                 per_seed, too_few)

__all__ = ["CLAIMS", "Claim", "adaptation_table", "claims_markdown", "claims_table"]


@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim: how its statistic is formed and which side of ``null`` it claims."""
  text: str
  key: str
  kind: str          # "paired_difference", "paired_speedup", "competitive", "posterior"
  side: str          # "below" / "above" null: the interval excludes it; "not_above" /
                     # "not_below": it does not show the opposite (competitive: SAGC >=
                     # best static - CI)
  null: float
  fmt: str
  against: int | None = None     # the static G compared with; None: the largest


CLAIMS = (
    Claim("step straggler rate lower than static max-G (paper: 99.6% -> 43.4%)",
          "step_straggler_rate", "paired_difference", "below", 0.0, "+.3f"),
    Claim("group straggler rate lower than static max-G", "group_straggler_rate",
          "paired_difference", "below", 0.0, "+.3f"),
    Claim("time per step lower than static max-G (speedup > 1; at equal steps the "
          "wall-clock)", "seconds_per_step",
          "paired_speedup", "above", 1.0, ".2f"),
    Claim("train reward competitive: within the best static arm's 95% CI", "final_reward",
          "competitive", "above", 0.0, ".3f"),
    Claim("held-out sampled accuracy competitive: within the best static arm's 95% CI",
          "eval_sampled_accuracy_end", "competitive", "above", 0.0, ".3f"),
    Claim("the posterior learns p(max G) > p(min G)", "posterior_gap", "posterior",
          "above", 0.0, "+.3f"),
    Claim("output length shorter or equal: not longer than static max-G",
          "response_len_mean", "paired_difference", "not_above", 0.0, "+.2f"),
)


def _verdict(stat: tuple[float, float, int], side: str, null: float) -> str:
  """The interval excludes ``null`` on ``side``, or does not on side "not_<side>"."""
  found = interval_side(stat, null)
  holds = found != side.removeprefix("not_") if side.startswith("not_") else found == side
  return too_few(stat) or ("✓" if holds else "✗")


def _is_static(row: dict[str, Any], g: int) -> bool:
  return row["controller"] == "static" and int(row["static_g"]) == g


def _evaluate(claim: Claim, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """``{"stat": (mean, half, n), "verdict", "detail"}`` of one claim on one group."""
  sagc = by_seed(rows, lambda r: r["controller"] == "sagc")
  static_gs = sorted({int(r["static_g"]) for r in rows if r["controller"] == "static"})
  versus = static_gs[-1] if static_gs and claim.against is None else claim.against
  if not sagc or versus not in static_gs:
    return {"stat": (float("nan"), float("nan"), 0), "verdict": "n/a", "detail": ""}
  largest = by_seed(rows, lambda r: _is_static(r, versus))
  detail = f"vs static G={versus}"
  if claim.kind in ("paired_difference", "paired_speedup"):
    op = operator.sub if claim.kind == "paired_difference" else (
        lambda ours, base: base / ours)                           # the speedup
    stat = mean_ci(per_seed(sagc, largest, claim.key, op))
  elif claim.kind == "posterior":
    stat = mean_ci([s["p_largest_end"] - s["p_smallest_end"] for s in sagc.values()
                    if finite(s.get("p_largest_end")) and finite(s.get("p_smallest_end"))])
    detail = "SAGC's final posterior means"
  else:                                       # competitive
    arms = {g: mean_ci([r.get(claim.key, float("nan")) for r in rows if _is_static(r, g)])
            for g in static_gs}
    arms = {g: a for g, a in arms.items() if a[2]}
    ours = mean_ci([s.get(claim.key, float("nan")) for s in sagc.values()])
    if not arms or not ours[2]:
      return {"stat": (float("nan"), float("nan"), 0), "verdict": "n/a", "detail": ""}
    best_g = max(arms, key=lambda g: arms[g][0])
    best, margin, _ = arms[best_g]
    # Competitive: the best static arm's interval is not above SAGC's mean.
    verdict = too_few(ours) or _verdict(arms[best_g], "not_above", ours[0])
    return {"stat": ours, "verdict": verdict,
            "detail": f"best static G={best_g}: {best:{claim.fmt}} ± {margin:{claim.fmt}}"}
  return {"stat": stat, "verdict": _verdict(stat, claim.side, claim.null), "detail": detail}


def claims_for(rows: Sequence[dict[str, Any]]) -> tuple[Claim, ...]:
  """``CLAIMS``, then, when the rows carry the per-hour measure, held-out accuracy at
  equal wall-clock against each static G of the rows."""
  if not any(finite(r.get("mean_sampled_accuracy_over_h")) for r in rows):
    return CLAIMS
  static_gs = sorted({int(r["static_g"]) for r in rows if r["controller"] == "static"})
  return CLAIMS + tuple(
      Claim(f"held-out sampled accuracy at equal wall-clock (mean over [0, H]): not below "
            f"static G={g}", "mean_sampled_accuracy_over_h", "paired_difference",
            "not_below", 0.0, "+.3f", against=g) for g in static_gs)


def claims_table(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
  """Per ``algorithm`` group (first-seen order): one evaluated entry per claim of
  ``claims_for``."""
  groups = {name: [r for r in rows if str(r["algorithm"]) == name]
            for name in dict.fromkeys(str(r["algorithm"]) for r in rows)}
  claims = claims_for(rows)
  return {name: [{"claim": c, **_evaluate(c, group)} for c in claims]
          for name, group in groups.items()}


def _cell(entry: dict[str, Any]) -> str:
  if not entry["stat"][2]:
    return "–"
  value = format_ci(entry["stat"], entry["claim"].fmt)
  if entry["claim"].kind == "paired_speedup":
    value += "x"
  return value + (f" ({entry['detail']})" if entry["detail"] else "")


def claims_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """The claims as a markdown table: one row per claim, per group the measured
  mean ± 95% CI over seeds and the verdict."""
  table = claims_table(rows)
  names = list(table)
  seeds = {name: len({int(r["seed"]) for r in rows if str(r["algorithm"]) == name})
           for name in names}
  header = "| claim | " + " | ".join(f"{n}, {seeds[n]} seeds | ✓/✗" for n in names) + " |"
  lines = [header, "|---|" + "---|---|" * len(names)]
  for i, claim in enumerate(claims_for(rows)):
    cells = " | ".join(f"{_cell(table[n][i])} | {table[n][i]['verdict']}" for n in names)
    lines.append(f"| {claim.text} | {cells} |")
  return "\n".join(lines)


def adaptation_table(comparisons: dict[str, Sequence[dict[str, Any]]]) -> str:
  """The last claim of the seed: SAGC adapts to how variable a workload's lengths are.

  ``comparisons`` maps a workload name (a model family, a warm start, a task) to its
  per-run rows. Per algorithm, the workloads are ordered by their static max-G
  group straggler rate (the length variability SAGC sees); the claim holds when the
  calmer workload's SAGC runs use a larger mean G than the wilder one's, seed-paired
  (mean ± 95% CI of the per-seed difference above 0).
  """
  names = list(comparisons)
  if len(names) != 2:
    raise ValueError(f"adaptation needs exactly two workloads, got {names}")
  algorithms = sorted({str(r["algorithm"]) for rows in comparisons.values() for r in rows})
  lines = ["| algorithm | workload: static max-G group straggler rate, SAGC mean G | "
           "calmer - wilder SAGC mean G (per seed) | ✓/✗ |", "|---|---|---|---|"]
  for algorithm in algorithms:
    summary, sagc = {}, {}
    for name in names:
      rows = [r for r in comparisons[name] if str(r["algorithm"]) == algorithm]
      static_gs = [int(r["static_g"]) for r in rows if r["controller"] == "static"]
      if not static_gs:
        continue
      largest = max(static_gs)
      rate = mean_ci([r["group_straggler_rate"] for r in rows if _is_static(r, largest)])
      sagc[name] = by_seed(rows, lambda r: r["controller"] == "sagc")
      summary[name] = (rate, mean_ci([r["mean_g"] for r in sagc[name].values()]))
    if len(summary) != 2:
      continue
    calm, wild = sorted(summary, key=lambda n: summary[n][0][0])
    stat = mean_ci(per_seed(sagc[calm], sagc[wild], "mean_g", operator.sub))
    described = "; ".join(f"{n}: {summary[n][0][0]:.3f}, G {summary[n][1][0]:.2f}"
                          for n in (calm, wild))
    lines.append(f"| {algorithm} | {described} | {stat[0]:+.2f} ± {stat[1]:.2f} | "
                 f"{_verdict(stat, 'above', 0.0)} |")
  return "\n".join(lines)
