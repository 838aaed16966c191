"""The replay engine's entry points, one per world (``control.worlds``), and the tables
``python -m sagc_jax.simulate`` prints.

* ``simulate(config, section)``: a simulate config (configs/simulate.py) in the
  synthetic world, or with a ``pool`` section (configs/simulate_prompts.py) in the
  prompt-pool world; every static G and SAGC (the pool adds ``prompt_aware`` and
  ``per_prompt``), costed by the config's ``cost`` section (``engine.CostModel``).
* ``replay(traces, section, cost, ...)``: one replicate of recorded rollouts, every
  static G, the controller kinds asked for and a (tau, delta) grid of SAGC, under the
  run's rollout budget, GRPO or DAPO, priced by the cost passed in.

``section`` is the complete controller section (``ControllerSection.to_dict()``)
every arm is built from.
"""

from __future__ import annotations

import types
from typing import Any, Callable, Sequence

from sagc_jax.base import checks
from sagc_jax.control.budget import prompts_for
from sagc_jax.control.engine import CostModel, best_fixed_mixture, build_arms, run
from sagc_jax.control.trace import Trace
from sagc_jax.control.worlds import (LengthProcess, PromptPool, SyntheticWorld, TraceWorld,
                                     validate_world)

__all__ = ["CONTEXTUAL", "format_prompt_table", "format_table", "replay", "simulate"]

CONTEXTUAL = ("sagc", "prompt_aware", "per_prompt")
# What each simulate world reports per arm and per step (the rest of the engine's
# columns are the trace replay's: rounds, steps at the cap).
_SYNTHETIC_SUMMARY = ("straggler_rate", "group_straggler_rate", "step_straggler_rate",
                      "wall_clock_s", "rollout_s", "learner_s", "mean_g", "mean_log2_g",
                      "padding_efficiency", "rollouts")
_POOL_SUMMARY = ("straggler_rate", "group_straggler_rate", "step_straggler_rate",
                 "wall_clock_s", "mean_g", "mean_log2_g", "signal", "informative_groups",
                 "rows", "padding_efficiency", "controller_us", "time_to_target_s",
                 "signal_at_equal_time", "target_signal", "equal_time_s")
_DROPPED_COLUMNS = {"synthetic": ("controller_s", "rows", "rounds", "capped", "rollout_cut_s",
                                  "total_cut_s"),
                    "pool": ("rounds", "capped", "informative_rows", "advantage_mass",
                             "rollout_cut_s", "total_cut_s")}


def simulate(config: Any, section: dict[str, Any]) -> dict[str, Any]:
  """Every arm in lock-step on the config's world; per-arm summaries and per-step
  traces."""
  candidates = sorted(section["candidates"])
  validate_world(config, candidates)
  for name in CostModel.__dataclass_fields__:
    checks.number_in(config, f"cost.{name}", 0.0)
  per_step = max(prompts_for(config.sim, g) for g in candidates)
  pool = "pool" in config
  if pool:
    world = PromptPool(config.sim, config.pool, seed=config.seed, max_g=max(candidates),
                       per_step=per_step)
  else:
    world = SyntheticWorld(LengthProcess.of(config), per_step=per_step,
                           max_g=max(candidates), prompt_len=config.sim.prompt_len)
  arms = build_arms(section, CONTEXTUAL if pool else ("sagc",),
                    prompts_for=lambda g: prompts_for(config.sim, g))
  result = run(arms, world, steps=config.sim.steps, budget=config.sim, candidates=candidates,
               cost=CostModel.of(config))
  dropped = _DROPPED_COLUMNS["pool" if pool else "synthetic"]
  traces = {name: {k: v for k, v in col.items() if k not in dropped}
            for name, col in result["traces"].items()}
  out = {"config": config.to_dict(), "candidates": candidates}
  if pool:
    out["summary"] = {name: {k: s[k] for k in _POOL_SUMMARY}
                      for name, s in result["summary"].items()}
    return {**out, "simulator_seconds": result["seconds"], "traces": traces}
  renamed = {"rollouts": "rows", "mean_g": "mean_step_g"}      # the synthetic world's names
  summary = {name: {k: s[renamed.get(k, k)] for k in _SYNTHETIC_SUMMARY}
             for name, s in result["summary"].items()}
  largest = f"static_G{max(candidates)}"
  for row in summary.values():
    row["speedup_vs_largest_static"] = summary[largest]["wall_clock_s"] / row["wall_clock_s"]
  static_rates = [summary[f"static_G{g}"]["straggler_rate"] for g in candidates]
  mixture = best_fixed_mixture(candidates, static_rates, float(section["delta"]))
  return {**out, "summary": summary, "best_fixed_mixture_log2_g": mixture,
          "simulator_seconds": result["seconds"], "traces": traces}


def replay(traces: Sequence[Trace], section: dict[str, Any], cost: Callable, *,
           rollout: dict[str, Any], steps: int, dapo: bool = False, max_rounds: int,
           kinds: Sequence[str] = CONTEXTUAL, grid: Sequence[tuple[float, float]] = (),
           seed: int = 0, bootstrap: bool = False, length_scale: float = 1.0,
           length_cap: int | None = None, horizon_s: float | None = None) -> dict[str, Any]:
  """One replicate of ``traces`` (``worlds.TraceWorld``): every static G of
  ``section["candidates"]``, every kind of ``kinds`` and SAGC at each (tau, delta) of
  ``grid`` on the same replayed steps, each arm with its own loader, under the rollout
  budget ``rollout``, for ``steps`` steps or until ``horizon_s`` of priced time; per-arm
  summaries and per-step columns (``engine.run``)."""
  budget = types.SimpleNamespace(**rollout)
  candidates = sorted(section["candidates"])
  world = TraceWorld(traces, max_g=max(candidates), steps=steps, seed=seed,
                     bootstrap=bootstrap, length_scale=length_scale, length_cap=length_cap)
  arms = build_arms(section, kinds, prompts_for=lambda g: prompts_for(budget, g), grid=grid)
  return run(arms, world, steps=steps, budget=budget, candidates=candidates, cost=cost,
             dapo=dapo, max_rounds=max_rounds, horizon_s=horizon_s)


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
