"""The replay's learning measures (``replay.engine.MEASURES``) as rankings of arms, as
predicted orders of pairs of arms, and checked against measured learning.

The replay cannot train a model: it ranks arms by how much of a learning measure
each gathers per unit of priced time (or within a horizon H of priced time, as a
comparison under ``compare.time_budget_s`` gives every arm). Which measure tracks
learning is an empirical question, so every table shows the ranking under each
measure, and when the measures disagree on the best arm it says that the replay
cannot rank the arms.

A measure predicts, for a pair of arms, the sign of the replicate-paired difference
of the measure at H (first minus second). ``check_learning`` compares those signs with
the pairs that a finished comparison (``per_hour.json``, ``experiments.per_hour``)
resolved on mean held-out accuracy over [0, H] (Holm-significant): a measure passes a
workload when it agrees on every resolved pair and at least ``MIN_RESOLVED`` pairs are
resolved; with fewer the workload cannot test it.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Sequence

from sagc_jax.replay.engine import MEASURES
from sagc_jax.base.stats import by_arm, mean_ci, per_seed
from sagc_jax.runtime.storage import read_json

__all__ = ["MIN_RESOLVED", "agree", "check_learning", "chosen", "learning_markdown",
           "measure_values", "predictions", "ranking_markdown", "read_per_hour", "signals",
           "validated_measures", "workload_verdict"]

MIN_RESOLVED = 3
# The summary key of each measure's total over a run.
_TOTALS = {"utility": "signal", "informative_groups": "informative_groups",
           "informative_rows": "informative_rows", "advantage_mass": "advantage_mass"}


def measure_values(summary: dict[str, float]) -> dict[str, float]:
  """A replayed arm's value of every measure: per hour of priced time, and at the
  horizon when the replay had one."""
  hours = summary["wall_clock_s"] / 3600.0
  out = {}
  for measure in MEASURES:
    if _TOTALS[measure] in summary:
      out[f"{measure}_per_h"] = summary[_TOTALS[measure]] / hours
    if f"{measure}_at_h" in summary:
      out[f"{measure}_at_h"] = summary[f"{measure}_at_h"]
  return out


def _keys(rows: Sequence[dict[str, Any]], measures: Sequence[str]) -> dict[str, str]:
  """Per measure of ``measures`` the rows carry, the value it ranks by: at the horizon
  when the rows have it, else per hour."""
  return {m: f"{m}_at_h" if f"{m}_at_h" in rows[0] else f"{m}_per_h"
          for m in measures if f"{m}_per_h" in rows[0]}


def chosen(names: Sequence[str] | None) -> tuple[str, ...]:
  """The measures a ``--signal`` list names (None or empty: every one); an unknown name
  is an error that lists them."""
  unknown = sorted(set(names or ()) - set(MEASURES))
  if unknown:
    raise ValueError(f"--signal={','.join(names)}: {unknown[0]!r} is not a learning measure "
                     f"(one of {', '.join(MEASURES)})")
  return tuple(names) if names else tuple(MEASURES)


def signals(rows: Sequence[dict[str, Any]], measures: Sequence[str] = tuple(MEASURES)
            ) -> dict[str, dict[str, Any]]:
  """Per measure of ``measures``: per arm the mean, 95% half-width and count over
  replicates of its value (``by``: at the horizon or per hour), and the arms best
  first."""
  out = {}
  arms = list(dict.fromkeys(r["arm"] for r in rows))
  for measure, key in _keys(rows, measures).items():
    stats = {arm: mean_ci([r[key] for r in rows if r["arm"] == arm]) for arm in arms}
    # An arm with no value (the step cap stopped it short of the horizon) ranks last.
    rank = lambda a: -stats[a][0] if math.isfinite(stats[a][0]) else math.inf
    out[measure] = {"by": key.removeprefix(f"{measure}_"),
                    "arms": {a: dict(zip(("mean", "half_width", "n"), s))
                             for a, s in stats.items()},
                    "ranking": sorted(arms, key=rank)}
  return out


def agree(found: dict[str, dict[str, Any]]) -> bool:
  """Whether every measure puts the same arm first."""
  return len({entry["ranking"][0] for entry in found.values()}) <= 1


def ranking_markdown(found: dict[str, dict[str, Any]]) -> str:
  """The arms' ranking under each measure, and whether the measures agree on the best
  arm (when they do not, the replay cannot rank the arms)."""
  lines = ["| measure | ranked by | arms, best first |", "|---|---|---|"]
  for measure, entry in found.items():
    by = "at the horizon" if entry["by"] == "at_h" else "per hour of priced time"
    lines.append(f"| {measure} | {by} | {' > '.join(entry['ranking'])} |")
  best = sorted({entry["ranking"][0] for entry in found.values()})
  if not agree(found):
    lines.append(f"\nThe measures disagree on the best arm ({', '.join(best)}): the replay "
                 "cannot rank the arms, so the tables above show rollout time and straggler "
                 "rates only.")
  elif best:
    lines.append(f"\nEvery measure puts {best[0]} first.")
  return "\n".join(lines)


def predictions(rows: Sequence[dict[str, Any]], measures: Sequence[str] = tuple(MEASURES)
                ) -> dict[str, list[dict[str, Any]]]:
  """Per measure of ``measures``, for every pair of the rows' arms (any controller kind,
  so that every pair a comparison resolves can be checked): the replicate-paired
  difference of the measure (first minus second) and the predicted order."""
  seeded = by_arm(rows)

  def pair(first: str, second: str, key: str) -> dict[str, Any]:
    mean, half, n = mean_ci(per_seed(seeded[first], seeded[second], key, operator.sub))
    return {"first": first, "second": second, "mean": mean, "half_width": half, "n": n,
            "order": ">" if mean > 0 else "<" if mean < 0 else "="}
  return {measure: [pair(first, second, key)
                    for first, second in itertools.combinations(sorted(seeded), 2)]
          for measure, key in _keys(rows, measures).items()}


def _replay_name(arm: str, algorithm: str) -> str:
  """A comparison's arm (``grpo_static4``, ``dapo_sagc``, ``grpo_mymod.MyKind``) as the
  replay names it (``static_G4``, ``sagc``, ``mymod.MyKind``: ``arm_name`` of the kind)."""
  kind = arm.removeprefix(f"{algorithm}_")
  g = kind.removeprefix("static")
  return f"static_G{g}" if kind.startswith("static") and g.isdigit() else kind


def read_per_hour(path: Any) -> dict[str, Any]:
  """A finished comparison's ``per_hour.json``, with the keys ``check_learning`` reads:
  another file (a hand-written one, another tool's JSON) is refused naming the file and
  the first missing key, before the replay's minutes of work, not as a ``KeyError``
  after them."""
  per_hour = read_json(path)

  def need(node: Any, key: str, where: str = "", kind: type = object) -> Any:
    if not isinstance(node, dict) or key not in node or not isinstance(node[key], kind):
      raise ValueError(f"{path} lacks the key {where + key!r}: not a comparison's per_hour.json "
                       "(python -m sagc_jax.compare writes one)")
    return node[key]

  for algorithm, entry in need(per_hour, "pairs", kind=dict).items():
    for i, pair in enumerate(need(entry, "pairs", f"pairs.{algorithm}.", list)):
      where = f"pairs.{algorithm}.pairs[{i}]."
      need(pair, "first", where)
      need(pair, "second", where)
      need(need(pair, "mean_accuracy_over_h", where), "mean", f"{where}mean_accuracy_over_h.")
  return per_hour


def check_learning(predicted: dict[str, dict[str, list[dict[str, Any]]]],
                   per_hour: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """Per measure and algorithm: the pairs the comparison resolved (Holm-significant on
  mean held-out accuracy over [0, H]) that the measure predicts, how many it orders the
  same way, every disagreement, the resolved pairs it has no prediction for (an arm
  the replay does not run, or one that never reached the horizon), and the verdict
  (module docstring). ``predicted``: algorithm -> ``predictions``."""
  out: dict[str, dict[str, Any]] = {}
  for algorithm, by_measure in predicted.items():
    resolved = [p for p in per_hour["pairs"].get(algorithm, {}).get("pairs", [])
                if p.get("significant")]
    for measure, pairs in by_measure.items():
      orders = {(p["first"], p["second"]): p["mean"] for p in pairs}
      agreeing, disagree, unpredicted = 0, [], []
      for pair in resolved:
        first, second = (_replay_name(pair[k], algorithm) for k in ("first", "second"))
        learned = pair["mean_accuracy_over_h"]["mean"]
        guess = orders.get((first, second), -orders.get((second, first), math.nan))
        if not math.isfinite(guess):
          unpredicted.append(f"{pair['first']} vs {pair['second']}")
        elif guess != 0 and (guess > 0) == (learned > 0):
          agreeing += 1
        else:
          disagree.append(f"{pair['first']} vs {pair['second']}: learning {learned:+.3f}, "
                          f"{measure} {guess:+.4g}")
      tested = len(resolved) - len(unpredicted)
      out.setdefault(measure, {})[algorithm] = {
          "resolved": tested, "agree": agreeing, "disagreements": disagree,
          "unpredicted": unpredicted,
          "verdict": "cannot test" if tested < MIN_RESOLVED else "fails" if disagree else "passes"}
  return out


def learning_markdown(checked: dict[str, dict[str, Any]]) -> str:
  """The validation table: measure x algorithm, pairs agreeing of pairs resolved, and
  every disagreement."""
  lines = ["| measure | algorithm | agree / resolved | verdict | disagreements | resolved, "
           "not predicted |", "|---|---|---|---|---|---|"]
  for measure, by_algorithm in checked.items():
    for algorithm, c in by_algorithm.items():
      lines.append(f"| {measure} | {algorithm} | {c['agree']} / {c['resolved']} | "
                   f"{c['verdict']} | {'; '.join(c['disagreements']) or '–'} | "
                   f"{'; '.join(c['unpredicted']) or '–'} |")
  return "\n".join(lines)


def workload_verdict(by_algorithm: dict[str, dict[str, Any]]) -> str:
  """A measure's verdict on one workload-mode from ``check_learning``'s per algorithm:
  fails where any algorithm fails, passes where none fails and one passes, else
  cannot test (too few resolved pairs to test it)."""
  verdicts = {c["verdict"] for c in by_algorithm.values()}
  return "fails" if "fails" in verdicts else "passes" if "passes" in verdicts \
      else "cannot test"


def validated_measures(checks: dict[str, Any], workloads: int = 2) -> list[str]:
  """The measures that pass every workload-mode of ``checks`` (``{"workloads": {name:
  {"checked": check_learning's result, ...}}}``) that tested them, and at least
  ``workloads`` of them: one failure anywhere (one algorithm of one workload-mode)
  and the measure is not validated. A workload-mode without a check yet (predictions
  only) or one too weak to test the measure neither passes nor fails it."""
  passed: dict[str, int] = {}
  failed: set[str] = set()
  for workload in checks.get("workloads", {}).values():
    for measure, by_algorithm in workload.get("checked", {}).items():
      verdict = workload_verdict(by_algorithm) if by_algorithm else "cannot test"
      if verdict == "fails":
        failed.add(measure)
      elif verdict == "passes":
        passed[measure] = passed.get(measure, 0) + 1
  return sorted(m for m, n in passed.items() if n >= workloads and m not in failed)
