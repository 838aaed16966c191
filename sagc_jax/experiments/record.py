"""A comparison's record, ``<workdir>/compare.json``: the settings its report reads (the
budget, evaluation points, targets, equivalence margin, priced clock) and, per run, its
place in the run order, its start and end times and the machine's 1-minute load
average at both.

Why a record: the report is rebuilt from the runs (``--merge_only``) long after they
ran, on another machine perhaps, and must read the settings they ran under. So the
record is written once, before the first run, and a later command with other settings
is refused, naming each one, instead of overwriting it: an overwritten budget would
make every finished run read as "no evaluation". Why times and load: the arms of a
seed run one after another on one machine whose speed drifts, so the order is random
(``arms.run_configs``) and the record lets a reader check the load each run met.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from sagc_jax.config.compare import CompareSection
from sagc_jax.runtime.storage import read_json

__all__ = ["RECORD", "load_record", "open_record", "order_markdown", "record_run",
           "record_settings"]

RECORD = "compare.json"
# Settings a record keeps; a later command must give the same ones (seeds may grow:
# more seeds extend a comparison and lose nothing).
_FIXED = ("time_budget_s", "eval_points", "targets", "equivalence_margin", "priced_cost")


def record_settings(compare: CompareSection) -> dict[str, Any]:
  """The settings of ``compare`` that its record keeps."""
  return {"seeds": compare.seeds, "time_budget_s": compare.time_budget_s,
          "eval_points": compare.eval_points, "targets": list(compare.targets),
          "equivalence_margin": compare.equivalence_margin,
          "priced_cost": compare.priced_cost}


def load_record(workdir: Path) -> dict[str, Any]:
  """The record of ``workdir`` ({} when there is none); a damaged one is named."""
  path = Path(workdir) / RECORD
  if not path.exists():
    return {}
  record = read_json(path)
  if not isinstance(record, dict):
    raise ValueError(f"{path}: not a comparison record (a JSON object)")
  return record


def _conflicts(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  """Each fixed setting the old record holds with another value than ``new``."""
  return [f"{key}: recorded {old[key]!r}, now {new[key]!r}" for key in _FIXED
          if key in old and old[key] != new[key]]


def open_record(workdir: Path, settings: dict[str, Any], machine: dict[str, Any]) -> None:
  """Writes the record of a new comparison, or checks an existing one against
  ``settings``: a difference is refused (ValueError naming every setting), never
  overwritten. Settings the old record lacks (it predates them) are added."""
  workdir = Path(workdir)
  old = load_record(workdir)
  conflicts = _conflicts(old, settings)
  if conflicts:
    raise ValueError(f"{workdir / RECORD} was written with other settings ("
                     + "; ".join(conflicts) + "); use a new --workdir, or the recorded "
                     "settings (--merge_only rebuilds the report from the record)")
  record = {**settings, **{k: v for k, v in old.items() if k != "seeds"}, "seeds":
            max(int(settings["seeds"]), int(old.get("seeds", 0)))}
  record.setdefault("machine", machine)
  workdir.mkdir(parents=True, exist_ok=True)   # only now: a refusal leaves no folder
  _write(workdir, record)


def record_run(workdir: Path, name: str, order: int, started: float, load_start: float
               ) -> None:
  """Adds a stretch of run ``name`` (a resumed run has several) to the record: its
  place in this command's order, start and end times (Unix seconds) and the 1-minute
  load average at both (the end: now)."""
  record = load_record(workdir)
  record.setdefault("runs", {}).setdefault(name, []).append({
      "order": order, "started": round(started, 3), "ended": round(time.time(), 3),
      "load_start": load_start, "load_end": os.getloadavg()[0]})
  _write(workdir, record)


def _write(workdir: Path, record: dict[str, Any]) -> None:
  path = workdir / RECORD
  partial = path.with_name(f".{RECORD}.{os.getpid()}.partial")   # one per writer
  partial.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n", encoding="utf-8")
  os.replace(partial, path)            # a reader never sees half a record


def order_markdown(record: dict[str, Any]) -> str:
  """One line on the recorded runs: their order and the load they met ('' without)."""
  runs = record.get("runs") or {}
  stretches = [s for name in runs for s in runs[name]]
  if not stretches:
    return ""
  loads = [s[k] for s in stretches for k in ("load_start", "load_end")]
  order = ", ".join(sorted(runs, key=lambda name: min(s["started"] for s in runs[name])))
  return (f"Runs in the order they started (random within each seed): {order}. 1-minute "
          f"load average at their starts and ends: {min(loads):.2f}-{max(loads):.2f}.")
