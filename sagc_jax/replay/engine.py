"""The replay engine: every group-size controller, in lock-step, on one world
(``replay.worlds``: synthetic lengths, a prompt pool or recorded traces), priced by
one cost interface.

It answers the question ``simulate``, ``simulate --trace`` and ``calibrate`` ask
(which controller spends a step's time best on these rollouts?) before a user spends
accelerator hours:

* Arms: every static G of the candidates, then each controller kind asked for, then
  SAGC at each (tau, delta) of a grid, all built by ``build_arms`` from one complete
  controller section (``config.ControllerSection.to_dict()``: the section alone holds
  the defaults).
* One step (``play_step``): the controller plans on the next prompts, samples rounds
  of P(G) prompts (a size per prompt where the plan has them), and with DAPO keeps
  only groups whose rewards vary, sampling further rounds until P(G) groups are kept
  or ``max_rounds`` ran (``dapo.keep_informative``, the trainer's rule). Every round
  is priced and observed, as in the trainer.
* Two ways of changing G: ``hold_rollouts`` (rows per step fixed, prompts = rollouts /
  G) and ``hold_prompts`` (prompts fixed, rows = prompts * G), ``budget.prompts_for``.
* Cost: any ``replay.costs.CostFn`` (``cost(rounds, trained) -> {"rollout_s",
  "learner_s", "total_s"}``): the synthetic ``CostModel``, a trace's measured CPU cost
  ``DecodeCost`` or a preset's compiled programs ``CompiledStepCost``.

Learning-signal measures (``MEASURES``), per step over the trained groups, where the
world knows the prompts' pass rates ``p`` and the drawn rewards ``r``:

* ``utility`` (column ``signal``) ``= sum 4 p (1 - p) log2 G``: SAGC's utility log2 G
  of a group (SAGC paper), weighted by the prompt's reward variance (GRPO's
  normalised advantages carry a gradient only where the rewards vary; 1 at p = 1/2,
  0 for a prompt always or never solved);
* ``informative_groups`` (column ``informative``): groups whose rewards vary (DAPO:
  those it kept; GRPO: their expectation ``sum 1 - p^G - (1 - p)^G``);
* ``informative_rows``: the rows of the groups whose drawn rewards vary, the rows
  that get a nonzero GRPO advantage;
* ``advantage_mass``: ``sum |A|`` over those rows, ``A`` GRPO's default advantage
  ``(r - mean) / (std + 1e-6)`` of the drawn rewards (unbiased std, as
  ``rl.losses.group_advantages``; not Dr. GRPO's unnormalised one, and before DAPO's
  overlong shaping): the total weight the policy gradient puts on sampled tokens'
  log-probabilities.

None is a training outcome; they rank how well a controller spends rows, and
``docs/results.md`` checks each against measured learning.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sagc_jax.control.budget import prompts_for
from sagc_jax.control.context import BatchContext
from sagc_jax.control.controller import arm_name, controller_from_config
from sagc_jax.control.dapo import keep_informative
from sagc_jax.control.pass_rates import informative_groups
from sagc_jax.control.protocol import StepGroups, StepTime
from sagc_jax.control.stragglers import step_straggler_stats

__all__ = ["MEASURES", "best_fixed_mixture", "build_arms", "play_step", "run", "sagc_arm_name",
           "summarise"]

# Measure name -> its per-step column.
MEASURES = {"utility": "signal", "informative_groups": "informative",
            "informative_rows": "informative_rows", "advantage_mass": "advantage_mass"}


def sagc_arm_name(tau: float, delta: float) -> str:
  return f"sagc_tau{tau:g}_delta{delta:g}"


def build_arms(section: Mapping[str, Any], kinds: Sequence[str] = ("sagc",), *,
               prompts_for: Callable[[int], int] | None = None,
               grid: Sequence[tuple[float, float]] = ()) -> list[tuple[str, Any]]:
  """Every static G of ``section["candidates"]`` (``static_G<g>``), then one arm per
  controller kind of ``kinds`` (a registry name or ``module:Class``, the arm named by
  ``control.controller.arm_name``), then SAGC at each ``(tau, delta)`` of ``grid``
  (``sagc_tau<t>_delta<d>``), all from the one complete controller ``section``
  (``ControllerSection.to_dict()``); ``prompts_for`` is P(G) for the contextual kinds."""
  arms = [(f"static_G{g}", controller_from_config(dict(section, kind="static", static_g=g,
                                                       candidates=(g,))))
          for g in sorted(section["candidates"])]
  arms += [(arm_name(kind), controller_from_config(dict(section, kind=kind),
                                                   prompts_for=prompts_for)) for kind in kinds]
  arms += [(sagc_arm_name(tau, delta), controller_from_config(
      dict(section, kind="sagc", tau=float(tau), delta=float(delta)))) for tau, delta in grid]
  return arms


def group_stats(block: dict[str, Any], sizes: np.ndarray) -> dict[str, Any]:
  """Per-group max / median length (and pass rate), response lengths (``rows``), prompt
  id and size of the block's first len(sizes) prompts, each group its first ``G_i``
  responses."""
  k = sizes.size
  out = {name: np.empty(k) for name in ("max", "median", "pass")}
  for g in np.unique(sizes):
    rows = np.flatnonzero(sizes == g)
    out["max"][rows] = block["lengths"][rows, :g].max(axis=1)
    out["median"][rows] = np.median(block["lengths"][rows, :g], axis=1)
    if block["passed"] is not None:
      out["pass"][rows] = block["passed"][rows, :g].mean(axis=1)
  out.update(rows=[block["lengths"][j, :s] for j, s in enumerate(sizes)],
             ids=block["ids"][:k], sizes=sizes)
  return out


def _sampled(block: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
  """The block's prompts that ``keep`` marks, in order (``keep`` covers its first
  ``keep.size`` prompts)."""
  rows = np.flatnonzero(keep)
  return {key: value if value is None or np.ndim(value) == 0 else np.asarray(value)[rows]
          for key, value in block.items()}


def _drawn_signal(rewards: np.ndarray) -> tuple[int, float]:
  """(informative rows, advantage mass) of one group's drawn rewards (module docstring)."""
  if np.ptp(rewards) == 0:
    return 0, 0.0
  centered = rewards - rewards.mean()
  return rewards.size, float(np.abs(centered / (centered.std(ddof=1) + 1e-6)).sum())


