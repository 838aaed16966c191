"""The per-hour analysis (``experiments.per_hour``) as markdown: per clock, the per-arm
table and the all-pairs table, then where the two clocks' ranks differ and the runs
without a value at H. The cells word each result by the rules of docs/claims.md
("The best model per hour"): verdicts, censored time ratios and their bounds.
"""

from __future__ import annotations

from typing import Any, Sequence

from sagc_jax.base.stats import format_ci
from sagc_jax.experiments.per_hour import arm_ranks

__all__ = ["clock_markdown", "per_hour_markdown"]


def _ci(stat: dict[str, Any] | tuple, fmt: str) -> str:
  if isinstance(stat, dict):
    stat = (stat["mean"], stat["half_width"], stat["n"])
  return format_ci(stat, fmt)


def _target_cell(entry: dict[str, Any]) -> str:
  reached, of = entry["reached"], entry["of"]
  if not reached:
    return f"0/{of} (> {min(entry['censored_at_s']):.1f} s)"
  cell = f"{reached}/{of}: {_ci(entry['time_s'], '.1f')} s"
  if entry["censored_at_s"]:
    cell += f"; others > {min(entry['censored_at_s']):.1f} s"
  return cell


def _ratio_cell(ratio: dict[str, Any]) -> str:
  """A geometric mean time ratio (first / second), its 95% interval, n, and its
  censoring: with only the second arm censored it is an upper bound, with only the
  first a lower bound, with both neither."""
  notes = [f"n {ratio['n']}"]
  first, second = ratio["censored_first"], ratio["censored_second"]
  if first or second:
    side = ("upper bound" if not first else "lower bound" if not second else "not a bound")
    notes.append(f"censored: first {first}, second {second}: {side}")
  notes += [f"{label} {ratio[key]}" for key, label in (("neither", "neither reached"),
                                                        ("at_start", "at t = 0"))
            if ratio.get(key)]
  if not ratio["n"]:
    return f"– ({'; '.join(notes[1:]) or 'n 0'})"
  interval = f" [{ratio['low']:.2f}, {ratio['high']:.2f}]" if ratio["n"] > 1 else ""
  return f"{ratio['ratio']:.2f}{interval} ({'; '.join(notes)})"


def _verdict_cell(pair: dict[str, Any]) -> str:
  verdict, eq = pair["verdict"], pair["equivalence"]
  if verdict in ("resolved", "borderline"):
    return verdict
  interval = (f"90% CI [{eq['low']:+.3f}, {eq['high']:+.3f}]" if eq["n"] >= 2
              else "no interval")
  return f"{verdict} within ±{eq['margin']:g}: {interval}" if verdict == "equivalent" else (
      f"{verdict}: {interval} vs ±{eq['margin']:g}")


def _row(cells: Sequence[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def clock_markdown(part: dict[str, Any], targets: Sequence[float]) -> list[str]:
  """The per-arm table and the all-pairs table of one clock's analysis."""
  head = (["arm", "seeds", "rank", "mean acc over [0, H]", "acc at H"]
          + [f"time to {t:g}" for t in targets])
  lines = [_row(head), "|" + "---|" * len(head)]
  ranks = arm_ranks(part)
  for arm in part["arms"]:
    rank = ranks[arm["arm"]]
    lines.append(_row([arm["arm"], str(arm["seeds"]), "–" if rank is None else str(rank),
                       _ci(arm["mean_accuracy_over_h"], ".3f"), _ci(arm["accuracy_at_h"], ".3f")]
                      + [_target_cell(arm["targets"][f"{t:g}"]) for t in targets]))
  head = (["pair", "mean acc over [0, H]", "p (Holm)", "verdict", "acc at H"]
          + [f"time to {t:g}, first / second" for t in targets])
  lines += ["", "Pairs, seed-paired (first - second); p Holm-adjusted over each algorithm's "
            "pairs on the mean over [0, H]; verdict: resolved (p < 0.01), borderline "
            "(0.01 <= p < 0.05), equivalent (two one-sided tests inside the margin, "
            "Holm-adjusted, at least 3 seeds) or not resolved; time ratios: geometric mean of "
            "the per-seed ratios [95% CI] over the n seeds where at least one arm reached the "
            "target by H, with how many of each arm's seeds did not (censored):\n", _row(head),
            "|" + "---|" * len(head)]
  for group in part["pairs"].values():
    for pair in group["pairs"]:
      lines.append(_row([f"{pair['first']} - {pair['second']}",
                         _ci(pair["mean_accuracy_over_h"], "+.3f"), f"{pair['p_holm']:.3g}",
                         _verdict_cell(pair), _ci(pair["accuracy_at_h"], "+.3f")]
                        + [_ratio_cell(pair["time_ratio"][f"{t:g}"]) for t in targets]))
  return lines


def per_hour_markdown(result: dict[str, Any]) -> str:
  """Both clocks' tables, where their ranks differ, and the runs without a value at H."""
  horizon, targets = result["horizon_s"], result["targets"]
  lines = [f"## The best model per hour\n\nHorizon H = {horizon:.1f} s of step time "
           f"({result['horizon_source']}). Held-out sampled accuracy against cumulative "
           "step time, linear between evaluations; mean ± 95% t-interval over seeds. "
           "Rank: 1 + the arms Holm-significantly better on the mean over [0, H].\n"]
  lines += clock_markdown(result, targets)
  priced = result.get("priced")
  if priced:
    price = priced["price"]
    lines += ["", f"### On the priced clock\n\nEach step priced from its logged work "
              f"(docs/claims.md): {price['step_s']:.3g} s per decode iteration, "
              f"{price['slot_s']:.3g} s per decode slot, {price['learner_step_s']:.3g} s "
              f"per learner call, {price['learner_token_s']:.3g} s per trained token "
              f"({price['source']}). H = {priced['horizon_s']:.1f} priced s "
              f"({priced['horizon_source']}).\n"]
    lines += clock_markdown(priced, targets)
    rank = lambda r: "–" if r is None else str(r)
    differ = priced["rank_differs"]
    lines.append("\nRanks that differ between the wall-clock and the priced clock: "
                 + ("; ".join(f"{arm} {rank(wall)} -> {rank(cost)}"
                              for arm, (wall, cost) in differ.items()) or "none") + ".")
  elif result.get("priced_error"):
    lines.append(f"\nNo priced clock: {result['priced_error']}.")
  if result.get("work"):
    lines += ["", "What a step bought and cost, per run up to its last evaluation (mean ± 95% "
              "t-interval over seeds):\n", _row(["arm", "informative groups / step",
                                                  "wall s / step", "priced s / step",
                                                  "informative groups / wall s",
                                                  "informative groups / priced s"]),
              "|---|---|---|---|---|---|"]
    for arm in result["work"]:
      lines.append(_row([arm["arm"]] + [_ci(arm[k], f) for k, f in (
          ("informative_per_step", ".2f"), ("wall_s_per_step", ".3f"),
          ("priced_s_per_step", ".3f"), ("informative_per_wall_s", ".2f"),
          ("informative_per_priced_s", ".2f"))]))
  if result.get("short"):
    lines.append("\nRuns without a value at H (their last evaluation came before it): "
                 + "; ".join(f"{name} ({why})" for name, why in result["short"].items()) + ".")
  return "\n".join(lines)
