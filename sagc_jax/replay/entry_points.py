"""The replay engine's entry points, one per world (``replay.worlds``).

* ``simulate(config, section, kinds)``: a simulate config (configs/simulate.py) in the
  synthetic world, or with a ``pool`` section (configs/simulate_prompts.py) in the
  prompt-pool world; every static G and the kinds asked for (``default_kinds``),
  costed by the config's ``cost`` section (``costs.CostModel``).
* ``replay(traces, section, cost, ...)``: one replicate of recorded rollouts, every
  static G, the controller kinds asked for and a (tau, delta) grid of SAGC, under the
  run's rollout budget, GRPO or DAPO, priced by the cost passed in; ``replay_replicates``:
  the bootstrap replicates of it that every multi-replicate report runs.

``section`` is the complete controller section (``ControllerSection.to_dict()``)
every arm is built from.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Iterator, Sequence

from sagc_jax.base import checks
from sagc_jax.control.budget import prompts_for
from sagc_jax.control.controller import KINDS
from sagc_jax.replay.costs import CostModel
from sagc_jax.replay.engine import best_fixed_mixture, build_arms, run
from sagc_jax.replay.oracle import OracleArm
from sagc_jax.replay.trace import Trace
from sagc_jax.replay.worlds import (LengthProcess, PromptPool, SyntheticWorld, TraceWorld,
                                     validate_world)

__all__ = ["default_kinds", "replay", "replay_replicates", "simulate"]


def default_kinds(prompts: bool) -> tuple[str, ...]:
  """The kinds a replay runs beside the static sizes unless told: every built-in kind
  but static and those that replay a given setting (``replay_by_default = False``:
  schedule) where the world has prompts with pass rates (the pool, traces), else the
  kinds that read no context (the synthetic world: SAGC)."""
  return tuple(kind for kind, cls in KINDS.items()
               if kind != "static" and getattr(cls, "replay_by_default", True)
               and (prompts or not cls.needs.context))
# What each simulate world reports per arm and per step (the rest of the engine's
# columns are the trace replay's: rounds, steps at the cap).
_SYNTHETIC_SUMMARY = ("straggler_rate", "group_straggler_rate", "step_straggler_rate",
                      "wall_clock_s", "rollout_s", "learner_s", "mean_g", "mean_log2_g",
                      "padding_efficiency", "rollouts")
_POOL_SUMMARY = ("straggler_rate", "group_straggler_rate", "step_straggler_rate",
                 "wall_clock_s", "mean_g", "mean_log2_g", "signal", "informative_groups",
                 "rows", "padding_efficiency", "controller_us", "time_to_target_s",
                 "signal_at_equal_time", "target_signal", "equal_time_s")
_RENAMED = {"rollouts": "rows"}      # the synthetic world's names of the engine's columns
_DROPPED_COLUMNS = {"synthetic": ("controller_s", "rows", "rounds", "capped", "rollout_cut_s",
                                  "total_cut_s"),
                    "pool": ("rounds", "capped", "informative_rows", "advantage_mass",
                             "rollout_cut_s", "total_cut_s")}


def simulate(config: Any, section: dict[str, Any],
             kinds: Sequence[str] | None = None) -> dict[str, Any]:
  """Every arm (the static sizes, then ``kinds``, default ``default_kinds``) in
  lock-step on the config's world; per-arm summaries and per-step traces."""
  candidates = sorted(section["candidates"])
  validate_world(config, candidates)
  for name in (f.name for f in dataclasses.fields(CostModel)):
    checks.number_in(config, f"cost.{name}", 0.0)
  per_step = max(prompts_for(config.sim, g) for g in candidates)
  pool = "pool" in config
  if pool:
    world = PromptPool(config.sim, config.pool, seed=config.seed, max_g=max(candidates),
                       per_step=per_step)
  else:
    world = SyntheticWorld(LengthProcess.of(config), per_step=per_step,
                           max_g=max(candidates), prompt_len=config.sim.prompt_len)
  arms = build_arms(section, default_kinds(pool) if kinds is None else kinds,
                    prompts_for=lambda g: prompts_for(config.sim, g))
  result = run(arms, world, steps=config.sim.steps, budget=config.sim, candidates=candidates,
               cost=CostModel.of(config), measure=(section["tau"], section["event"]))
  dropped = _DROPPED_COLUMNS["pool" if pool else "synthetic"]
  traces = {name: {k: v for k, v in col.items() if k not in dropped}
            for name, col in result["traces"].items()}
  keys = _POOL_SUMMARY if pool else _SYNTHETIC_SUMMARY
  summary = {name: {k: s[_RENAMED.get(k, k)] for k in keys}
             for name, s in result["summary"].items()}
  out = {"config": config.to_dict(), "candidates": candidates, "summary": summary}
  if not pool:
    largest = f"static_G{max(candidates)}"
    for row in summary.values():
      row["speedup_vs_largest_static"] = summary[largest]["wall_clock_s"] / row["wall_clock_s"]
    static_rates = [summary[f"static_G{g}"]["straggler_rate"] for g in candidates]
    out["best_fixed_mixture_log2_g"] = best_fixed_mixture(candidates, static_rates,
                                                          float(section["delta"]))
  return {**out, "simulator_seconds": result["seconds"], "traces": traces}


