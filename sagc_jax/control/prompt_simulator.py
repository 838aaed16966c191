"""A simulator with prompt heterogeneity, for the contextual controllers.

``sagc_jax.control.simulator`` draws every prompt from one length distribution, so
knowing which prompt comes next is worth nothing there. Here a fixed pool of
prompts recurs epoch after epoch, and each prompt has its own response-length
distribution, tail weight, pass rate and token length, all tied to a latent
difficulty, all drifting with training. Prompt i at progress ``x = t / (steps-1)``:

    d_i ~ N(0, 1)                                        difficulty
    median_i(x) = m(x) * exp(prompt_sigma * (r_m d_i + sqrt(1 - r_m^2) e1_i))
    sigma_i(x)  = s(x) * exp(sigma_spread * e2_i)
    q_i(x)      = sigmoid(logit q(x) + tail_spread * (r_q d_i + sqrt(1 - r_q^2) e3_i))
    p_i(x)      = sigmoid(pass_logit_mean - pass_logit_scale * d_i + pass_logit_gain * x)
    len_i       = clip(prompt_len * exp(prompt_len_sigma * (r_l d_i + sqrt(1 - r_l^2) e4_i)),
                       8, 8 * prompt_len)

with ``m, s, q`` moving linearly like the base simulator's median, spread and
tail probability (``r_m, r_q, r_l`` = ``median_difficulty_corr``,
``tail_difficulty_corr``, ``prompt_len_difficulty_corr``; ``e*`` independent
normals). Response j: ``L_ij = clip(round(median_i exp(sigma_i z_ij) T_ij), 1,
max_len)``, ``T_ij ~ U[tail_factor_min, tail_factor_max]`` with probability
``q_i`` (else 1); it passes iff ``v_ij < p_i``. Harder prompts write longer and
re-check more, and every prompt gets easier as training goes on. The
correlations are assumptions of the scenario, stated so they can be changed.

Loader: every epoch is a fresh permutation of the pool; step t hands out the
next ``M = max_G P(G)`` prompts, the same ones to every arm, and an arm samples the
first ``P(G)`` of them (or ``k`` for per_prompt). The random numbers of a step are
one ``[M, max G]`` draw each for ``z``, ``T`` and ``v``; an arm reads each group's
first ``G_i`` columns (common random numbers: arms differ by their decisions).

Arms: every static G, ``sagc``, ``prompt_aware`` and ``per_prompt``, all built from
one ``controller`` section. Cost: ``CostModel.step_rows`` on the step's rows and
longest response (mixed sizes included), prompts padded to the step's longest.

Learning-signal proxies, both per step over the groups with the true ``p_i``:

* ``signal = sum_i 4 p_i (1 - p_i) log2 G_i``: SAGC's utility log2 G of a group,
  weighted by the prompt's reward variance (GRPO's normalised advantages carry a
  gradient only where the rewards vary; 1 at p = 1/2, 0 for a prompt always or
  never solved);
* ``informative = sum_i (1 - p_i^G_i - (1 - p_i)^G_i)``: the expected number of
  groups that are not all-pass or all-fail (those DAPO's filter keeps).

Neither is a training outcome; they rank how well a controller spends rows.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from sagc_jax.base import checks
from sagc_jax.control.budget import prompts_for
from sagc_jax.control.context import BatchContext
from sagc_jax.control.protocol import StepGroups
from sagc_jax.control.simulator import (build_arms, cost_model_from_config, run_lockstep,
                                        straggler_summary, validate_config)

__all__ = ["ARMS_CONTEXTUAL", "PromptPool", "add_equal_budget_metrics", "format_prompt_table",
           "group_stats", "pool_from_config", "simulate_prompts", "summarise_arm"]

ARMS_CONTEXTUAL = ("sagc", "prompt_aware", "per_prompt")
_POOL_KEYS = ("size", "prompt_len_sigma", "sigma_spread", "tail_spread",
              "median_difficulty_corr", "tail_difficulty_corr", "prompt_len_difficulty_corr",
              "pass_logit_mean", "pass_logit_scale", "pass_logit_gain")


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-x))


@dataclasses.dataclass(frozen=True)
class PromptPool:
  """A pool of heterogeneous prompts and its drifting length / pass-rate model
  (module docstring), read from the config's ``sim`` section (the base simulator's
  schedules and caps) and its ``pool`` section. ``draw`` is deterministic in
  ``(seed, step)``."""

  sim: Any
  pool: Any
  per_step: int                 # M: prompts the loader hands out per step
  max_g: int
  seed: int

  def __post_init__(self):
    sim, pool = self.sim, self.pool
    rng = np.random.Generator(np.random.PCG64([self.seed, 7]))
    d, e1, e2, e3, e4 = rng.standard_normal((5, pool.size))
    mix = lambda r, e: r * d + np.sqrt(1.0 - r * r) * e
    tokens = sim.prompt_len * np.exp(pool.prompt_len_sigma
                                     * mix(pool.prompt_len_difficulty_corr, e4))
    static = {
        "median_factor": np.exp(sim.prompt_sigma * mix(pool.median_difficulty_corr, e1)),
        "sigma_factor": np.exp(pool.sigma_spread * e2),
        "tail_offset": pool.tail_spread * mix(pool.tail_difficulty_corr, e3),
        "pass_offset": pool.pass_logit_mean - pool.pass_logit_scale * d,
        "prompt_tokens": np.clip(np.rint(tokens), 8, 8 * sim.prompt_len).astype(np.int64),
    }
    object.__setattr__(self, "_static", static)

  def prompt_ids(self, step: int) -> np.ndarray:
    """The ``per_step`` prompt ids the loader hands out at ``step`` (epochs reshuffled)."""
    size = self.pool.size
    start = step * self.per_step
    positions = np.arange(start, start + self.per_step)
    ids = np.empty(self.per_step, np.int64)
    for epoch in np.unique(positions // size):
      order = np.random.Generator(np.random.PCG64([self.seed, 11, int(epoch)])).permutation(size)
      here = positions // size == epoch
      ids[here] = order[positions[here] % size]
    return ids

  def draw(self, step: int) -> dict[str, np.ndarray]:
    """The step's prompts: ``ids``, ``prompt_tokens``, true ``pass_rate`` and
    ``tail_prob`` [M], and ``lengths`` / ``passed`` [M, max_g] (int / bool)."""
    sim = self.sim
    x = step / max(sim.steps - 1, 1)
    lerp = lambda key: sim[f"{key}_start"] + (sim[f"{key}_end"] - sim[f"{key}_start"]) * x
    ids = self.prompt_ids(step)
    s = {k: v[ids] for k, v in self._static.items()}
    median = lerp("median") * s["median_factor"]
    sigma = lerp("sigma") * s["sigma_factor"]
    q0 = lerp("tail_prob")
    tail_prob = _sigmoid(np.log(q0 / (1.0 - q0)) + s["tail_offset"])
    pass_rate = _sigmoid(s["pass_offset"] + self.pool.pass_logit_gain * x)
    rng = np.random.Generator(np.random.PCG64([self.seed, step]))
    shape = (self.per_step, self.max_g)
    body = np.exp(sigma[:, None] * rng.standard_normal(shape))
    tail = rng.random(shape) < tail_prob[:, None]
    factor = rng.uniform(sim.tail_factor_min, sim.tail_factor_max, shape)
    lengths = median[:, None] * body * np.where(tail, factor, 1.0)
    return {
        "ids": ids,
        "prompt_tokens": s["prompt_tokens"],
        "pass_rate": pass_rate,
        "tail_prob": tail_prob,
        "lengths": np.clip(np.rint(lengths), 1, sim.max_len).astype(np.int64),
        "passed": rng.random(shape) < pass_rate[:, None],
    }


def _validate(config: Any) -> None:
  validate_config(config)
  checks.positive_int(config, "pool.size")
  for key in ("prompt_len_sigma", "sigma_spread", "tail_spread", "pass_logit_scale"):
    checks.number_in(config, f"pool.{key}", 0.0)
  for key in ("median_difficulty_corr", "tail_difficulty_corr", "prompt_len_difficulty_corr"):
    checks.number_in(config, f"pool.{key}", -1.0, 1.0)
  for key in ("pass_logit_mean", "pass_logit_gain"):
    checks.number_in(config, f"pool.{key}")
  for key in ("tail_prob_start", "tail_prob_end"):
    checks.number_in(config, f"sim.{key}", 0.0, 1.0, low_open=True, high_open=True)
  unknown = sorted(set(config.pool.keys()) - set(_POOL_KEYS))
  if unknown:
    raise ValueError(f"pool.{unknown[0]} is not a pool setting (allowed: {', '.join(_POOL_KEYS)})")


def pool_from_config(config: Any) -> PromptPool:
  candidates = tuple(config.controller.candidates)
  return PromptPool(config.sim, config.pool, seed=config.seed, max_g=max(candidates),
                    per_step=max(prompts_for(config.sim, g) for g in candidates))


def group_stats(world: dict[str, np.ndarray], sizes: np.ndarray) -> dict[str, np.ndarray]:
  """Per-group max / median length and pass rate of the first len(sizes) prompts."""
  k = sizes.size
  out = {name: np.empty(k) for name in ("max", "median", "pass")}
  real = 0.0
  for g in np.unique(sizes):
    rows = np.flatnonzero(sizes == g)
    block = world["lengths"][rows, :g]
    out["max"][rows] = block.max(axis=1)
    out["median"][rows] = np.median(block, axis=1)
    out["pass"][rows] = world["passed"][rows, :g].mean(axis=1)
    real += float(block.sum())
  out["longest"], out["real"] = int(out["max"].max()), real
  return out


def simulate_prompts(config: Any) -> dict[str, Any]:
  """Runs every arm in lock-step on the prompt pool; per-arm summaries and traces
  in the layout of ``simulator.simulate`` (plus the two signal proxies)."""
  _validate(config)
  pool = pool_from_config(config)
  cost = cost_model_from_config(config)

  def step_metrics(ctrl, world):
    context = BatchContext(world["ids"], world["prompt_tokens"])
    start = time.perf_counter()
    plan = ctrl.plan(lambda: context)
    g = plan.group_size
    sizes = np.full(prompts_for(config.sim, g), g) if plan.sizes is None else plan.sizes
    seconds = time.perf_counter() - start
    k = sizes.size
    groups = group_stats(world, sizes)
    start = time.perf_counter()
    metrics = ctrl.observe_step(StepGroups(groups["max"], groups["median"],
                                           prompt_ids=world["ids"][:k],
                                           pass_rates=groups["pass"], group_sizes=sizes))
    metrics["controller_s"] = seconds + time.perf_counter() - start
    p = world["pass_rate"][:k]
    metrics["signal"] = float(np.sum(4.0 * p * (1.0 - p) * np.log2(sizes)))
    metrics["informative"] = float(np.sum(1.0 - p ** sizes - (1.0 - p) ** sizes))
    metrics["rows"] = float(sizes.sum())
    metrics.update(cost.step_rows(int(sizes.sum()), groups["longest"], groups["real"],
                                  int(world["prompt_tokens"][:k].max())))
    return metrics

  columns, elapsed = run_lockstep(build_arms(config, ARMS_CONTEXTUAL), config.sim.steps,
                                  pool.draw, step_metrics)
  summary = {name: summarise_arm(col) for name, col in columns.items()}
  add_equal_budget_metrics(summary, columns)
  return {
      "config": config.to_dict(),
      "candidates": sorted(config.controller.candidates),
      "summary": summary,
      "simulator_seconds": elapsed,
      "traces": columns,
  }


def summarise_arm(col: dict[str, list[float]]) -> dict[str, float]:
  mean = lambda key: float(np.mean(col[key]))
  total = lambda key: float(np.sum(col[key]))
  return {
      **straggler_summary(col),
      "mean_g": total("rows") / total("n_groups"),
      "mean_log2_g": mean("log2_g"),
      "signal": total("signal"),
      "informative_groups": total("informative"),
      "rows": total("rows"),
      "padding_efficiency": total("real_tokens") / total("padded_tokens"),
      "controller_us": 1e6 * mean("controller_s"),
  }


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
    summary[name]["time_to_target_s"] = float(np.interp(target, signal, wall))
    summary[name]["signal_at_equal_time"] = float(np.interp(budget, wall, signal))
    summary[name]["target_signal"] = float(target)
    summary[name]["equal_time_s"] = float(budget)


def format_prompt_table(result: dict[str, Any]) -> str:
  """One line per arm: rates, wall-clock, signal proxies, mean G, controller cost."""
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
