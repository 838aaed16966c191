"""``python -m sagc_jax.simulate [--config configs/simulate.py]``: the SAGC
controller against every static G on simulated rollout lengths, no model needed.

Prints the comparison table in seconds and writes ``--out`` (JSON), ``--plot``
(PNG) and, with ``--claims_seeds N``, the paper's claims table over N seeds. The
engine is ``sagc_jax.replay.entry_points`` (its synthetic world). A config with a ``pool``
section (configs/simulate_prompts.py) runs the prompt-pool world instead (static G,
SAGC, prompt_aware, per_prompt), and ``--claims_seeds N`` then writes its per-arm and
against-SAGC tables (``sagc_jax.experiments.replay_tables``).

``--trace T[,T2]`` replays recorded rollouts instead (``python -m sagc_jax.calibrate``
writes them; the engine's trace world): every static G, SAGC, prompt_aware and
per_prompt, for ``--algorithms`` and ``--taus`` (``--delta``), over ``--replicates`` bootstrap
replicates, priced by ``--cost`` (``cpu``, or ``aot:REPORT.json`` from ``python -m
sagc_jax.aot ... --out``). A second trace (after RL) makes the prompts drift from the
first to it over the run. The controller settings are the traced run's; the rollout
budget is the trace's run's under ``cpu`` and the preset's under ``aot:``, or the one
``--budget MODE:SIZE`` names (``hold_prompts:8``, ``hold_rollouts:64``). Writes the
tables to ``--out`` with ``.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from sagc_jax.cli import checked_kinds, run_absl_tool

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "simulate.py"


def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file(
      "config", str(DEFAULT_CONFIG), "ml_collections config file (get_config()).")
  flags.DEFINE_string("out", "runs/simulate/results.json", "JSON output path.")
  flags.DEFINE_string("plot", None, "PNG plot path (default: --out with .png).")
  flags.DEFINE_integer("claims_seeds", 0, "also run this many seeds and write their tables "
                       "(sagc_jax.experiments.replay_tables) next to --out as claims.md")
  flags.DEFINE_list("trace", [], "Replay this trace (a second one, comma-separated: the "
                    "trace after RL, for drift) instead of simulating lengths.")
  flags.DEFINE_string("cost", "cpu", "Trace replay cost model: 'cpu' (the first trace's "
                      "measured decode cost), 'cpu:TRACE.jsonl' (another trace's) or "
                      "'aot:REPORT.json'.")
  flags.DEFINE_string("budget", None, "Trace replay: the rollout budget, MODE:SIZE "
                      "(hold_prompts:8, hold_rollouts:64; default: the traced run's under "
                      "'cpu', the preset's under 'aot:').")
  flags.DEFINE_list("algorithms", ["grpo", "dapo"], "Trace replay: grpo and/or dapo.")
  flags.DEFINE_list("taus", [], "Trace replay: the tau of each table (default: the run's).")
  flags.DEFINE_float("delta", None, "Trace replay: the controllers' delta (default: the "
                     "traced run's).")
  flags.DEFINE_integer("replicates", 5, "Trace replay: bootstrap replicates (>= 3).")
  flags.DEFINE_integer("steps", 300, "Trace replay: steps per replicate (with --horizon_s: "
                       "at most).")
  flags.DEFINE_float("horizon_s", None, "Trace replay: run every arm for this many seconds of "
                     "priced time (a comparison's time budget H) instead of --steps; the "
                     "drift between two traces follows the fraction of H spent.")
  flags.DEFINE_list("kinds", [], "Controller kinds to replay as arms beside every static G: "
                    "registry names or 'module:Class' (default: sagc, and in the prompt pool "
                    "and trace replays prompt_aware and per_prompt).")
  flags.DEFINE_list("signal", [], "Trace replay: the learning measures to rank the arms by "
                    "(experiments.signals; default every one: utility, informative_groups, "
                    "informative_rows, advantage_mass).")
  flags.DEFINE_string("learning", None, "Trace replay with --horizon_s: check each learning "
                      "measure's predicted pair orders against the pairs this finished "
                      "comparison (its workdir, with per_hour.json) resolved, at the first tau.")
  return flags.FLAGS


def replay_traces(flags) -> None:
  """``--trace``: the replay tables of the recorded rollouts (module docstring)."""
  from sagc_jax.replay.costs import budgeted_settings, cost_from_flag
  from sagc_jax.config import controller_settings
  from sagc_jax.replay.trace import read_trace
  from sagc_jax.experiments.signals import chosen, read_per_hour
  from sagc_jax.experiments.replay_tables import trace_tables

  if len(flags.trace) > 2:
    raise ValueError(f"--trace takes one trace or two (before,after RL), got {len(flags.trace)}")
  if not flags.algorithms or set(flags.algorithms) - {"grpo", "dapo"}:
    raise ValueError(f"--algorithms={','.join(flags.algorithms)}: each must be grpo or dapo")
  if flags.replicates < 3 or flags.steps < 10:
    raise ValueError(f"--replicates={flags.replicates} must be >= 3 and --steps={flags.steps} "
                     ">= 10")
  try:
    taus = [float(t) for t in flags.taus]
  except ValueError:
    raise ValueError(f"--taus={','.join(flags.taus)} is not a list of numbers") from None
  traces = [read_trace(path) for path in flags.trace]
  cost = cost_from_flag(flags.cost, traces[0])
  taus = taus or [float(traces[0].header["controller"]["tau"])]
  settings = budgeted_settings(cost, traces[0], flags.budget)
  refill = bool(getattr(cost, "bound_ratios", None))
  if flags.delta is not None and not 0.0 < flags.delta < 1.0:
    raise ValueError(f"--delta={flags.delta} must be in (0, 1)")
  section = controller_settings(traces[0].header["controller"])
  if flags.delta is not None:
    section["delta"] = float(flags.delta)
  if flags.horizon_s is not None and not flags.horizon_s > 0:
    raise ValueError(f"--horizon_s={flags.horizon_s} must be > 0")
  if flags.learning and flags.horizon_s is None:
    raise ValueError("--learning needs --horizon_s (the comparison's time budget H)")
  per_hour = None
  if flags.learning:
    path = Path(flags.learning) / "per_hour.json"
    if not path.is_file():
      raise ValueError(f"--learning {flags.learning}: no per_hour.json (python -m "
                       "sagc_jax.compare writes it)")
    per_hour = read_per_hour(path)
  table, rows, found = trace_tables(traces, section, cost, algorithms=flags.algorithms,
                                    taus=taus, replicates=flags.replicates, steps=flags.steps,
                                    refill=refill, horizon_s=flags.horizon_s,
                                    measures=chosen(flags.signal),
                                    kinds=checked_kinds(flags.kinds) or None,
                                    log=lambda m: print(m, flush=True), **settings)
  if per_hour is not None:
    from sagc_jax.experiments.signals import check_learning, learning_markdown
    found["learning"] = check_learning(
        {a: found["predictions"][f"{a} tau {taus[0]:g}"] for a in flags.algorithms}, per_hour)
    table += (f"\n\nEach measure's predicted order of every pair resolved by "
              f"{flags.learning} (mean held-out accuracy over [0, H], Holm):\n\n"
              + learning_markdown(found["learning"]))
  drift = "drifting from the first trace to the second" if len(traces) == 2 else \
      "one stationary trace: an upper bound for the contextual kinds"
  notes = [f"cost {cost.name}", f"delta {section['delta']:g}",
           f"rollout budget {settings['rollout']}", f"candidates {settings['candidates']}",
           f"truncated share {', '.join(f'{t.truncated.mean():.3f}' for t in traces)}"]
  if settings["length_scale"] != 1.0:
    notes.append(f"lengths scaled x{settings['length_scale']:g} to the "
                 f"{settings['length_cap']}-token cap")
  if refill:
    notes.append("the AOT report's own refill schedule simulation over the priced bound: "
                 + ", ".join(f"{k} x{v:.2f}" for k, v in cost.bound_ratios.items()))
  if traces[0].responses < 2 * max(settings["candidates"]):
    notes.append(f"only {traces[0].responses} responses per prompt: groups of the largest G "
                 "are not resampled")
  intro = f"Trace replay of {', '.join(flags.trace)} ({drift}); " + "; ".join(notes)
  print(intro)
  print(table)
  out = Path(flags.out).with_suffix(".md")
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(intro + "\n\n" + table + "\n")
  out.with_suffix(".json").write_text(json.dumps({"intro": intro, "rows": rows, **found},
                                                 indent=1))
  print(f"wrote {out} and {out.with_suffix('.json')}")


def main(argv: Sequence[str], flags) -> None:
  if flags.trace:
    replay_traces(flags)
    return
  from sagc_jax.config import controller_settings
  from sagc_jax.replay.entry_points import simulate
  from sagc_jax.experiments.replay_tables import (format_prompt_table, format_table,
                                                   simulate_tables)
  from sagc_jax.experiments.plots import plot_simulation

  config = flags.config

  prompts = "pool" in config
  section = controller_settings(config.controller)
  kinds = checked_kinds(flags.kinds) or None
  result = simulate(config, section, kinds)
  print(f"SAGC simulator{' (prompt pool)' if prompts else ''}: {config.sim.steps} steps, "
        f"mode={config.sim.mode}, candidates={tuple(section['candidates'])}, "
        f"tau={section['tau']}, delta={section['delta']} ({result['simulator_seconds']:.2f} s)")
  print(format_prompt_table(result) if prompts else format_table(result, section))
  out = Path(flags.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(result, indent=1))
  plot_path = Path(flags.plot) if flags.plot else out.with_suffix(".png")
  plot_simulation(result, plot_path)
  print(f"wrote {out} and {plot_path}")
  if flags.claims_seeds < 0:
    raise ValueError(f"--claims_seeds={flags.claims_seeds} must be >= 0")
  if flags.claims_seeds:
    table, _ = simulate_tables(config, section, flags.claims_seeds, kinds)
    claims_path = out.with_name("claims.md")
    claims_path.write_text(table + "\n")
    print(table)
    print(f"wrote {claims_path} ({flags.claims_seeds} seeds)")


def run() -> None:
  """Console entry point ``sagc-simulate``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
