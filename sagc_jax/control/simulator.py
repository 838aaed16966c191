"""Rollout-length simulator and synchronous step cost model for tuning SAGC.

Runs the group-size controllers without any model so that users can study the
``tau``/``delta`` trade-off before spending accelerator hours:

* ``LengthProcess``: heavy-tailed response lengths whose spread grows over
  training (log-normal body with a growing sigma, plus a growing probability of
  "re-check the work" tails that multiply a response's length), truncated at
  the max response length. Long chain-of-thought RL reports exactly this drift:
  mean length and its variance rise as the policy learns to reflect.
* ``CostModel``: one synchronous step = prefill + a lock-step decode that runs
  until the longest response of the step is done (decode time grows with the
  step's max length, not its mean) + a learner pass over the padded tokens.
* Arms: every static G in the candidate set and SAGC, simulated in lock-step
  on common random numbers: each step draws one length matrix of
  ``max_prompts x max(G)`` and an arm with G prompts/size reads its top-left
  block, so differences between arms are the controller's, not the dice's.
* Two ways of changing G: ``hold_rollouts`` (rows per step fixed, prompts =
  rollouts / G) and ``hold_prompts`` (prompts fixed, rows = prompts * G).

``python -m sagc_jax.simulate`` runs the default config in seconds, prints the
comparison table, and writes ``--out`` (JSON) and ``--plot`` (PNG).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Sequence

import numpy as np

from sagc_jax.base import checks
from sagc_jax.control.budget import ROLLOUT_MODES, prompts_for
from sagc_jax.control.controller import StaticController, controller_from_config
from sagc_jax.control.protocol import StepGroups


@dataclasses.dataclass(frozen=True)
class LengthProcess:
  """Heavy-tailed response lengths that drift over training.

  Length of response j of prompt i at step t (progress ``x = t / (steps-1)``)::

      L = clip(round(m(x) * d_i * exp(s(x) * z_ij) * T_ij), 1, max_len)

  with ``m`` the median length, ``d_i ~ LogNormal(0, prompt_sigma)`` the prompt
  difficulty (shared by the group, so it cancels in max/median), ``z_ij`` a
  standard normal with spread ``s(x)``, and ``T_ij`` = 1 or, with probability
  ``q(x)``, a tail factor ~ Uniform[tail_factor_min, tail_factor_max] (the
  response re-checks its work several times). ``m``, ``s`` and ``q`` move
  linearly from their ``*_start`` to their ``*_end`` values.
  """

  steps: int
  max_len: int
  median_start: float
  median_end: float
  sigma_start: float
  sigma_end: float
  tail_prob_start: float
  tail_prob_end: float
  tail_factor_min: float
  tail_factor_max: float
  prompt_sigma: float
  seed: int

  def draw(self, step: int, prompts: int, group: int) -> np.ndarray:
    """Lengths of step ``step`` as an int matrix ``[prompts, group]``.

    Deterministic in ``(seed, step)``; arms read top-left blocks of the same
    matrix (common random numbers).
    """
    x = step / max(self.steps - 1, 1)
    lerp = lambda a, b: a + (b - a) * x
    median = lerp(self.median_start, self.median_end)
    sigma = lerp(self.sigma_start, self.sigma_end)
    tail_prob = lerp(self.tail_prob_start, self.tail_prob_end)
    rng = np.random.Generator(np.random.PCG64([self.seed, step]))
    difficulty = np.exp(self.prompt_sigma * rng.standard_normal((prompts, 1)))
    body = np.exp(sigma * rng.standard_normal((prompts, group)))
    tail = rng.random((prompts, group)) < tail_prob
    factor = rng.uniform(self.tail_factor_min, self.tail_factor_max, (prompts, group))
    lengths = median * difficulty * body * np.where(tail, factor, 1.0)
    return np.clip(np.rint(lengths), 1, self.max_len).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Wall-clock of one synchronous RL step (seconds).

  * prefill: ``prefill_s_per_token * rows * prompt_len``;
  * decode: every row advances in lock-step until the longest response of the
    step is done, each iteration costing ``decode_s_per_iter +
    decode_s_per_row_iter * rows`` (memory-bound: a fixed weight-streaming
    cost plus a per-row KV-cache cost);
  * learner: ``learner_s_per_token * rows * (prompt_len + max_len_step)``, the
    padded tokens (responses padded to the step's longest);
  * ``step_overhead_s`` for rewards, host work and the optimizer update.
  """

  prefill_s_per_token: float
  decode_s_per_iter: float
  decode_s_per_row_iter: float
  learner_s_per_token: float
  step_overhead_s: float

  def step(self, lengths: np.ndarray, prompt_len: int) -> dict[str, float]:
    """Cost of a step whose response lengths are ``lengths`` (any shape, one per row)."""
    return self.step_rows(lengths.size, int(lengths.max()), float(lengths.sum()), prompt_len)

  def step_rows(self, rows: int, longest: int, real_tokens: float,
                prompt_len: int) -> dict[str, float]:
    """Cost of ``rows`` rows whose longest response is ``longest`` tokens (steps
    with mixed group sizes: only the row count and the longest row matter)."""
    rollout = (self.prefill_s_per_token * rows * prompt_len
               + longest * (self.decode_s_per_iter + self.decode_s_per_row_iter * rows))
    learner = self.learner_s_per_token * rows * (prompt_len + longest)
    return {
        "rollout_s": rollout,
        "learner_s": learner,
        "total_s": rollout + learner + self.step_overhead_s,
        "real_tokens": real_tokens,
        "padded_tokens": float(rows * longest),
    }


