"""``python -m sagc_jax.calibrate --config F --out D [--workdir RUN]``: which ``tau`` and
``delta`` suit this policy.

Samples ``--prompts`` x ``--responses`` responses of the configured policy (the newest
checkpoint of ``--workdir`` when given) with the run's own sampling settings into
``D/trace.jsonl`` (resumable), then writes ``D/report.json`` and ``D/report.png``:
length quantiles, the straggler probabilities per candidate G with intervals, how
they move with tau, and the recommended setting, judged by the projected time to a
fixed learning signal under the cost model (docs/calibrate.md states the rule). It
prints the ``--config.controller.*`` overrides. ``--trace T`` skips the sampling and
reports on an existing trace (no JAX needed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from sagc_jax.cli import checked_kinds, run_absl_tool

SIGNAL_CHECKS = Path(__file__).resolve().parents[1] / "configs" / "signal_checks.json"


def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "training config file (get_config()).",
                                  lock_config=True)
  flags.DEFINE_string("out", None, "Output directory (trace.jsonl, report.json, report.png).")
  flags.DEFINE_string("workdir", None, "Sample this run's newest checkpoint instead of the "
                      "config's starting policy.")
  flags.DEFINE_string("trace", None, "Report on this trace instead of sampling one.")
  flags.DEFINE_integer("prompts", 64, "Held-out prompts to sample.")
  flags.DEFINE_integer("responses", 32, "Responses per prompt (at least twice the largest "
                       "candidate G, so a replay resamples groups).")
  flags.DEFINE_string("cost", "cpu", "Cost model of the recommendation: 'cpu' (the trace's "
                      "measured decode cost; 'cpu:OTHER.jsonl': another trace's) or "
                      "'aot:REPORT.json' (python -m sagc_jax.aot ... --out REPORT.json).")
  flags.DEFINE_string("budget", None, "The rollout budget to replay under, MODE:SIZE "
                      "(hold_prompts:8, hold_rollouts:64; default: the traced run's under "
                      "'cpu', the preset's under 'aot:').")
  flags.DEFINE_string("check", None, "Also compare the straggler rates a finished run "
                      "observed (its metrics.jsonl, at its tau) with the trace's prediction.")
  flags.DEFINE_float("check_other_tau", 1.8, "With --check: also the prediction at this tau.")
  flags.DEFINE_list("kinds", [], "Controller kinds to replay as arms beside SAGC's grid and "
                    "the static sizes: registry names or 'module:Class'.")
  flags.DEFINE_list("signal", [], "The learning measures the report ranks settings by "
                    "(experiments.signals; default every one).")
  flags.DEFINE_string("signal_checks", str(SIGNAL_CHECKS), "The learning measures' checks "
                      "against measured learning (JSON, docs/results.md): a recommendation "
                      "is made only under a validated measure (one that passed every workload-mode "
                      "that tested it, and at least two).")
  flags.mark_flags_as_required(["out"])
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  from sagc_jax.config import controller_settings
  from sagc_jax.experiments.calibration import calibration_report, format_report
  from sagc_jax.replay.trace import read_trace
  from sagc_jax.runtime.storage import read_json, run_path
  from sagc_jax.replay.costs import budgeted_settings, cost_from_flag
  from sagc_jax.experiments.signals import chosen, validated_measures

  out = Path(flags.out)
  chosen(flags.signal)                 # an unknown measure fails before any sampling
  checks = Path(flags.signal_checks)   # and so does a damaged checks file
  validated = validated_measures(read_json(checks)) if checks.is_file() else []
  if flags.prompts < 1 or flags.responses < 2:
    raise ValueError(f"--prompts={flags.prompts} must be >= 1 and --responses="
                     f"{flags.responses} >= 2")
  if flags.trace:
    trace_path = Path(flags.trace)
  else:
    if flags.config is None:
      raise ValueError("--config is required unless --trace names an existing trace")
    if not (flags.cost == "cpu" or flags.cost.startswith(("cpu:", "aot:"))):
      raise ValueError(f"--cost={flags.cost!r} is not 'cpu', 'cpu:TRACE.jsonl' or "
                       "'aot:REPORT.json'")
    config = flags.config
    if "compare" in config:             # a comparison's config: its arms' training config
      import ml_collections
      config = ml_collections.ConfigDict({k: v for k, v in config.items() if k != "compare"})
      print("calibrate: the config's compare section is left out: calibrating the training "
            "config its arms share", flush=True)
    smallest = min(config.controller.candidates)
    if 2 * smallest > flags.responses:
      raise ValueError(f"--responses={flags.responses}: a replay resamples groups, so it "
                       f"needs at least twice a candidate G (the smallest is {smallest})")
    workdir = None
    if flags.workdir:
      workdir = run_path(flags.workdir)
      if not (workdir / "checkpoints").is_dir():
        raise ValueError(f"--workdir {flags.workdir} holds no checkpoints/ folder: it must be "
                         "a training run directory")
    from sagc_jax.training.trace_sampling import record_trace
    trace_path = record_trace(config, out, workdir=workdir, prompts=flags.prompts,
                              responses=flags.responses, log=lambda m: print(m, flush=True))
  trace = read_trace(trace_path)
  cost = cost_from_flag(flags.cost, trace)
  settings = budgeted_settings(cost, trace, flags.budget)
  report = calibration_report(trace, cost, controller_settings(trace.header["controller"]),
                              validated=validated, measures=flags.signal,
                              kinds=checked_kinds(flags.kinds),
                              log=lambda m: print(m, flush=True), **settings)
  out.mkdir(parents=True, exist_ok=True)
  (out / "report.json").write_text(json.dumps(report, indent=1))
  from sagc_jax.experiments.plots import plot_calibration
  plot_calibration(report, out / "report.png")
  print(format_report(report))
  print(f"wrote {trace_path}, {out / 'report.json'} and {out / 'report.png'}")
  if flags.check:
    _check(flags, trace, report)


def _check(flags, trace, report) -> None:
  """``--check RUN``: the run's observed rates beside the trace's predictions."""
  from sagc_jax.experiments.calibration import prediction_check
  from sagc_jax.runtime.storage import read_json

  run = Path(flags.check)
  try:
    config = read_json(run / "config.json")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
  except (OSError, ValueError) as err:
    raise ValueError(f"--check {run}: not a finished training run ({err})") from None
  rows = [r for r in rows if "n_groups" in r]
  if not rows:
    raise ValueError(f"--check {run}: its metrics.jsonl holds no step")
  tau = float(config["controller"]["tau"])
  table = prediction_check(trace, rows, tau, report["rollout"], flags.check_other_tau)
  (Path(flags.out) / "check.md").write_text(table + "\n")
  print(f"group straggler rates of {run} ({len(rows)} steps) against the trace's prediction:")
  print(table)


def run() -> None:
  """Console entry point ``sagc-calibrate``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
