"""Which G trains best per hour on a pod: a projection, labelled as one.

Why: calibrate's answer to "which static G gathers the most learning per hour" on the
committed SmolLM2 traces rests, under ``--cost cpu``, on this CPU's cost, where a
G = 16 step costs about 3.5x a G = 4 step at a fixed number of prompts: the CPU pays
per row still decoding (``slot_s``), and G = 16 decodes 4x the rows (x3.46 at 128
prompts a step on the after-RL trace's fit). On a TPU pod decode is memory-bandwidth
bound: a decode step reads the weights and each lane's keys once for all the rows in
the refill slots, so the price is set by tokens over slots, the longest row and the
learner's tokens, not by rows alone. The cost structure differs, so the CPU's order of
the sizes need not hold there.

This module replays the two committed SmolLM2 traces (before and after RL) under
three pods' compiled step costs (``configs/aot/``: AOT rooflines, no TPU run) and the
two ways of changing G (``hold_rollouts:512``: 512 rows a step, P = 512 / G;
``hold_prompts:128``: 128 prompts a step, 128 G rows), with calibrate's own report
(``experiments.calibration.calibration_report``, built as ``python -m sagc_jax.calibrate
--trace T --cost aot:R --budget B`` builds it). It writes each report to
``OUT/<trace>_<cost>_<mode>/report.json`` (skipping one that exists, so a rerun
resumes) and ``OUT/projection.md``: per combination, a G = 16 step's rollout and
learner seconds against a G = 4 step's, and the static sizes' order under every
learning measure. Everything here is priced, not measured: the traces are a 135M
model's lengths scaled to the presets' 16k cap, and under ``hold_prompts:128`` a
G = 16 step trains 2048 rows, 4x the batch the presets were compiled for, priced
linearly in its tokens.

``python -m sagc_jax.experiments.pod_projection --out docs/data/pod_projection``
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any, Callable

from sagc_jax.config import controller_settings
from sagc_jax.experiments.calibration import calibration_report
from sagc_jax.experiments.signals import chosen, validated_measures
from sagc_jax.replay.costs import budgeted_settings, cost_from_flag
from sagc_jax.replay.trace import read_trace
from sagc_jax.runtime.storage import read_json

__all__ = ["BUDGETS", "COSTS", "TRACES", "budget_label", "combinations", "folder_name", "main",
           "project", "projection_markdown", "with_learner_seconds"]

REPO = Path(__file__).resolve().parents[2]
TRACES = ("configs/traces/smollm2_word_problems_before_rl.jsonl",
          "configs/traces/smollm2_word_problems_after_rl.jsonl")
COSTS = ("configs/aot/llama3_2_3b_16k_v5e_4x4.json", "configs/aot/llama3_2_3b_16k_v6e_4x4.json",
         "configs/aot/qwen3_8b_16k_v6e_4x4.json")
BUDGETS = ("hold_rollouts:512", "hold_prompts:128")
SIGNAL_CHECKS = REPO / "configs" / "signal_checks.json"   # calibrate's --signal_checks default
# The parts of calibrate's report the table does not read and that are large.
DROPPED = ("tau_curve", "pass_rates")


def combinations() -> list[tuple[str, str, str]]:
  """(trace, cost, budget) of every report, in the order they are made (the table sorts
  them by folder name)."""
  return list(itertools.product(TRACES, COSTS, BUDGETS))


def folder_name(trace: str, cost: str, budget: str) -> str:
  """``<trace>_<cost>_<mode>``: the combination's folder under ``--out``."""
  return f"{Path(trace).stem}_{Path(cost).stem}_{budget.partition(':')[0]}"


def project(trace_path: str, cost_path: str, budget: str, *, log: Callable[[str], None] = print,
            **replay: int) -> dict[str, Any]:
  """Calibrate's report of one combination (``replay``: ``replicates``/``steps`` when not
  calibration_report's defaults), without ``DROPPED``, with ``projection``: what was
  run and how long it took."""
  start = time.time()
  trace = read_trace(REPO / trace_path)
  cost = cost_from_flag(f"aot:{REPO / cost_path}", trace)
  settings = budgeted_settings(cost, trace, budget)
  checks = read_json(SIGNAL_CHECKS) if SIGNAL_CHECKS.is_file() else {}
  report = calibration_report(trace, cost, controller_settings(trace.header["controller"]),
                              validated=validated_measures(checks), log=log, **replay,
                              **settings)
  report = with_learner_seconds({k: v for k, v in report.items() if k not in DROPPED})
  report["projection"] = {"trace": trace_path, "cost": cost_path, "budget": budget,
                          "seconds": round(time.time() - start, 1)}
  return report


def _rollout_learner(arm: dict[str, Any], steps: int) -> tuple[float, float]:
  """Rollout and learner seconds per step of a replayed arm. The arm summary keeps the
  mean step seconds and the total rollout seconds over the replay's steps; a priced
  step is rollout plus learner, so the learner's seconds are the difference."""
  rollout = arm["rollout_s"] / steps
  return rollout, arm["step_s"] - rollout


def _per_step(report: dict[str, Any], g: int) -> tuple[float, float]:
  """``_rollout_learner`` of the static-G arm."""
  return _rollout_learner(report["replay"]["arms"][f"static_G{g}"], report["replay"]["steps"])


