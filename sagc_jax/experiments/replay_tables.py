"""Multi-seed tables of the replay engine (``replay.entry_points``): ``simulate
--claims_seeds N`` (the paper's claims in the synthetic world; every arm's
measurements and the contextual controllers against SAGC in the prompt pool) and
``simulate --trace`` (every arm replaying real rollouts, per algorithm and tau,
against the largest static G).

Seed k of a simulation runs with ``config.seed + k`` (lengths, pool, loader order) and
``controller.seed + k``; replicate k of a trace replay reseeds the replay and the
controllers and resamples the trace's prompts (bootstrap by prompt), so its intervals
hold the trace's own sampling error too. Tables: ``base.stats`` (mean ± 95%
Student-t half-width, seed-paired comparisons). Nothing here is tuned: the verdicts
are a fixed function of the rows.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from sagc_jax.replay.engine import MEASURES
from sagc_jax.control.controller import arm_name, kind_class
from sagc_jax.control.protocol import Needs
from sagc_jax.replay.entry_points import default_kinds, replay_replicates, simulate
from sagc_jax.base.stats import Paired, arm_comparison
from sagc_jax.replay.trace import Trace
from sagc_jax.experiments.claims import claims_markdown
from sagc_jax.experiments.signals import (agree, measure_values, predictions, ranking_markdown,
                                      signals)

__all__ = ["arm_rows", "claim_rows", "format_prompt_table", "format_table", "simulate_tables",
           "trace_tables"]

# The per-arm tables' columns, one a line: row key, format, title. Each table picks its keys.
_TITLES = {key: (title, fmt) for key, fmt, title in (
    line.split(maxsplit=2) for line in """
    group_straggler_rate .3f group straggler rate
    step_straggler_rate .3f step straggler rate
    wall_clock_h .2f wall-clock (simulated h)
    signal_k .2f signal (k)
    informative_k .2f informative groups (k)
    mean_g .2f mean G
    time_to_target_h .2f h to target signal
    signal_at_equal_time_k .2f signal at equal wall-clock (k)
    controller_us .0f controller µs / step
    rounds_per_step .2f rounds / step
    step_s .1f s / step
    signal_per_h .0f signal / h
    capped_steps .2f steps at the cap
    rollout_s_per_step .1f rollout s / step""".strip().splitlines())}
_columns = lambda *keys: tuple((key, *_TITLES[key]) for key in keys)
_POOL_COLUMNS = _columns("group_straggler_rate", "step_straggler_rate", "wall_clock_h",
                         "signal_k", "informative_k", "mean_g", "time_to_target_h",
                         "signal_at_equal_time_k", "controller_us")
_TRACE_COLUMNS = _columns("group_straggler_rate", "step_straggler_rate", "mean_g",
                          "rounds_per_step", "step_s", "signal_per_h", "capped_steps")
# Where the learning measures disagree on the best arm: time and straggler rates only.
_TIME_COLUMNS = _columns("group_straggler_rate", "step_straggler_rate", "mean_g",
                         "rounds_per_step", "rollout_s_per_step", "step_s", "capped_steps")
# The prompt pool's comparison with SAGC (arm / SAGC or arm - SAGC, per seed).
_POOL_PAIRED = (
    Paired("signal_at_equal_time_k", "signal at equal wall-clock, arm / SAGC", "ratio", "above"),
    Paired("time_to_target_h", "wall-clock to the target signal, arm / SAGC", "ratio", "below"),
    Paired("signal_k", "signal over the run, arm / SAGC", "ratio", "above"),
    Paired("informative_k", "informative groups over the run, arm / SAGC", "ratio", "above"),
    Paired("wall_clock_h", "wall-clock of the run, arm / SAGC", "ratio", "below"),
    Paired("group_straggler_rate", "group straggler rate, arm - SAGC", "difference", "below",
           "+.4f"),
)
_TRACE_PAIRED = (
    Paired("time_to_target_h", "wall-clock to the target signal, arm / static", "ratio",
           "below"),
    Paired("signal_at_equal_time_k", "signal at equal wall-clock, arm / static", "ratio",
           "above"),
    Paired("group_straggler_rate", "group straggler rate, arm - static", "difference", "below",
           "+.3f"),
)


def arm_rows(result: dict[str, Any], seed: int) -> list[dict[str, Any]]:
  """One row per arm of a prompt-pool simulation or a replay, in the tables' units."""
  return [{"arm": arm, "seed": seed,
           "group_straggler_rate": s["group_straggler_rate"],
           "step_straggler_rate": s["step_straggler_rate"],
           "wall_clock_h": s["wall_clock_s"] / 3600.0,
           "signal_k": s["signal"] / 1e3,
           "informative_k": s["informative_groups"] / 1e3,
           "mean_g": s["mean_g"],
           "time_to_target_h": s["time_to_target_s"] / 3600.0,
           "signal_at_equal_time_k": s["signal_at_equal_time"] / 1e3,
           "controller_us": s["controller_us"]} for arm, s in result["summary"].items()]