def validate_config(config: Any) -> None:
  """Fails fast, naming the key, on any invalid simulator setting."""
  checks.positive_int(config, "sim.steps")
  mode = checks.one_of(config, "sim.mode", ROLLOUT_MODES)
  max_len = checks.positive_int(config, "sim.max_len")
  checks.positive_int(config, "sim.prompt_len")
  for key in ("median_start", "median_end"):
    checks.number_in(config, f"sim.{key}", 1.0, max_len)
  for key in ("sigma_start", "sigma_end", "prompt_sigma"):
    checks.number_in(config, f"sim.{key}", 0.0)
  for key in ("tail_prob_start", "tail_prob_end"):
    checks.number_in(config, f"sim.{key}", 0.0, 1.0)
  low = checks.number_in(config, "sim.tail_factor_min", 1.0)
  high = checks.number_in(config, "sim.tail_factor_max", 1.0)
  if high < low:
    raise ValueError(f"sim.tail_factor_max={high} is below sim.tail_factor_min={low}")
  for field in dataclasses.fields(CostModel):
    checks.number_in(config, f"cost.{field.name}", 0.0)
  checks.group_budget(config, "sim", mode, tuple(checks.lookup(config, "controller.candidates")))


def length_process_from_config(config: Any) -> LengthProcess:
  return LengthProcess(seed=config.seed, **{f.name: config.sim[f.name]
                                            for f in dataclasses.fields(LengthProcess)
                                            if f.name != "seed"})


def cost_model_from_config(config: Any) -> CostModel:
  return CostModel(**{f.name: float(config.cost[f.name]) for f in dataclasses.fields(CostModel)})


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


def build_arms(config: Any, kinds: Sequence[str]) -> list[tuple[str, Any]]:
  """Every static G of ``controller.candidates`` (``static_G<g>``), then one arm per
  controller kind of ``kinds``, all built from the one ``controller`` section (the
  contextual kinds read P(G) from ``sim``)."""
  section = config.controller.to_dict()
  shared = {k: section[k] for k in ("tau", "delta", "forgetting", "prior_alpha",
                                    "prior_beta", "seed", "event") if k in section}
  built = [(f"static_G{g}", StaticController(g, **shared)) for g in sorted(section["candidates"])]
  for kind in kinds:
    section["kind"] = kind
    built.append((kind, controller_from_config({"controller": section, "sim": config.sim})))
  return built


def run_lockstep(arms: Sequence[tuple[str, Any]], steps: int, draw: Callable[[int], Any],
                 step_metrics: Callable[[Any, Any], dict[str, float]]
                 ) -> tuple[dict[str, dict[str, list[float]]], float]:
  """Every arm on every step's ``draw(step)`` (common random numbers): the per-arm
  columns of ``step_metrics(controller, world)`` and the seconds it all took."""
  traces = {name: [] for name, _ in arms}
  started = time.perf_counter()
  for step in range(steps):
    world = draw(step)
    for name, ctrl in arms:
      traces[name].append(step_metrics(ctrl, world))
  columns = {name: {key: [r[key] for r in rows] for key in rows[0]}
             for name, rows in traces.items()}
  return columns, time.perf_counter() - started


