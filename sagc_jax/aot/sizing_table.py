"""The sizing table a user reads before renting a slice, rendered from stored reports.

``python -m sagc_jax.aot.sizing_table configs/aot`` prints one Markdown row per report
(``python -m sagc_jax.aot ... --out configs/aot/<config>_<topology>.json``): model,
response cap and topology; whether every executable fits (the largest peak per chip
against HBM); the projected RL step at the cap, split into rollout and learner; the
rollout at natural lengths; and hours for 1,000 steps at the cap. Every figure comes
from a compile, so the table in docs/scale.md is this module's output of the committed
reports (``tests/test_aot_stored_reports.py`` checks that it is).

Imports no JAX.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sagc_jax.aot.report_key import REPO_ROOT
from sagc_jax.runtime.storage import read_json

__all__ = ["command", "row", "table"]

HEADER = ("| model | responses | topology | fits: largest peak / HBM (GiB per chip) | "
          "projected step at the cap: rollout + learner (s) | rollout at natural lengths (s) "
          "| hours per 1,000 steps at the cap | command |\n"
          "|---|---|---|---|---|---|---|---|")


def command(report: dict) -> str:
  """The command that compiled ``report``."""
  parts = ["python -m sagc_jax.aot", f"--config {report['config']}",
           f"--topology {report['topology']}"]
  parts += ["--largest_only"] if report["largest_only"] else []
  parts += [f"--only {report['only']}"] if report.get("only") else []
  return " ".join(parts + list(report.get("overrides", [])))


def row(report: dict) -> str:
  """One Markdown row of a report (a report without a step projection shows '-')."""
  compiled = [e for e in report["executables"] if not e.get("probe")]
  failed = [e["name"] for e in compiled if e["peak_gib"] is None]
  peak = max((e["peak_gib"] for e in compiled if e["peak_gib"] is not None), default=None)
  fits = ("yes" if report["fits"] else "**no**") + (
      f": {peak:.2f} / {report['chip']['hbm_gib']:g}" if peak is not None else "")
  fits += f" ({len(failed)} failed)" if failed else ""
  step = report.get("projected_step_s")
  if step is None:
    split = natural = hours = "-"
  else:
    split = (f"{step:.0f}: {report['projected_rollout_s']:.0f} + "
             f"{report['projected_learner_s']:.0f}")
    hours = f"{step * 1000 / 3600:.0f}"
    models = (report.get("refill") or {}).get("by_length_model", {})
    natural = (f"{models['smollm2_natural']['seconds']:.0f}" if "smollm2_natural" in models
               else "-")
  return (f"| {Path(report['model_config']).stem} | {report['rollout']['max_new_tokens']:,} | "
          f"{report['topology']} | {fits} | {split} | {natural} | {hours} | "
          f"`{command(report)}` |")


def table(folder: str | Path) -> str:
  """The table of every report in ``folder``, largest model and response cap first."""
  reports = [read_json(p) for p in sorted(Path(folder).glob("*.json"))]
  if not reports:
    raise ValueError(f"{folder}: no stored reports (*.json)")
  reports.sort(key=lambda r: (-r["num_layers"] * _width(r), -r["rollout"]["max_new_tokens"],
                              r["topology"], r["config"]))
  return "\n".join([HEADER, *(row(r) for r in reports)])


def _width(report: dict) -> int:
  """The model's residual width from its config.json (with the layer count, it orders
  the rows by model size); 0 when the file is not here."""
  path = Path(report["model_config"])
  path = path if path.is_absolute() else REPO_ROOT / path
  return read_json(path).get("hidden_size", 0) if path.is_file() else 0


if __name__ == "__main__":
  print(table(sys.argv[1] if len(sys.argv) > 1 else "configs/aot"))