def claim_rows(result: dict[str, Any], seed: int) -> list[dict[str, Any]]:
  """One ``claims`` row per arm of a synthetic simulation (``algorithm="simulator"``).

  Rewards, accuracy and output lengths are left out: the synthetic world has no
  policy, and every arm reads the same exogenous lengths, so those claims are not
  applicable.
  """
  candidates = result["candidates"]
  rows = []
  for name, summary in result["summary"].items():
    trace = result["traces"][name]
    static = name != "sagc"
    rows.append({
        "algorithm": "simulator", "controller": "static" if static else "sagc",
        "static_g": int(name.removeprefix("static_G")) if static else "", "seed": seed,
        "step_straggler_rate": summary["step_straggler_rate"],
        "group_straggler_rate": summary["group_straggler_rate"],
        "wall_clock_s": summary["wall_clock_s"],
        "seconds_per_step": summary["wall_clock_s"] / len(trace["g"]),
        "p_smallest_end": trace.get(f"p_mean/G{min(candidates)}", [math.nan])[-1],
        "p_largest_end": trace.get(f"p_mean/G{max(candidates)}", [math.nan])[-1]})
  return rows


def _seeded(config: Any, section: dict[str, Any], seeds: int
            ) -> Iterator[tuple[int, Any, dict[str, Any]]]:
  """``(k, config, section)`` for k < ``seeds``: ``seed`` and the controllers' seed
  both raised by k."""
  for k in range(seeds):
    seeded = config.copy_and_resolve_references()
    seeded.seed = config.seed + k
    seeded.controller.seed = section["seed"] + k
    yield k, seeded, dict(section, seed=section["seed"] + k)


def simulate_tables(config: Any, section: dict[str, Any], seeds: int,
                    kinds: Sequence[str] | None = None) -> tuple[str, list[dict[str, Any]]]:
  """The markdown over ``seeds`` simulations of the static sizes and ``kinds`` (default:
  ``default_kinds``) and its rows: the claims table (``experiments.claims``) in the
  synthetic world; in the prompt pool, the per-arm table and the other kinds against
  SAGC."""
  pool = "pool" in config
  rows = [r for k, seeded, sec in _seeded(config, section, seeds)
          for r in (arm_rows if pool else claim_rows)(simulate(seeded, sec, kinds), k)]
  if not pool:
    return claims_markdown(rows), rows
  kinds = default_kinds(True) if kinds is None else kinds
  return arm_comparison(
      rows, _POOL_COLUMNS, _POOL_PAIRED, reference="sagc",
      others=[arm_name(k) for k in kinds if k not in ("sagc", "static")],
      intro=f"Per arm, mean ± 95% CI over {len({r['seed'] for r in rows})} seeds:",
      against="Against SAGC, per seed then mean ± 95% CI:"), rows


def _refused(kind: str | None, refill: bool) -> str:
  """What the trainer says of a kind's arm the replay runs anyway (its ``needs``)."""
  needs = kind_class(kind).needs if kind else Needs()      # static G and SAGC's grid: none
  why = ["one process only (sizes per prompt)"] if needs.one_process else []
  if needs.no_refill and refill:
    why.append("refused with the refill sampler (rollout.refill_slots > 0); priced here "
               "as refill rows all the same")
  return "; ".join(why)