def straggler_summary(col: dict[str, list[float]]) -> dict[str, float]:
  """The summary entries every simulator reports: straggler rates and wall-clock."""
  return {
      "straggler_rate": float(np.mean(col["straggler_rate"])),
      "group_straggler_rate": float(np.mean(col["group_straggler_rate"])),
      "step_straggler_rate": float(np.mean(col["step_straggler"])),
      "wall_clock_s": float(np.sum(col["total_s"])),
  }


def simulate(config: Any) -> dict[str, Any]:
  """Runs every arm in lock-step; returns per-arm summaries and per-step traces."""
  validate_config(config)
  process = length_process_from_config(config)
  cost = cost_model_from_config(config)
  controllers = build_arms(config, ("sagc",))
  candidates = controllers[-1][1].candidates
  max_prompts = max(prompts_for(config.sim, g) for g in candidates)

  def step_metrics(ctrl, world):
    g = ctrl.plan().group_size
    lengths = world[:prompts_for(config.sim, g), :g]
    metrics = ctrl.observe_step(StepGroups(lengths.max(axis=1), np.median(lengths, axis=1)))
    metrics.update(cost.step(lengths, config.sim.prompt_len))
    return metrics

  columns, elapsed = run_lockstep(controllers, config.sim.steps,
                                  lambda step: process.draw(step, max_prompts, max(candidates)),
                                  step_metrics)
  summary = {name: _summarise(col) for name, col in columns.items()}
  largest = f"static_G{max(candidates)}"
  for row in summary.values():
    row["speedup_vs_largest_static"] = summary[largest]["wall_clock_s"] / row["wall_clock_s"]
  static_rates = [summary[f"static_G{g}"]["straggler_rate"] for g in candidates]
  delta = float(config.controller.delta)
  return {
      "config": config.to_dict(),
      "candidates": list(candidates),
      "summary": summary,
      "best_fixed_mixture_log2_g": best_fixed_mixture(candidates, static_rates, delta),
      "simulator_seconds": elapsed,
      "traces": columns,
  }


def _summarise(columns: dict[str, list[float]]) -> dict[str, float]:
  col = lambda key: np.array(columns[key])
  return {
      **straggler_summary(columns),
      "rollout_s": float(col("rollout_s").sum()),
      "learner_s": float(col("learner_s").sum()),
      "mean_g": float(col("g").mean()),
      "mean_log2_g": float(col("log2_g").mean()),
      "padding_efficiency": float(col("real_tokens").sum() / col("padded_tokens").sum()),
      "rollouts": float((col("g") * col("n_groups")).sum()),
  }


def format_table(result: dict[str, Any]) -> str:
  """Human-readable comparison table (one line per arm)."""
  header = (f"{'arm':<12} {'groups':>7} {'steps':>7} {'wall_s':>10} {'rollout_s':>10} "
            f"{'speedup':>8} {'mean_G':>7} {'log2_G':>7} {'pad_eff':>8}")
  event = result["config"]["controller"].get("event", "group")
  lines = [f"straggler rates: 'groups' = fraction of groups, 'steps' = fraction of steps "
           f"with a straggler; the constraint uses {event!r}", header, "-" * len(header)]
  for name, row in result["summary"].items():
    lines.append(
        f"{name:<12} {row['group_straggler_rate']:>7.3f} {row['step_straggler_rate']:>7.3f} "
        f"{row['wall_clock_s']:>10.1f} "
        f"{row['rollout_s']:>10.1f} {row['speedup_vs_largest_static']:>8.2f} "
        f"{row['mean_g']:>7.2f} {row['mean_log2_g']:>7.3f} {row['padding_efficiency']:>8.3f}")
  best = result["best_fixed_mixture_log2_g"]
  delta = result["config"]["controller"]["delta"]
  lines.append(f"best fixed randomised G with {event} straggler rate <= {delta}: mean log2 G = "
               + ("infeasible" if best is None else f"{best:.3f}"))
  return "\n".join(lines)