def with_learner_seconds(report: dict[str, Any]) -> dict[str, Any]:
  """``report`` with every replayed arm's mean rollout and learner seconds per step
  (``rollout_s_per_step``, ``learner_s_per_step``: ``_rollout_learner``)."""
  for arm in report["replay"]["arms"].values():
    arm["rollout_s_per_step"], arm["learner_s_per_step"] = _rollout_learner(
        arm, report["replay"]["steps"])
  return report


def _static_order(report: dict[str, Any], measure: str) -> str:
  """The static sizes best first under ``measure``: ``>`` between two whose 95%
  intervals over replicates are apart, ``≈`` where they overlap (not resolved)."""
  entry = report["signals"].get(measure)
  if entry is None:
    return "–"
  arms = [a for a in entry["ranking"] if a.startswith("static_G")]
  order = arms[0].removeprefix("static_G")
  for better, worse in zip(arms, arms[1:]):
    b, w = entry["arms"][better], entry["arms"][worse]
    apart = b["mean"] - b["half_width"] > w["mean"] + w["half_width"]
    order += (" > " if apart else " ≈ ") + worse.removeprefix("static_G")
  return order


def projection_markdown(out_dir: str | Path) -> str:
  """The projection table, rebuilt from the ``*/report.json`` files under ``out_dir``."""
  paths = sorted(Path(out_dir).glob("*/report.json"))
  if not paths:
    raise ValueError(f"{out_dir} holds no */report.json: run python -m "
                     "sagc_jax.experiments.pod_projection --out DIR first")
  reports = [read_json(p) for p in paths]
  measures = chosen([])
  lines = ["| trace | cost | mode | rollout s / step, G4 / G16 (G16 / G4) | learner s / step, "
           "G4 / G16 (G16 / G4) | " + " | ".join(f"static G order by {m}" for m in measures)
           + " |", "|---|---|---|---|---|" + "---|" * len(measures)]
  for report in reports:
    what = report["projection"]
    cells = [Path(what["trace"]).stem, Path(what["cost"]).stem,
             f"{report['rollout']['mode']} ({budget_label(report['rollout'])})"]
    for part in (0, 1):
      g4, g16 = _per_step(report, 4)[part], _per_step(report, 16)[part]
      cells.append(f"{g4:.1f} / {g16:.1f} (x{g16 / g4:.2f})")
    cells += [_static_order(report, m) for m in measures]
    lines.append("| " + " | ".join(cells) + " |")
  settings = sorted({(r["replay"]["replicates"], r["replay"]["steps"], r["algorithm"])
                     for r in reports})
  validated = sorted({m for r in reports for m in r.get("validated", [])})
  seconds = [r["projection"]["seconds"] for r in reports if "seconds" in r["projection"]]
  took = f" A report took {min(seconds):.0f}-{max(seconds):.0f} s to make." if seconds else ""
  return "\n".join([
      "Projection, not measurement: calibrate's replay of recorded SmolLM2-135M rollouts "
      "(lengths scaled to each preset's cap) priced by the presets' compiled programs "
      "(AOT rooflines on a CPU host, no TPU run).", "",
      *lines, "",
      "- Replay settings (replicates, steps, algorithm): "
      + "; ".join(f"{r} x {s}, {a}" for r, s, a in settings) + ". Each static G order is the "
      "arms' means of the measure per hour of priced time, best first (intervals in each "
      "report.json's `signals`); ≈: the two sizes' intervals (mean ± 95% half-width over "
      f"replicates, unpaired) overlap, so that step of the order is not resolved.{took}",
      "- Learner seconds per step are derived: step seconds minus rollout seconds per step "
      "(the replay's arm summary keeps those two; a priced step is rollout + learner).",
      "- Measures validated against measured learning when the reports were made "
      f"(configs/signal_checks.json): {', '.join(validated) or 'none'}."]) + "\n"


def budget_label(rollout: dict[str, Any]) -> str:
  """The budget's size in words: '128 prompts' or '512 rows' (a step's)."""
  if rollout["mode"] == "hold_prompts":
    return f"{rollout['prompts_per_step']} prompts"
  return f"{rollout['rollouts_per_step']} rows"


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="folder of the reports and projection.md")
  parser.add_argument("--replicates", type=int, help="default: calibration_report's")
  parser.add_argument("--steps", type=int, help="default: calibration_report's")
  args = parser.parse_args(argv)
  replay = {k: v for k, v in (("replicates", args.replicates), ("steps", args.steps)) if v}
  out = Path(args.out)
  todo = combinations()
  for k, (trace, cost, budget) in enumerate(todo, 1):
    target = out / folder_name(trace, cost, budget) / "report.json"
    label = f"[{k}/{len(todo)}] {Path(trace).stem} x {Path(cost).stem} x {budget}"
    if target.is_file():
      print(f"{label}: {target} exists, skipped", flush=True)
      continue
    print(f"{label}: replaying", flush=True)
    report = project(trace, cost, budget, log=lambda m: print(f"  {m}", flush=True), **replay)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{label}: wrote {target} ({report['projection']['seconds']} s)", flush=True)
  (out / "projection.md").write_text(projection_markdown(out))
  print(projection_markdown(out))
  print(f"wrote {out / 'projection.md'}")


if __name__ == "__main__":
  main()