def trace_tables(traces: Sequence[Trace], section: dict[str, Any], cost: Callable, *,
                 algorithms: Sequence[str], taus: Sequence[float], replicates: int,
                 steps: int, rollout: dict[str, Any], candidates: Sequence[int],
                 max_rounds: int, length_scale: float = 1.0, length_cap: int | None = None,
                 refill: bool = False, horizon_s: float | None = None,
                 measures: Sequence[str] = tuple(MEASURES), kinds: Sequence[str] | None = None,
                 log: Callable[[str], None] = print
                 ) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
  """The markdown tables and their rows of replaying ``traces`` (module docstring):
  per algorithm and tau, every static G and ``kinds`` (default ``default_kinds``) from
  the controller ``section`` with ``candidates`` and that tau (also the measurement
  tau), for ``steps`` steps or until ``horizon_s`` of priced time. Also, per measure
  and table (``<algorithm> tau <tau>``), the arms' values and ranking (``signals``) and
  the predicted order of every pair of arms (``predictions``)."""
  kinds = default_kinds(True) if kinds is None else tuple(kinds)
  kind_of = {arm_name(k): k for k in kinds}
  section = dict(section, candidates=tuple(candidates))
  rows: list[dict[str, Any]] = []
  sections = []
  found: dict[str, dict[str, Any]] = {"signals": {}, "predictions": {}}
  reference = f"static_G{max(candidates)}"
  for algorithm in algorithms:
    for tau in taus:
      mine = []
      for rep, result in replay_replicates(
          traces, dict(section, tau=float(tau)), cost, replicates=replicates, kinds=kinds,
          log=log, progress=f"replay: {algorithm}, tau {tau:g}, replicate {{k}}/{replicates}",
          rollout=rollout, steps=steps,
          dapo=algorithm == "dapo", max_rounds=max_rounds, length_scale=length_scale,
          length_cap=length_cap, horizon_s=horizon_s):
        for row in arm_rows(result, rep):
          s = result["summary"][row["arm"]]
          col = result["traces"][row["arm"]]
          row.update(measure_values(s), algorithm=algorithm, tau=float(tau),
                     step_s=s["wall_clock_s"] / len(col["total_s"]),
                     rollout_s_per_step=s["rollout_s"] / len(col["total_s"]),
                     signal_per_h=s["signal"] / (s["wall_clock_s"] / 3600.0),
                     rounds_per_step=s["rounds_per_step"],
                     capped_steps=float(np.mean(col["capped"])))
          mine.append(row)
      rows += mine
      label = f"{algorithm} tau {tau:g}"
      ranked = signals(mine, measures)
      for measure, entry in ranked.items():
        found["signals"].setdefault(measure, {})[label] = entry
      found["predictions"][label] = predictions(mine, measures)
      ranks = agree(ranked)
      sections.append(arm_comparison(
          mine, _TRACE_COLUMNS if ranks else _TIME_COLUMNS,
          _TRACE_PAIRED if ranks else _TRACE_PAIRED[-1:], reference=reference,
          others=[a for a in dict.fromkeys(r["arm"] for r in mine) if a != reference],
          intro=f"**{algorithm.upper()}, tau {tau:g}**: per arm, mean ± 95% CI over "
                f"{len({r['seed'] for r in mine})} replicates",
          against=f"Against {reference}, per replicate then mean ± 95% CI:",
          extra=("trainer", lambda arm: _refused(kind_of.get(arm), refill)))
          + "\n\nThe arms under each learning measure (experiments.signals):\n\n"
          + ranking_markdown(ranked))
  return "\n\n".join(sections), rows, found


def format_table(result: dict[str, Any], section: dict[str, Any]) -> str:
  """The synthetic world's comparison table (one line per arm) of the arms of the
  controller ``section``."""
  header = (f"{'arm':<12} {'groups':>7} {'steps':>7} {'wall_s':>10} {'rollout_s':>10} "
            f"{'speedup':>8} {'mean_G':>7} {'log2_G':>7} {'pad_eff':>8}")
  event = section["event"]
  lines = [f"straggler rates: 'groups' = fraction of groups, 'steps' = fraction of steps "
           f"with a straggler; the constraint uses {event!r}", header, "-" * len(header)]
  for name, row in result["summary"].items():
    lines.append(
        f"{name:<12} {row['group_straggler_rate']:>7.3f} {row['step_straggler_rate']:>7.3f} "
        f"{row['wall_clock_s']:>10.1f} "
        f"{row['rollout_s']:>10.1f} {row['speedup_vs_largest_static']:>8.2f} "
        f"{row['mean_g']:>7.2f} {row['mean_log2_g']:>7.3f} {row['padding_efficiency']:>8.3f}")
  best = result["best_fixed_mixture_log2_g"]
  delta = section["delta"]
  lines.append(f"best fixed randomised G with {event} straggler rate <= {delta}: mean log2 G = "
               + ("infeasible" if best is None else f"{best:.3f}"))
  return "\n".join(lines)


def format_prompt_table(result: dict[str, Any]) -> str:
  """The prompt pool's table, one line per arm: rates, wall-clock, signal proxies, mean
  G, controller cost."""
  header = (f"{'arm':<13} {'groups':>6} {'steps':>6} {'wall_h':>7} {'signal':>8} "
            f"{'informative':>11} {'mean_G':>6} {'t_target_h':>10} {'sig@equal_t':>11} "
            f"{'ctrl_us':>8}")
  lines = [header, "-" * len(header)]
  for name, row in result["summary"].items():
    lines.append(
        f"{name:<13} {row['group_straggler_rate']:>6.3f} {row['step_straggler_rate']:>6.3f} "
        f"{row['wall_clock_s'] / 3600:>7.2f} {row['signal']:>8.0f} "
        f"{row['informative_groups']:>11.0f} {row['mean_g']:>6.2f} "
        f"{row['time_to_target_s'] / 3600:>10.2f} {row['signal_at_equal_time']:>11.0f} "
        f"{row['controller_us']:>8.1f}")
  first = next(iter(result["summary"].values()))
  lines.append(f"target signal {first['target_signal']:.0f} (smallest final signal of any arm); "
               f"equal wall-clock {first['equal_time_s'] / 3600:.2f} h (shortest run)")
  return "\n".join(lines)