def play_step(ctrl: Any, world: Any, step: int, cursor: int, *, budget: Any, per_step: int,
              cost: Callable, measure: tuple[float, str], dapo: bool = False,
              max_rounds: int = 1, progress: float | None = None
              ) -> tuple[dict[str, float], int]:
  """One step of ``ctrl`` with its loader at ``cursor`` (module docstring), at training
  ``progress`` in [0, 1] (None: the world's own, from the step), its stragglers
  measured at ``measure = (tau, event)``. The step is priced first, then observed with
  its priced seconds, as the trainer observes a step it has timed. Returns the step's
  metrics and the loader's new position."""
  first = world.block(cursor, per_step, step, progress)
  if getattr(ctrl, "sees_world", False):       # the oracle arm (replay.oracle)
    ctrl.see(first)
  started = time.perf_counter()
  plan = ctrl.plan(lambda: BatchContext(first["ids"], first["prompt_tokens"]))
  seconds = time.perf_counter() - started
  g = plan.group_size
  target = prompts_for(budget, g)
  seen = {key: [] for key in ("max", "median", "pass", "ids", "sizes", "rewards")}
  trained, kept, signal, informative = [], 0, 0.0, 0.0
  drawn = np.zeros(2)                                  # informative rows, advantage mass
  rounds = []                                # per round: its groups' rows, prompt tokens
  for i in range(max_rounds if dapo else 1):
    sizes = plan.sizes if (i == 0 and plan.sizes is not None) else np.full(target, g)
    block = first if i == 0 else world.block(cursor, sizes.size, step, progress)
    cursor += sizes.size
    if not sizes.all():          # skipped prompts (size 0): consumed, not sampled
      block = _sampled(block, sizes > 0)
      sizes = sizes[sizes > 0]
    k = sizes.size
    groups = group_stats(block, sizes)
    for key in ("max", "median", "pass", "ids", "sizes"):
      seen[key].append(groups[key])
    rows = groups["rows"]
    rounds.append((rows, block["prompt_tokens"][:k]))
    keep = np.ones(k, bool)
    if dapo:
      varied = np.array([np.ptp(block["rewards"][j, :s]) > 0 for j, s in enumerate(sizes)])
      keep = keep_informative(varied, sizes, target - kept)
    if block["pass_rate"] is not None:
      p = block["pass_rate"][:k]
      signal += float(np.sum((4.0 * p * (1.0 - p) * np.log2(sizes))[keep]))
      # Groups whose rewards vary: DAPO keeps only those; for GRPO, their expectation.
      informative += float(keep.sum()) if dapo else informative_groups(p, sizes)
    trained += [(rows[j], int(block["prompt_tokens"][j])) for j in np.flatnonzero(keep)]
    if block["rewards"] is not None:
      seen["rewards"] += [block["rewards"][j, :s] for j, s in enumerate(sizes)]
      for j in np.flatnonzero(keep):
        drawn += _drawn_signal(block["rewards"][j, :sizes[j]])
    kept += int(keep.sum())
    if kept >= target:
      break
  join = lambda key: np.concatenate(seen[key])
  tau, event = measure
  cut = lambda rows: [np.minimum(r, tau * np.median(r)) for r in rows]   # no stragglers
  priced = [(np.concatenate(rows), prompts) for rows, prompts in rounds]
  priced_cut = [(np.concatenate(cut(rows)), prompts) for rows, prompts in rounds]
  trained_rows, trained_cut = (
      (np.concatenate([r for r, _ in rows]) if rows else np.zeros(0, int),
       np.concatenate([np.full(r.size, t) for r, t in rows]) if rows else np.zeros(0, int))
      for rows in (trained, [(cut([r])[0], t) for r, t in trained]))
  without = cost(priced_cut, trained_cut)
  priced_s = cost(priced, trained_rows)
  metrics = step_straggler_stats(join("max"), join("median"), join("sizes"), tau=tau,
                                 event=event)
  started = time.perf_counter()
  metrics.update(ctrl.observe_step(StepGroups(
      join("max"), join("median"), prompt_ids=join("ids"),
      pass_rates=join("pass") if first["passed"] is not None else None,
      group_sizes=join("sizes"), rewards=seen["rewards"] if first["rewards"] is not None
      else None, time=StepTime(**priced_s))))
  metrics.update(controller_s=seconds + time.perf_counter() - started,
                 rollout_cut_s=without["rollout_s"], total_cut_s=without["total_s"], **priced_s,
                 rows=float(sum(lengths.size for lengths, _ in priced)),
                 rounds=float(len(priced)),
                 capped=float(max(lengths.max() for lengths, _ in priced) >= world.cap),
                 real_tokens=float(sum(lengths.sum() for lengths, _ in priced)),
                 padded_tokens=float(sum(lengths.size * lengths.max() for lengths, _ in priced)))
  if first["pass_rate"] is not None:
    metrics.update(signal=signal, informative=informative)
  if first["rewards"] is not None:
    metrics.update(informative_rows=float(drawn[0]), advantage_mass=float(drawn[1]))
  return metrics, cursor