def replay(traces: Sequence[Trace], section: dict[str, Any], cost: Callable, *,
           rollout: dict[str, Any], steps: int, dapo: bool = False, max_rounds: int,
           kinds: Sequence[str] = default_kinds(True), grid: Sequence[tuple[float, float]] = (),
           seed: int = 0, bootstrap: bool = False, length_scale: float = 1.0,
           length_cap: int | None = None, horizon_s: float | None = None) -> dict[str, Any]:
  """One replicate of ``traces`` (``worlds.TraceWorld``): every static G of
  ``section["candidates"]``, every kind of ``kinds``, SAGC at each (tau, delta) of
  ``grid`` and the oracle (``replay.oracle``) on the same replayed steps, each arm with its own loader, under the rollout
  budget ``rollout``, for ``steps`` steps or until ``horizon_s`` of priced time; per-arm
  summaries and per-step columns (``engine.run``)."""
  budget = types.SimpleNamespace(**rollout)
  candidates = sorted(section["candidates"])
  world = TraceWorld(traces, max_g=max(candidates), steps=steps, seed=seed,
                     bootstrap=bootstrap, length_scale=length_scale, length_cap=length_cap)
  arms = build_arms(section, kinds, prompts_for=lambda g: prompts_for(budget, g), grid=grid)
  arms.append(("oracle", OracleArm(candidates, lambda g: prompts_for(budget, g), cost,
                                   max_rounds=max_rounds if dapo else 1)))
  return run(arms, world, steps=steps, budget=budget, candidates=candidates, cost=cost,
             measure=(section["tau"], section["event"]),
             dapo=dapo, max_rounds=max_rounds, horizon_s=horizon_s)


def replay_replicates(traces: Sequence[Trace], section: dict[str, Any], cost: Callable, *,
               replicates: int, log: Callable[[str], None] | None = None,
               progress: str = "replicate {k}", **settings: Any
               ) -> Iterator[tuple[int, dict[str, Any]]]:
  """``(k, replay(...))`` for each of ``replicates`` bootstrap replicates: replicate k
  resamples the trace's prompts and reseeds the replay (``seed=k``) and the
  controllers (``section["seed"] + k``), so its intervals hold the trace's own
  sampling error too; ``settings`` are ``replay``'s. ``log`` gets ``progress`` with
  ``{k}``, the replicate counted from 1, before each."""
  for k in range(replicates):
    if log is not None:
      log(progress.format(k=k + 1))
    yield k, replay(traces, dict(section, seed=int(section["seed"]) + k), cost, seed=k,
                    bootstrap=True, **settings)
