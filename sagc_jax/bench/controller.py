"""Host-side cost of the group-size controllers (one decision and its observation).

SAGC runs on the host between jitted sampler/learner calls, so its overhead is
pure idle time for the accelerator mesh. This measures the wall-clock of one
``propose()`` + ``observe(group_max, group_median)`` pair (the public API), and of
one ``plan()`` + ``observe_step(StepGroups)`` pair (the protocol the trainer calls;
``signal_rate`` with the prompts, pass rates and seconds it reads),
per group count, on length arrays drawn from the simulator's heavy-tailed process
(so the controller moves between sizes as it would in training).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from sagc_jax.config import controller_settings
from sagc_jax.control.controller import controller_from_config
from sagc_jax.control.context import BatchContext
from sagc_jax.control.protocol import StepGroups, StepTime


def _public_api(ctrl, group_max, group_median) -> None:
  ctrl.propose()
  ctrl.observe(group_max, group_median)


def _protocol(ctrl, group_max, group_median) -> None:
  ctrl.plan()
  ctrl.observe_step(StepGroups(group_max, group_median))


def _signal_rate_steps():
  """The ``signal_rate`` kinds' protocol step on steps of fresh prompts with pass rates,
  sizes and seconds (what the trainer hands them; the prompt ids wrap around 20,000, so
  prompts recur). The context holds twice the step's prompts (the per-prompt kind's
  look-ahead); a per-prompt plan's sampled groups are observed."""
  first = [0]

  def step(ctrl, group_max, group_median) -> None:
    n = group_max.size
    ids = (first[0] + np.arange(2 * n)) % 20_000
    plan = ctrl.plan(lambda: BatchContext(ids, np.full(2 * n, 20)))
    sizes = np.full(n, plan.group_size) if plan.sizes is None else plan.sizes
    sampled = np.flatnonzero(sizes)[:n]
    first[0] += sizes.size
    k = sampled.size
    ctrl.observe_step(StepGroups(group_max[:k], group_median[:k], prompt_ids=ids[sampled],
                                 pass_rates=(ids[sampled] % 7) / 7.0, group_sizes=sizes[sampled],
                                 time=StepTime(0.01 * plan.group_size, 0.005 * plan.group_size,
                                               0.016 * plan.group_size)))
  return step


def _time_pairs(ctrl, group_max: np.ndarray, group_median: np.ndarray,
                step=_public_api) -> np.ndarray:
  seconds = np.empty(len(group_max))
  clock = time.perf_counter
  for i in range(len(group_max)):
    start = clock()
    step(ctrl, group_max[i], group_median[i])
    seconds[i] = clock() - start
  return seconds


def run(steps: int = 5000, group_counts: tuple[int, ...] = (16, 64, 256),
        seed: int = 0) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  results: dict[str, Any] = {"steps": steps, "cases": []}
  for n_groups in group_counts:
    # Lengths of groups of 16: log-normal body with occasional 2-5x tails.
    lengths = 500 * np.exp(0.3 * rng.standard_normal((steps, n_groups, 16)))
    lengths *= np.where(rng.random(lengths.shape) < 0.03, rng.uniform(2, 5, lengths.shape), 1)
    group_max = lengths.max(axis=2).round()
    group_median = np.median(lengths, axis=2).round()
    build = lambda **changes: controller_from_config(controller_settings(dict(seed=seed,
                                                                             **changes)))
    for name, ctrl, step in (("sagc", build(), _public_api),
                             ("static", build(kind="static", static_g=8, candidates=(8,)),
                              _public_api),
                             ("sagc plan", build(), _protocol),
                             *((kind, controller_from_config(
                                 controller_settings(dict(kind=kind, seed=seed)),
                                 prompts_for=lambda g, n=n_groups: n), _signal_rate_steps())
                               for kind in ("signal_rate", "signal_rate_per_prompt"))):
      _time_pairs(ctrl, group_max[:200], group_median[:200], step)        # warm-up
      us = _time_pairs(ctrl, group_max, group_median, step) * 1e6
      results["cases"].append({
          "controller": name, "n_groups": n_groups,
          "median_us": float(np.median(us)), "p90_us": float(np.percentile(us, 90)),
          "p99_us": float(np.percentile(us, 99)), "mean_us": float(us.mean()),
      })
  return results


def report(results: dict[str, Any]) -> str:
  lines = [f"controller propose+observe (sagc plan, signal_rate*: plan+observe_step), "
           f"{results['steps']} steps per case",
           f"{'controller':<22} {'groups':>6} {'median_us':>10} {'p90_us':>8} {'p99_us':>8}"]
  for case in results["cases"]:
    lines.append(f"{case['controller']:<22} {case['n_groups']:>6} {case['median_us']:>10.1f} "
                 f"{case['p90_us']:>8.1f} {case['p99_us']:>8.1f}")
  return "\n".join(lines)
