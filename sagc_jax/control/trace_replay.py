"""Replays recorded rollouts (``control.trace``) through every controller, priced by a
cost model the caller passes in.

A real model's RL step costs tens of seconds on a CPU, so hundreds of steps of every
controller are out of reach; its rollouts can be recorded once (``python -m
sagc_jax.calibrate``) and replayed thousands of times:

* Loader: the trace's prompts recur epoch after epoch, each epoch a fresh
  permutation, as in training. Each arm has its own loader position, which moves by
  the prompts the arm sampled (P(G) per round), as the trainer's; a contextual kind
  plans on the next ``M = max_G P(G)`` prompts. Arms at the same position see the
  same prompts and responses (common random numbers).
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
* Replicates: each replicate reseeds the replay (and the caller reseeds the
  controllers) and resamples the trace's prompts with replacement (a bootstrap by
  prompt), so the intervals over replicates hold the replay's and the controllers'
  randomness and the trace's own sampling error.

Learning signal (as in ``prompt_simulator``): ``sum over kept groups of
4 p (1 - p) log2 G``, ``p`` the prompt's pass rate over all its recorded responses.

The cost model is any callable ``cost(rounds, trained) -> {"rollout_s", "learner_s",
"total_s"}``: ``rounds`` are the step's sampling rounds, each ``(lengths of its rows,
its prompts' token lengths)``, and ``trained`` the rows the learner trains (``(their
response lengths, their prompts' token lengths)``, one entry per row); ``DecodeCost`` (the trace's measured CPU decode cost) is here, the
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
           "replay_settings", "replicate_table"]

ARMS = ("sagc", "prompt_aware", "per_prompt")
Rounds = Sequence[tuple[np.ndarray, np.ndarray]]
CostFn = Callable[[Rounds, tuple[np.ndarray, np.ndarray]], dict[str, float]]


@dataclasses.dataclass(frozen=True)
class DecodeCost:
  """A trace's measured CPU decode cost (``trace_sampling.fit_decode_cost``): a sampling
  round runs until its longest row is done, each decode step costing ``step_s`` plus
  ``slot_s`` per row still decoding (finished rows are compacted away), so a round
  costs ``step_s x longest + slot_s x sum(lengths)``. No learner cost: calibration does
  not measure it."""

  step_s: float
  slot_s: float
  name: str = "cpu"

  @classmethod
  def of(cls, trace: Trace) -> "DecodeCost":
    fit = trace.header.get("decode_cost") or {}
    if "step_s" not in fit:
      raise ValueError("the trace's header holds no decode_cost with step_s and slot_s: the "
                       "'cpu' cost model needs a trace written by python -m sagc_jax.calibrate")
    return cls(float(fit["step_s"]), float(fit["slot_s"]))

  def settings(self, trace: Trace) -> dict[str, Any]:
    """What a replay under this cost takes from the trace's run: its rollout budget,
    candidate sizes and DAPO rounds limit, lengths as recorded."""
    return replay_settings(trace)

  def __call__(self, rounds: Rounds, trained: Any = None) -> dict[str, float]:
    rollout = sum(self.step_s * int(lengths.max()) + self.slot_s * float(lengths.sum())
                  for lengths, _ in rounds)
    return {"rollout_s": rollout, "learner_s": 0.0, "total_s": rollout}


def replay_settings(trace: Trace, **changes: Any) -> dict[str, Any]:
  """The replay settings of a trace's run (``rollout``, ``candidates``, ``max_rounds``,
  ``length_scale``, ``length_cap``), with ``changes`` (a cost model's own budget)."""
  header = trace.header
  out = dict(rollout=dict(header["rollout"]),
             candidates=sorted(header["controller"]["candidates"]),
             max_rounds=int(header.get("learner", {}).get("dynamic_max_rounds", 3)),
             length_scale=1.0, length_cap=trace.max_new_tokens)
  out.update(changes)
  return out


class TraceWorld:
  """The loader and the rollouts of one replicate (module docstring).

  ``block(start, count, step)``: the prompts at loader positions ``start ..
  start + count - 1`` as a dict of ``ids``, ``prompt_tokens``, ``pass_rate`` [count]
  and ``lengths``, ``passed``, ``rewards`` [count, max_g], at training progress
  ``step``. Everything at a position (its prompt, its source trace's draw, its
  responses) is fixed by ``seed`` and the position, so arms whose loaders stand at the
  same position see the same rollouts (common random numbers). ``bootstrap``
  resamples the trace's prompts once for the replicate.
  """

  def __init__(self, traces: Sequence[Trace], *, max_g: int, steps: int, seed: int,
               bootstrap: bool = False, length_scale: float = 1.0,
               length_cap: int | None = None):
    first = traces[0]
    if first.responses < max_g:
      raise ValueError(f"the trace holds {first.responses} responses per prompt, fewer than "
                       f"the largest group size {max_g}")
    aligned = [first]
    for other in traces[1:]:
      where = {int(i): r for r, i in enumerate(other.ids)}
      missing = [int(i) for i in first.ids if int(i) not in where]
      if missing or other.responses != first.responses:
        raise ValueError(f"the second trace must hold the first one's {first.prompts} prompts "
                         f"with {first.responses} responses each, like the first (it holds "
                         f"{other.responses}; missing ids: {missing[:5]})")
      aligned.append(other.take([where[int(i)] for i in first.ids]))
    self.traces, self.max_g, self.steps, self.seed = aligned, max_g, steps, seed
    n = first.prompts
    rng = np.random.Generator(np.random.PCG64([seed, 1, 5]))
    self.pool = rng.integers(0, n, n) if bootstrap else np.arange(n)
    self.cap = cap = length_cap or max(t.max_new_tokens for t in aligned)
    self.lengths = [np.clip(np.rint(t.lengths * length_scale), 1, cap).astype(np.int64)
                    for t in aligned]
    self.pass_rate = [t.correct.mean(axis=1) for t in aligned]
    self._epochs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

  def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An epoch's prompt order, per position a uniform draw (which trace) and the
    order of its responses (the first G are its group)."""
    if epoch not in self._epochs:
      if len(self._epochs) > 64:
        self._epochs.clear()
      size, k = self.pool.size, self.traces[0].responses
      order = np.random.Generator(np.random.PCG64([self.seed, 11, epoch])).permutation(size)
      rng = np.random.Generator(np.random.PCG64([self.seed, 13, epoch]))
      self._epochs[epoch] = (self.pool[order], rng.random(size),
                             np.argsort(rng.random((size, k)), axis=1)[:, :self.max_g])
    return self._epochs[epoch]

  def block(self, start: int, count: int, step: int) -> dict[str, np.ndarray]:
    size = self.pool.size
    positions = np.arange(start, start + count)
    rows, uniform = np.empty(count, np.int64), np.empty(count)
    picks = np.empty((count, self.max_g), np.int64)
    for epoch in np.unique(positions // size):
      here = positions // size == epoch
      order, u, order_k = self._epoch(int(epoch))
      rows[here], uniform[here], picks[here] = (a[positions[here] % size]
                                                for a in (order, u, order_k))
    x = step / max(self.steps - 1, 1)
    source = (uniform < x).astype(np.int64) if len(self.traces) > 1 else np.zeros(count, int)
    pick = lambda arrays: np.stack([arrays[s][r, c] for s, r, c in zip(source, rows, picks)])
    return {
        "ids": self.traces[0].ids[rows],
        "prompt_tokens": self.traces[0].prompt_tokens[rows],
        "pass_rate": np.array([self.pass_rate[s][r] for s, r in zip(source, rows)]),
        "lengths": pick(self.lengths),
        "passed": pick([t.correct for t in self.traces]),
        "rewards": pick([t.rewards for t in self.traces]),
    }


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


def _step(ctrl, world: TraceWorld, step: int, cursor: int, sim: Any, cost: CostFn,
          dapo: bool, max_rounds: int, per_step: int) -> tuple[dict[str, float], int]:
  """One step of ``ctrl`` with its loader at ``cursor``: plan on the next ``per_step``
  prompts, sample rounds of P(G) prompts (DAPO: until P(G) groups with varied rewards
  are kept), price them, observe every round. Returns the metrics and the new cursor."""
  first = world.block(cursor, per_step, step)
  plan = ctrl.plan(lambda: BatchContext(first["ids"], first["prompt_tokens"]))
  g = plan.group_size
  target = prompts_for(sim, g)
  seen = {key: [] for key in ("max", "median", "pass", "ids", "sizes")}
  priced, trained, kept, signal, informative = [], [], 0, 0.0, 0.0
  for i in range(max_rounds if dapo else 1):
    sizes = plan.sizes if (i == 0 and plan.sizes is not None) else np.full(target, g)
    k = sizes.size
    block = first if i == 0 else world.block(cursor, k, step)
    cursor += k
    groups = group_stats(block, sizes)
    for key in ("max", "median", "pass"):
      seen[key].append(groups[key])
    seen["ids"].append(block["ids"][:k])
    seen["sizes"].append(sizes)
    rows = [block["lengths"][j, :s] for j, s in enumerate(sizes)]
    priced.append((np.concatenate(rows), block["prompt_tokens"][:k]))
    keep = np.ones(k, bool)
    if dapo:
      varied = np.array([np.ptp(block["rewards"][j, :s]) > 0 for j, s in enumerate(sizes)])
      keep = varied & (np.cumsum(varied) <= target - kept)
    p = block["pass_rate"][:k]
    signal += float(np.sum((4.0 * p * (1.0 - p) * np.log2(sizes))[keep]))
    # Groups whose rewards vary: DAPO keeps only those; for GRPO, their expectation.
    informative += float(keep.sum()) if dapo else float(
        np.sum(1.0 - p ** sizes - (1.0 - p) ** sizes))
    trained += [(rows[j], int(block["prompt_tokens"][j])) for j in np.flatnonzero(keep)]
    kept += int(keep.sum())
    if kept >= target:
      break
  join = lambda key: np.concatenate(seen[key])
  metrics = ctrl.observe_step(StepGroups(join("max"), join("median"), prompt_ids=join("ids"),
                                         pass_rates=join("pass"), group_sizes=join("sizes")))
  trained_rows = (np.concatenate([r for r, _ in trained]) if trained else np.zeros(0, int),
                  np.concatenate([np.full(r.size, t) for r, t in trained]) if trained
                  else np.zeros(0, int))
  metrics.update(cost(priced, trained_rows), signal=signal, informative=informative,
                 rows=float(sum(lengths.size for lengths, _ in priced)),
                 rounds=float(len(priced)), controller_s=0.0,
                 capped=float(max(lengths.max() for lengths, _ in priced) >= world.cap),
                 real_tokens=float(sum(lengths.sum() for lengths, _ in priced)),
                 padded_tokens=float(sum(lengths.size * lengths.max() for lengths, _ in priced)))
  return metrics, cursor


def replay(traces: Sequence[Trace], config: Any, cost: CostFn, *, dapo: bool = False,
           max_rounds: int = 3, kinds: Sequence[str] = ARMS, seed: int = 0,
           bootstrap: bool = False, length_scale: float = 1.0,
           length_cap: int | None = None, arms: Sequence[tuple[str, Any]] | None = None
           ) -> dict[str, Any]:
  """One replicate: every static G and every controller kind of ``kinds`` (or the
  given ``arms``) on the same replayed steps, each arm with its own loader (it moves
  by the prompts the arm sampled, as the trainer's); per-arm summaries and per-step
  columns in the layout of ``prompt_simulator.simulate_prompts``."""
  sim = config.sim
  arms = list(arms) if arms is not None else build_arms(config, kinds)
  candidates = sorted(config.controller.candidates)
  world = TraceWorld(traces, max_g=max(candidates), steps=sim.steps, seed=seed,
                     bootstrap=bootstrap, length_scale=length_scale, length_cap=length_cap)
  per_step = max(prompts_for(sim, g) for g in candidates)
  cursors = {id(ctrl): 0 for _, ctrl in arms}

  def step_metrics(ctrl, step):
    metrics, cursors[id(ctrl)] = _step(ctrl, world, step, cursors[id(ctrl)], sim, cost, dapo,
                                       max_rounds, per_step)
    return metrics

  columns, elapsed = run_lockstep(arms, sim.steps, lambda step: step, step_metrics)
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
