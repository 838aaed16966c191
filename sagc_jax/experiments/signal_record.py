"""The learning measures' record, ``configs/signal_checks.json``: per workload-mode, the
replay's predicted order of every pair of arms, when it was made and for which
comparison config, and the check of those predictions against the comparison.

Why a record of the predictions themselves: a check made after the learning is
known can be fitted to it (a cost model retuned, a measure redefined), so the record
keeps the predictions as committed and the check reads them, not a fresh replay. The
check then says whether they came before the comparison's first run, from the start
times its ``compare.json`` records (``experiments.record``), and whether they were made
for the config the comparison ran (its digest, ``config.config_digest``).

Commands::

  python -m sagc_jax.experiments.signal_record predict --name NAME --replay D/replay.json \\
      --config configs/compare_X.py --comparison "..." --replay_command "..." --traces "..."
  python -m sagc_jax.experiments.signal_record check --name NAME --workdir runs/compare_X
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any, Sequence

from sagc_jax.experiments.record import load_record
from sagc_jax.experiments.signals import (check_learning, learning_markdown, read_per_hour,
                                          validated_measures)
from sagc_jax.runtime.storage import read_json

__all__ = ["CHECKS", "add_predictions", "check_workload", "prediction_timing",
           "predictions_markdown"]

CHECKS = Path(__file__).resolve().parents[2] / "configs" / "signal_checks.json"


def _iso(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(
      timespec="seconds")


def add_predictions(checks: dict[str, Any], name: str, replay_output: dict[str, Any], *,
                    config_digest: str, now: float, **provenance: str) -> dict[str, Any]:
  """``checks`` with workload-mode ``name`` holding the predictions of a ``simulate
  --trace`` output (the first tau of each algorithm), the time
  ``now`` (Unix seconds) and the comparison config's digest (``replay_output``: the
  replay's JSON; ``provenance``: the commands, as strings). A workload-mode that
  already holds predictions is refused: predictions are made once, before learning."""
  old = checks.get("workloads", {}).get(name, {})
  if "predictions" in old:
    raise ValueError(f"workload {name!r} already holds predictions (made "
                     f"{old.get('predicted_at', 'at an unrecorded time')}); a new prediction "
                     "needs a new name")
  found = replay_output.get("predictions")
  if not isinstance(found, dict) or not found:
    raise ValueError("the replay output holds no predictions (simulate --trace with "
                     "--horizon_s writes them)")
  predicted: dict[str, Any] = {}
  for label, by_measure in found.items():      # "grpo tau 1.8": the first tau wins
    predicted.setdefault(label.split()[0], by_measure)
  entry = {**provenance, "config_digest": config_digest, "predicted_at": _iso(now),
           "predictions": predicted}
  return {**checks, "workloads": {**checks.get("workloads", {}), name: entry}}


def prediction_timing(entry: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
  """Whether a workload-mode's predictions (``entry``) came before the first run of
  the comparison whose record (``compare.json``) is ``record`` started, and whether
  they were made for the config it ran."""
  starts = [s["started"] for stretches in (record.get("runs") or {}).values()
            for s in stretches]
  if not starts:
    raise ValueError("the comparison's compare.json records no run start time, so it cannot "
                     "say whether the predictions came first")
  predicted = datetime.datetime.fromisoformat(entry["predicted_at"]).timestamp()
  first = min(starts)
  return {"predicted_at": entry["predicted_at"], "first_run_started": _iso(first),
          "predicted_before_learning": predicted < first,
          "config_matches": entry.get("config_digest") == record.get("config_digest")}


def check_workload(checks: dict[str, Any], name: str, workdir: Path) -> dict[str, Any]:
  """``checks`` with workload-mode ``name``'s committed predictions checked against the
  comparison in ``workdir`` (its ``per_hour.json`` and ``compare.json``): on the
  wall-clock (``checked``, what ``validated_measures`` reads) and on the priced clock
  (``checked_priced_clock``, beside it)."""
  entry = checks.get("workloads", {}).get(name)
  if not entry or "predictions" not in entry:
    raise ValueError(f"workload {name!r} holds no predictions to check (predict first)")
  per_hour = read_per_hour(Path(workdir) / "per_hour.json")
  timing = prediction_timing(entry, load_record(Path(workdir)))
  checked = check_learning(entry["predictions"], per_hour)
  entry = {**entry, **timing, "checked": checked}
  if per_hour.get("priced"):           # the same check on the priced clock, for reading
    entry["checked_priced_clock"] = check_learning(entry["predictions"], per_hour["priced"])
  return {**checks, "workloads": {**checks["workloads"], name: entry}}


def predictions_markdown(entry: dict[str, Any]) -> str:
  """A workload-mode's committed predictions: per algorithm and measure, the arms in
  the order the pairs put them (``a > b``: a gathers more of the measure within H)."""
  lines = ["| algorithm | measure | predicted order of every pair |", "|---|---|---|"]
  for algorithm, by_measure in entry["predictions"].items():
    for measure, pairs in by_measure.items():
      cells = [f"{p['first']} {p['order']} {p['second']}" for p in pairs]
      lines.append(f"| {algorithm} | {measure} | {'; '.join(cells)} |")
  return "\n".join(lines)


def _write(path: Path, checks: dict[str, Any]) -> None:
  path.write_text(json.dumps(checks, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("action", choices=("predict", "check"))
  parser.add_argument("--name", required=True, help="the workload-mode's name")
  parser.add_argument("--checks", default=str(CHECKS))
  parser.add_argument("--replay", help="predict: a simulate --trace --horizon_s output JSON")
  parser.add_argument("--config", help="predict: the comparison config file")
  parser.add_argument("--comparison", default="", help="predict: the comparison's command")
  parser.add_argument("--replay_command", default="", help="predict: the replay's command")
  parser.add_argument("--traces", default="", help="predict: how the traces were made")
  parser.add_argument("--workdir", help="check: the finished comparison's folder")
  args = parser.parse_args(argv)
  path = Path(args.checks)
  checks = read_json(path) if path.exists() else {"workloads": {}}
  if args.action == "predict":
    if not args.replay or not args.config:
      parser.error("predict needs --replay and --config")
    import runpy
    import time
    from sagc_jax.config import config_digest
    file, _, argument = args.config.partition(":")     # FILE.py[:ARG], as --config takes
    get_config = runpy.run_path(file)["get_config"]
    config = get_config(argument) if argument else get_config()
    checks = add_predictions(checks, args.name, read_json(Path(args.replay)),
                             config_digest=config_digest(config), now=time.time(),
                             comparison=args.comparison, replay=args.replay_command,
                             traces=args.traces)
    _write(path, checks)
    print(predictions_markdown(checks["workloads"][args.name]))
    print(f"wrote the predictions of {args.name} to {path} at "
          f"{checks['workloads'][args.name]['predicted_at']}")
    return
  if not args.workdir:
    parser.error("check needs --workdir")
  checks = check_workload(checks, args.name, Path(args.workdir))
  _write(path, checks)
  entry = checks["workloads"][args.name]
  print(f"{args.name}: predictions made {entry['predicted_at']}, first run started "
        f"{entry['first_run_started']}: "
        + ("before" if entry["predicted_before_learning"] else "AFTER the learning began")
        + ("" if entry["config_matches"] else "; the comparison ran another config"))
  print(learning_markdown(entry["checked"]))
  if "checked_priced_clock" in entry:
    print("on the priced clock:")
    print(learning_markdown(entry["checked_priced_clock"]))
  print(f"validated measures now: {', '.join(validated_measures(checks)) or 'none'}")


if __name__ == "__main__":
  main()
