"""Replays recorded rollouts (``control.trace``) through every controller, priced by a
cost model the caller passes in.

A real model's RL step costs tens of seconds on a CPU, so hundreds of steps of every
controller are out of reach; its rollouts can be recorded once (``python -m
sagc_jax.calibrate``) and replayed thousands of times:

* Loader: the trace's prompts recur epoch after epoch, each epoch a fresh
  permutation, as in training; step t hands out the next ``M = max_G P(G)``
  prompts per sampling round, the same ones to every arm (common random numbers).
* Responses: a prompt's group of G is drawn without replacement from its K recorded
  responses (a trace holds K >= 2 max G, so groups are resampled, not replayed).
* Drift: given a second trace of the same prompts (after RL), prompt i at progress
  ``x = t / (steps - 1)`` takes its responses from the second trace with
  probability x. A single trace is stationary: an upper bound for the contextual
  kinds, whose prompt history never goes stale.
* GRPO and DAPO: with ``dapo``, a round's groups whose recorded rewards are all equal
  are dropped (DAPO's dynamic sampling, ``rl.dynamic_sampling``) and further rounds
  of new prompts at the step's G follow until P(G) groups are kept or ``max_rounds``
  ran; every round is priced and observed, as in the trainer.
* Replicates: each replicate reseeds the replay and resamples the trace's prompts
  with replacement (a bootstrap by prompt), so the intervals over replicates hold
  both the replay's randomness and the trace's own sampling error.

Learning signal (as in ``prompt_simulator``): ``sum over kept groups of
4 p (1 - p) log2 G``, ``p`` the prompt's pass rate over all its recorded responses.

The cost model is any callable ``cost(rounds) -> {"rollout_s", "learner_s",
"total_s"}`` over the step's rounds, each ``(lengths of its rows, its prompts'
token lengths)``; ``DecodeCost`` (the trace's measured CPU decode cost) is here, the
TPU pod's compiled cost is ``sagc_jax.aot.trace_cost`` (it needs JAX).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from sagc_jax.control.budget import prompts_for
from sagc_jax.control.context import BatchContext
from sagc_jax.control.prompt_simulator import (add_equal_budget_metrics, group_stats,
                                               summarise_arm)
from sagc_jax.control.protocol import StepGroups
from sagc_jax.control.simulator import build_arms, run_lockstep
from sagc_jax.control.trace import Trace

__all__ = ["ARMS", "DecodeCost", "Settings", "TraceWorld", "replay", "replay_config",
           "replicate_table"]

ARMS = ("sagc", "prompt_aware", "per_prompt")
Rounds = Sequence[tuple[np.ndarray, np.ndarray]]
CostFn = Callable[[Rounds], dict[str, float]]


@dataclasses.dataclass(frozen=True)
class DecodeCost:
  """The trace's measured CPU decode cost: a sampling round of ``rows`` rows runs
  lock-step until its longest response is done, ``a_s + b_s x rows x longest``
  seconds (``trace_sampling.fit_decode_cost``). No learner cost: calibration does
  not measure it."""

  a_s: float
  b_s: float
  name: str = "cpu"

  @classmethod
  def of(cls, trace: Trace) -> "DecodeCost":
    fit = trace.header.get("decode_cost")
    if not fit:
      raise ValueError("the trace's header holds no decode_cost: the 'cpu' cost model needs "
                       "a trace written by python -m sagc_jax.calibrate")
    return cls(float(fit["a_s"]), float(fit["b_s"]))

  def __call__(self, rounds: Rounds) -> dict[str, float]:
    rollout = sum(self.a_s + self.b_s * lengths.size * int(lengths.max())
                  for lengths, _ in rounds)
    return {"rollout_s": rollout, "learner_s": 0.0, "total_s": rollout}


class TraceWorld:
  """The rollouts of every step of one replicate (module docstring): ``draw(step)``
  is a list of ``rounds`` dicts with ``ids``, ``prompt_tokens``, ``pass_rate`` [M]
  and ``lengths``, ``passed``, ``rewards`` [M, max_g]. Deterministic in ``seed``;
  ``bootstrap`` resamples the prompts (replicate ``seed``)."""

  def __init__(self, traces: Sequence[Trace], *, per_step: int, rounds: int, max_g: int,
               steps: int, seed: int, bootstrap: bool = False, length_scale: float = 1.0,
               length_cap: int | None = None):
    first = traces[0]
    if first.responses < max_g:
      raise ValueError(f"the trace holds {first.responses} responses per prompt, fewer than "
                       f"the largest group size {max_g}")
    aligned = [first]
    for other in traces[1:]:
      where = {int(i): r for r, i in enumerate(other.ids)}
      missing = [int(i) for i in first.ids if int(i) not in where]
      if missing or other.responses < max_g:
        raise ValueError(f"the second trace must hold the first one's prompts with >= {max_g} "
                         f"responses each (missing ids: {missing[:5]})")
      aligned.append(other.take([where[int(i)] for i in first.ids]))
    self.traces, self.per_step, self.rounds, self.max_g = aligned, per_step, rounds, max_g
    self.steps, self.seed = steps, seed
    n = first.prompts
    rng = np.random.Generator(np.random.PCG64([seed, 5]))
    self.pool = rng.integers(0, n, n) if bootstrap else np.arange(n)
    self.cap = cap = length_cap or max(t.max_new_tokens for t in aligned)
    self.lengths = [np.clip(np.rint(t.lengths * length_scale), 1, cap).astype(np.int64)
                    for t in aligned]
    self.pass_rate = [t.correct.mean(axis=1) for t in aligned]

  def _positions(self, step: int) -> np.ndarray:
    """Pool positions of the step's ``rounds x per_step`` prompts (epochs reshuffled)."""
    size, count = self.pool.size, self.rounds * self.per_step
    positions = np.arange(step * count, (step + 1) * count)
    out = np.empty(count, np.int64)
    for epoch in np.unique(positions // size):
      order = np.random.Generator(np.random.PCG64([self.seed, 11, int(epoch)])).permutation(size)
      here = positions // size == epoch
      out[here] = self.pool[order[positions[here] % size]]
    return out

  def draw(self, step: int) -> list[dict[str, np.ndarray]]:
    rows = self._positions(step)
    rng = np.random.Generator(np.random.PCG64([self.seed, step]))
    x = step / max(self.steps - 1, 1)
    source = (rng.random(rows.size) < x).astype(np.int64) if len(self.traces) > 1 \
        else np.zeros(rows.size, np.int64)
    k = self.traces[0].responses
    picks = np.argsort(rng.random((rows.size, k)), axis=1)[:, :self.max_g]
    pick = lambda arrays: np.stack([arrays[s][r, c] for s, r, c in zip(source, rows, picks)])
    world = {
        "ids": self.traces[0].ids[rows],
        "prompt_tokens": self.traces[0].prompt_tokens[rows],
        "pass_rate": np.array([self.pass_rate[s][r] for s, r in zip(source, rows)]),
        "lengths": pick(self.lengths),
        "passed": pick([t.correct for t in self.traces]),
        "rewards": pick([t.rewards for t in self.traces]),
    }
    m = self.per_step
    return [{key: value[i * m:(i + 1) * m] for key, value in world.items()}
            for i in range(self.rounds)]


class Settings(dict):
  """A config section as the simulators read one: keys as items and as attributes."""

  __getattr__ = dict.__getitem__

  def to_dict(self) -> dict[str, Any]:
    return dict(self)


def replay_config(controller: dict[str, Any], rollout: dict[str, Any], steps: int
                  ) -> Settings:
  """The ``controller`` and ``sim`` sections ``simulator.build_arms`` builds the arms
  from (``sim`` holds the rollout budget P(G) and the steps)."""
  return Settings(controller=Settings(controller), sim=Settings(rollout, steps=steps))


def _step(ctrl, rounds: list[dict[str, np.ndarray]], sim: Any, cost: CostFn,
          dapo: bool, cap: int) -> dict[str, float]:
  """One step of ``ctrl`` on the step's rounds: plan, sample, (filter), price, observe."""
  first = rounds[0]
  plan = ctrl.plan(lambda: BatchContext(first["ids"], first["prompt_tokens"]))
  g = plan.group_size
  target = prompts_for(sim, g)
  seen = {key: [] for key in ("max", "median", "pass", "ids", "sizes")}
  priced, kept, signal, informative = [], 0, 0.0, 0.0
  for i, world in enumerate(rounds if dapo else rounds[:1]):
    sizes = plan.sizes if (i == 0 and plan.sizes is not None) else np.full(target, g)
    k = sizes.size
    groups = group_stats(world, sizes)
    for key in ("max", "median", "pass"):
      seen[key].append(groups[key])
    seen["ids"].append(world["ids"][:k])
    seen["sizes"].append(sizes)
    priced.append((np.concatenate([world["lengths"][j, :s] for j, s in enumerate(sizes)]),
                   world["prompt_tokens"][:k]))
    keep = np.ones(k, bool)
    if dapo:
      varied = np.array([np.ptp(world["rewards"][j, :s]) > 0 for j, s in enumerate(sizes)])
      keep = varied & (np.cumsum(varied) <= target - kept)
    p = world["pass_rate"][:k]
    signal += float(np.sum((4.0 * p * (1.0 - p) * np.log2(sizes))[keep]))
    informative += float(np.sum((1.0 - p ** sizes - (1.0 - p) ** sizes)[keep]))
    kept += int(keep.sum())
    if kept >= target:
      break
  join = lambda key: np.concatenate(seen[key])
  metrics = ctrl.observe_step(StepGroups(join("max"), join("median"), prompt_ids=join("ids"),
                                         pass_rates=join("pass"), group_sizes=join("sizes")))
  rows = float(sum(lengths.size for lengths, _ in priced))
  metrics.update(cost(priced), signal=signal, informative=informative, rows=rows,
                 rounds=float(len(priced)), controller_s=0.0,
                 capped=float(max(lengths.max() for lengths, _ in priced) >= cap),
                 real_tokens=float(sum(lengths.sum() for lengths, _ in priced)),
                 padded_tokens=float(sum(lengths.size * lengths.max() for lengths, _ in priced)))
  return metrics


def replay(traces: Sequence[Trace], config: Any, cost: CostFn, *, dapo: bool = False,
           max_rounds: int = 3, kinds: Sequence[str] = ARMS, seed: int = 0,
           bootstrap: bool = False, length_scale: float = 1.0,
           length_cap: int | None = None, arms: Sequence[tuple[str, Any]] | None = None
           ) -> dict[str, Any]:
  """One replicate: every static G and every controller kind of ``kinds`` (or the
  given ``arms``) on the same replayed steps; per-arm summaries and per-step columns
  in the layout of ``prompt_simulator.simulate_prompts``."""
  sim = config.sim
  arms = list(arms) if arms is not None else build_arms(config, kinds)
  candidates = sorted(config.controller.candidates)
  world = TraceWorld(traces, per_step=max(prompts_for(sim, g) for g in candidates),
                     rounds=max_rounds if dapo else 1, max_g=max(candidates), steps=sim.steps,
                     seed=seed, bootstrap=bootstrap, length_scale=length_scale,
                     length_cap=length_cap)
  columns, elapsed = run_lockstep(arms, sim.steps, world.draw,
                                  lambda ctrl, rounds: _step(ctrl, rounds, sim, cost, dapo,
                                                                    world.cap))
  summary = {name: summarise_arm(col) for name, col in columns.items()}
  add_equal_budget_metrics(summary, columns)
  for name, col in columns.items():
    summary[name]["rounds_per_step"] = float(np.mean(col["rounds"]))
    summary[name]["seconds_per_signal"] = (summary[name]["wall_clock_s"]
                                           / max(summary[name]["signal"], 1e-12))
  return {"summary": summary, "seconds": elapsed, "traces": columns}


def replicate_table(summaries: Sequence[dict[str, dict[str, float]]], reference: str,
                    keys: Sequence[str]) -> dict[str, dict[str, float]]:
  """Per arm and key: the mean over replicates and a 95% percentile interval, and the
  paired ratio to ``reference`` of ``time_to_target_s`` and ``seconds_per_signal``
  (each replicate's arms share their steps)."""
  out: dict[str, dict[str, float]] = {}
  for arm in summaries[0]:
    row: dict[str, float] = {}
    series = {key: [s[arm][key] for s in summaries] for key in keys}
    for key in ("time_to_target_s", "seconds_per_signal"):
      series[f"{key}_vs_{reference}"] = [s[arm][key] / s[reference][key] for s in summaries]
    for key, values in series.items():
      values = np.asarray(values, np.float64)
      row[key] = float(values.mean())
      row[f"{key}_low"], row[f"{key}_high"] = (float(v) for v in np.percentile(values,
                                                                               [2.5, 97.5]))
    out[arm] = row
  return out
