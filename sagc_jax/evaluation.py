"""Held-out evaluation of a policy: greedy and sampled accuracy, response lengths.

Used by the training loop (before RL and every ``train.eval_every`` steps) and by
``python -m sagc_jax.eval``, which builds only this and ``RunInputs``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from sagc_jax.run_inputs import RunInputs
from sagc_jax.sampling import Sampler

__all__ = ["Evaluator", "seed_for"]


def seed_for(*parts: int) -> int:
  """A 32-bit seed derived from integers (stable across runs and resumes)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class Evaluator:
  """Greedy and sampled held-out accuracy with fixed seeds and batch layout.

  The sampled pass draws one response per example at the rollout temperature with
  fixed seeds and a fixed batch layout, so successive evaluations (and every arm of
  a comparison) share their random numbers and differ only by the policy; it
  measures the policy as RL trains it, while greedy measures its mode.
  """

  def __init__(self, inputs: RunInputs, greedy: Sampler, sampled: Sampler,
               log: Callable[[str], None] = print):
    self.inputs = inputs
    self.greedy = greedy
    self.sampled = sampled
    wanted, available = inputs.config.data.eval_examples, len(inputs.eval_source)
    if wanted > available:           # once per run, not at every evaluation
      log(f"warning: data.eval_examples={wanted} but the "
          f"{inputs.config.data.eval_split!r} split holds {available} examples; "
          f"evaluating on all {available}")

  def warmup_jobs(self, model: Any) -> list:
    return self.greedy.warmup_jobs(model) + self.sampled.warmup_jobs(model)

  def examples(self, limit: int | None = None) -> int:
    """How many held-out examples an evaluation uses (``limit``: at most that many)."""
    if limit is not None and limit < 1:
      raise ValueError(f"an evaluation needs at least one example, got limit={limit}")
    wanted = self.inputs.config.data.eval_examples if limit is None else limit
    return min(wanted, len(self.inputs.eval_source))

  def _pass(self, model: Any, sampler: Sampler, n: int,
            seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct, lengths) of one response per held-out example, in batches of the
    sampler's row bucket (compiled at warm-up)."""
    inputs = self.inputs
    batch_rows = sampler.row_buckets[-1]
    correct, lengths = [], []
    for lo in range(0, n, batch_rows):
      examples = [inputs.eval_source[i] for i in range(lo, min(lo + batch_rows, n))]
      samples = sampler.generate(model, inputs.encode(examples), 1, seed=seed_for(seed, lo))
      result = inputs.reward_fn(inputs.decode(samples), [ex["answer"] for ex in examples])
      correct.append(result.correct)
      lengths.append(samples.lengths[:samples.num_rows])
    return np.concatenate(correct), np.concatenate(lengths)

  def evaluate(self, model: Any, limit: int | None = None) -> dict[str, float]:
    """Held-out accuracy of ``model``: greedy, and sampled at the training temperature."""
    start = time.perf_counter()
    n = self.examples(limit)
    greedy, lengths = self._pass(model, self.greedy, n, seed=0)
    sampled, sampled_lengths = self._pass(model, self.sampled, n,
                                          seed=self.inputs.config.seed)
    return {"eval_accuracy": float(greedy.mean()), "eval_response_len": float(lengths.mean()),
            "eval_sampled_accuracy": float(sampled.mean()),
            "eval_sampled_response_len": float(sampled_lengths.mean()),
            "eval_examples": float(n), "eval_seconds": time.perf_counter() - start}
