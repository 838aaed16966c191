"""A primary arm's goal, fixed before its comparison ran, checked on the comparison's
``per_hour.json`` (``python -m sagc_jax.experiments.goal --workdir RUNS --primary
signal_rate --family static4,static8,static16 --also sagc``).

Why a module. A comparison's per-hour report Holm-corrects over every pair of its arms.
A goal stated before the runs names a smaller family (the new arm against each static G)
and its own rule, and is checked on those pairs alone, once, per algorithm and on both
clocks (wall and priced):

* **not worse** than the best of the family (the highest mean held-out accuracy over
  [0, H]): the two-sided 95% interval of the paired difference has its lower end at or
  above ``-margin``;
* **better than every member**: each paired difference positive and significant after
  Holm's correction over the family;
* **beats** each arm of ``--also``: the paired difference positive and significant
  (one test each).

The differences, intervals and p-values are the per-hour report's
(``experiments.per_hour``, ``base.stats.paired_test``); only the family's Holm
correction is applied here (``base.stats.holm``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from sagc_jax.base.stats import ALPHA, holm

__all__ = ["check_goal", "goal_markdown", "load_per_hour"]


def _difference(pairs: Sequence[dict[str, Any]], first: str, second: str) -> dict[str, float]:
  """``first - second`` on the mean held-out accuracy over [0, H], from whichever order
  the report holds the pair in."""
  for pair in pairs:
    if (pair["first"], pair["second"]) in ((first, second), (second, first)):
      m = pair["mean_accuracy_over_h"]
      sign = 1.0 if pair["first"] == first else -1.0
      return {"mean": sign * m["mean"], "half_width": m["half_width"], "n": m["n"],
              "p": m["p"]}
  raise ValueError(f"per_hour.json has no pair of {first} and {second}")


def check_goal(per_hour: dict[str, Any], *, primary: str, family: Sequence[str],
               also: Sequence[str] = (), margin: float = 0.03) -> dict[str, Any]:
  """Per clock (``wall``, ``priced``) and algorithm: the family's differences with
  their Holm p, the best member, and the three verdicts (module docstring)."""
  out = {}
  for clock, report in (("wall", per_hour), ("priced", per_hour.get("priced") or {})):
    for algorithm, entry in (report.get("pairs") or {}).items():
      arm = lambda name: f"{algorithm}_{name}"
      means = {a["arm"]: a["mean_accuracy_over_h"][0] for a in report["arms"]
               if a["algorithm"] == algorithm}
      rows = {name: _difference(entry["pairs"], arm(primary), arm(name)) for name in family}
      for row, p in zip(rows.values(), holm([r["p"] for r in rows.values()])):
        row["p_holm"] = p
      best = max(family, key=lambda name: means[arm(name)])
      others = {name: _difference(entry["pairs"], arm(primary), arm(name)) for name in also}
      out.setdefault(clock, {})[algorithm] = {
          "family": rows, "also": others, "best": best,
          "not_worse": rows[best]["mean"] - rows[best]["half_width"] >= -margin,
          "better_than_every": all(r["mean"] > 0 and r["p_holm"] < ALPHA
                                   for r in rows.values()),
          "beats": {name: r["mean"] > 0 and r["p"] < ALPHA for name, r in others.items()}}
  return {"primary": primary, "family": list(family), "also": list(also), "margin": margin,
          "clocks": out}


def goal_markdown(result: dict[str, Any]) -> str:
  """The check as a table per clock: one row per algorithm and arm."""
  yes = lambda v: "yes" if v else "no"
  lines = []
  for clock, algorithms in result["clocks"].items():
    lines += ["", f"{clock} clock: {result['primary']} - arm, mean held-out accuracy over "
              f"[0, H] (95% CI), p Holm-adjusted over the family", "",
              "| algorithm | arm | difference | p | p (Holm) |", "|---|---|---|---|---|"]
    for algorithm, entry in algorithms.items():
      for name, r in {**entry["family"], **entry["also"]}.items():
        holm_p = f"{r['p_holm']:.3g}" if "p_holm" in r else "–"
        lines.append(f"| {algorithm} | {name} | {r['mean']:+.3f} ± {r['half_width']:.3f} | "
                     f"{r['p']:.3g} | {holm_p} |")
    head = ["algorithm", "best of the family", f"not worse (lower end >= -{result['margin']:g})",
            "better than every member (Holm)", *(f"beats {a}" for a in result["also"])]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for algorithm, entry in algorithms.items():
      cells = [algorithm, entry["best"], yes(entry["not_worse"]),
               yes(entry["better_than_every"]), *(yes(entry["beats"][a]) for a in result["also"])]
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines).strip() + "\n"


def load_per_hour(workdir: str | Path) -> dict[str, Any]:
  """A finished comparison's ``per_hour.json``; a missing one is named."""
  path = Path(workdir) / "per_hour.json"
  if not path.exists():
    raise SystemExit(f"error: {path} does not exist: run python -m sagc_jax.compare first")
  return json.loads(path.read_text())


def main(argv: Sequence[str] | None = None) -> None:
  import argparse

  # The library's functions by import: ``python -m`` runs this file as a second module.
  from sagc_jax.experiments.goal import check_goal, goal_markdown, load_per_hour

  parser = argparse.ArgumentParser(description="A primary arm's goal checked on a "
                                   "comparison's per_hour.json (module docstring).")
  parser.add_argument("--workdir", required=True, help="the comparison's folder")
  parser.add_argument("--primary", required=True, help="the arm, without the algorithm")
  parser.add_argument("--family", required=True, help="comma-separated arms (Holm family)")
  parser.add_argument("--also", default="", help="comma-separated arms it must beat")
  parser.add_argument("--margin", type=float, default=0.03)
  args = parser.parse_args(argv)
  result = check_goal(load_per_hour(args.workdir), primary=args.primary,
                      family=[a for a in args.family.split(",") if a],
                      also=[a for a in args.also.split(",") if a], margin=args.margin)
  (Path(args.workdir) / "goal.json").write_text(json.dumps(result, indent=1))
  print(goal_markdown(result), end="")


if __name__ == "__main__":
  main()