def run(arms: Sequence[tuple[str, Any]], world: Any, *, steps: int, budget: Any,
        candidates: Sequence[int], cost: Callable, measure: tuple[float, str],
        dapo: bool = False, max_rounds: int = 1,
        horizon_s: float | None = None) -> dict[str, Any]:
  """Every arm on every step of ``world`` (common random numbers), its stragglers
  measured at ``measure = (tau, event)`` whatever the arm's own tau: per arm its
  per-step columns and ``summary`` (``summarise``), and the seconds it all took.
  DAPO's further rounds need a world with rewards whose arms have their own loaders (a
  trace).

  With ``horizon_s`` every arm runs until its priced time reaches it (at most
  ``steps`` steps), training progress is the fraction of the horizon spent (the
  drift between two traces follows time, not steps), and the summary gives each
  measure at the horizon (``<measure>_at_h``; nan for an arm the step cap stopped
  short of it)."""
  if dapo and world.shared_loader:
    raise ValueError(f"DAPO rounds need new prompts per arm: the {type(world).__name__} "
                     "hands every arm the step's prompts (replay a trace instead)")
  # A kind that skips prompts looks further ahead (``needs.peek``).
  per_step = max(prompts_for(budget, g) for g in candidates) * max(
      getattr(getattr(ctrl, "needs", None), "peek", 1) for _, ctrl in arms)
  cursors = {name: 0 for name, _ in arms}
  traces = {name: [] for name, _ in arms}
  started = time.perf_counter()
  elapsed = {name: 0.0 for name, _ in arms}
  for step in range(steps):
    for name, ctrl in arms:
      if horizon_s is not None and elapsed[name] >= horizon_s:
        continue
      cursor = step * per_step if world.shared_loader else cursors[name]
      progress = None if horizon_s is None else elapsed[name] / horizon_s
      metrics, cursors[name] = play_step(ctrl, world, step, cursor, budget=budget,
                                         per_step=per_step, cost=cost, measure=measure,
                                         dapo=dapo, max_rounds=max_rounds, progress=progress)
      elapsed[name] += metrics["total_s"]
      traces[name].append(metrics)
  seconds = time.perf_counter() - started
  columns = {name: {key: [r[key] for r in rows] for key in rows[0]}
             for name, rows in traces.items()}
  summary = {name: summarise(col) for name, col in columns.items()}
  if "signal" in next(iter(columns.values())):
    add_equal_budget_metrics(summary, columns)
  if horizon_s is not None:
    for name, col in columns.items():
      wall = np.concatenate([[0.0], np.cumsum(col["total_s"])])
      for measure, key in MEASURES.items():
        if key in col:
          value = np.interp(horizon_s, wall, np.concatenate([[0.0], np.cumsum(col[key])]))
          summary[name][f"{measure}_at_h"] = float(value) if wall[-1] >= horizon_s else math.nan
  return {"summary": summary, "seconds": seconds, "traces": columns}


def summarise(col: dict[str, list[float]]) -> dict[str, float]:
  """An arm's totals and means over its steps."""
  mean = lambda key: float(np.mean(col[key]))
  total = lambda key: float(np.sum(col[key]))
  out = {
      "straggler_rate": mean("straggler_rate"),
      "group_straggler_rate": mean("group_straggler_rate"),
      "step_straggler_rate": mean("step_straggler"),
      "wall_clock_s": total("total_s"),
      "rollout_s": total("rollout_s"),
      "learner_s": total("learner_s"),
      "mean_g": mean("g"),                                    # over steps
      "mean_group_g": total("rows") / total("n_groups"),      # over groups
      "mean_log2_g": mean("log2_g"),
      "padding_efficiency": total("real_tokens") / total("padded_tokens"),
      "rows": total("rows"),
      "rounds_per_step": mean("rounds"),
      "controller_us": 1e6 * mean("controller_s"),
      # The share of rollout time the stragglers cost: every row above tau x its
      # group's median cut to that length, priced again.
      "straggler_share": 1.0 - total("rollout_cut_s") / max(total("rollout_s"), 1e-12),
      "straggler_step_share": 1.0 - total("total_cut_s") / max(total("total_s"), 1e-12),
      "rollout_cut_s": total("rollout_cut_s"),
  }
  if "signal" in col:
    out.update(signal=total("signal"), informative_groups=total("informative"))
    out["seconds_per_signal"] = out["wall_clock_s"] / max(out["signal"], 1e-12)
  if "advantage_mass" in col:
    out.update(informative_rows=total("informative_rows"),
               advantage_mass=total("advantage_mass"))
  return out


def add_equal_budget_metrics(summary: dict[str, dict[str, float]],
                             columns: dict[str, dict[str, list[float]]]) -> None:
  """Wall-clock to the smallest final signal of any arm, and signal at the shortest
  run's wall-clock (linear interpolation within a step)."""
  cumulative = lambda values: np.concatenate([[0.0], np.cumsum(values)])
  curves = {name: (cumulative(col["total_s"]), cumulative(col["signal"]))
            for name, col in columns.items()}
  target = min(s[-1] for _, s in curves.values())
  budget = min(w[-1] for w, _ in curves.values())
  for name, (wall, signal) in curves.items():
    summary[name].update(time_to_target_s=float(np.interp(target, signal, wall)),
                         signal_at_equal_time=float(np.interp(budget, wall, signal)),
                         target_signal=float(target), equal_time_s=float(budget))


def best_fixed_mixture(candidates: Sequence[int], rates: Sequence[float],
                       delta: float) -> float | None:
  """Best mean log2 G of any fixed randomised choice of G with rate <= delta.

  Solves ``max sum_k w_k log2 G_k  s.t.  sum_k w_k p_k <= delta, w in simplex``
  given each static arm's measured straggler rate ``p_k``. A two-constraint LP
  has an optimal vertex using at most two arms, so checking every single arm
  and every pair straddling ``delta`` is exact. Returns None when no mixture is
  feasible.
  """
  points = list(zip(rates, np.log2(np.asarray(candidates, dtype=np.float64))))  # (p_k, u_k)
  values = [u for p, u in points if p <= delta]
  for lo, hi in (sorted(pair) for pair in itertools.combinations(points, 2)):
    if lo[0] < delta < hi[0]:
      w = (delta - lo[0]) / (hi[0] - lo[0])
      values.append((1 - w) * lo[1] + w * hi[1])
  return float(max(values)) if values else None
