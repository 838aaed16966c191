"""Per-prompt group sizes by learning signal per measured second, with skipping
(``controller.kind="signal_rate_per_prompt"``; docs/controllers.md).

Why. ``signal_rate`` gives every prompt of a step the same G. A prompt whose posterior
says it is always or never solved gives no gradient at any G (GRESO, Zheng et al. 2025,
skips such prompts before sampling them), and a prompt near p = 1/2 needs few rows to
vary, while a rare success needs many. ``per_prompt`` already gives each prompt its own
size under the step's row budget, by SAGC's utility; this kind does so by
``signal_rate``'s objective and may give a prompt size 0.

Decision of one step:

1. The base size ``G_b`` and its budget: ``signal_rate``'s per-step choice, its
   ``P(G_b)`` prompts and ``R = P(G_b) * G_b`` rows.
2. Skipping. Of the context's prompts (``needs.peek`` times the largest step's), a
   prompt that would lower the step's predicted signal per second at every size is
   skipped (size 0, consumed without sampling): ``q_i(G) <= rate * seconds_per_row *
   G`` for every candidate G, ``rate`` the predicted informative groups per second of a
   step at ``G_b`` of the context's average prompt. A prompt whose posterior says always or never solved has
   ``q_i`` near 0 at every G. Each such prompt is re-tested with probability
   ``retest_prob``: a posterior that said "always solved" is checked again. The step
   takes the first ``P(G_b)`` prompts not skipped.
3. Sizes: ``max sum_i q_i(G_i) / T(sum_i G_i)`` over ``G_i`` in the candidates, ``sum_i
   G_i <= R``, ``q_i(G)`` a prompt's expected informative chance (``signal_rate``'s
   posterior), ``T`` the cost model's seconds, linear in rows. A ratio: solved by
   Dinkelbach's iteration, each a multiple-choice knapsack (``per_prompt``'s exact DP)
   of ``q_i(G) - rate * seconds_per_row * G``.

Interface: ``plan(context).sizes`` covers the first ``len(sizes)`` prompts of the
context, 0 for a skipped one; ``group_size`` is ``G_b`` (the row bucket). Like
``per_prompt`` it runs on one process and without the refill sampler (``needs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from sagc_jax.control.per_prompt import allocate_group_sizes
from sagc_jax.control.protocol import ContextSource, GroupPlan, Needs
from sagc_jax.control.risk import check_range
from sagc_jax.control.signal_rate import SignalRateController, SignalRateSettings

__all__ = ["SignalRatePerPromptController", "SignalRatePerPromptSettings"]


@dataclasses.dataclass(frozen=True)
class SignalRatePerPromptSettings(SignalRateSettings):
  """``signal_rate``'s settings, and skipping's (module docstring)."""

  retest_prob: float = 0.1


class SignalRatePerPromptController(SignalRateController):
  """A size per prompt, 0 for a skipped one (module docstring)."""

  kind = "signal_rate_per_prompt"
  Settings = SignalRatePerPromptSettings
  needs = Needs(context=True, per_prompt_sizes=True, one_process=True, no_refill=True,
                whole_step_per_call=True, peek=2)
  # A replay runs it when asked (--kinds): its look-ahead widens a shared world's steps.
  replay_by_default = False
  _DINKELBACH_ROUNDS = 4

  def __init__(self, candidates: Sequence[int], *args: Any, **settings: Any):
    super().__init__(candidates, *args, **settings)
    check_range("retest_prob", self.settings.retest_prob, 0.0, 1.0, low_closed=True,
                high_closed=True)
    self._plan: GroupPlan | None = None
    self._skipped = 0

  def plan(self, context: ContextSource | None = None) -> GroupPlan:
    if self._pending and self._plan is not None:
      return self._plan
    if context is None:
      raise ValueError("signal_rate_per_prompt needs the step's upcoming prompts (a context)")
    ids = np.asarray(context().prompt_ids, np.int64)
    self._context_ids = ids
    base = self.propose()                              # G_b, signal_rate's choice
    take = int(self.prompts()[self._index])
    sizes = np.asarray(self.candidates)
    q = self.pass_rates.expected_informative(ids, ids.size, self.candidates)
    fixed, per_row = self._step_cost(take * base)
    rate = take * q[:, self._index].mean() / max(fixed + per_row * take * base, 1e-12)
    skip = (q - rate * per_row * sizes[None, :]).max(axis=1) <= 0
    skip &= self._rng.random(ids.size) >= self.settings.retest_prob
    kept = np.flatnonzero(~skip)[:take]
    if not kept.size:                                  # every prompt skipped: re-test one
      kept = np.array([0])
    used = int(kept[-1]) + 1
    chosen = self._allocate(q[kept], take * base, fixed, per_row)
    plan_sizes = np.zeros(used, np.int64)
    plan_sizes[kept] = sizes[chosen]
    self._skipped = used - kept.size
    self._plan = GroupPlan(base, plan_sizes)
    return self._plan

  def _step_cost(self, rows: int) -> tuple[float, float]:
    """The cost model's step seconds as ``fixed + per_row * rows`` (its means)."""
    rollout, learner = self.rollout_cost.coefficients(), self.learner_cost.coefficients()
    per_row = (rollout[1] + learner[1]) * self._mean("median_len", 1.0)
    return max(float(self.predicted_seconds()[self._index]) - per_row * rows, 0.0), per_row

  def _allocate(self, q: np.ndarray, budget: int, fixed: float, per_row: float
                ) -> np.ndarray:
    """Index in the candidates of each prompt's size: Dinkelbach's iteration on the
    ratio (module docstring), starting at the rate of every prompt at G_b."""
    sizes = np.asarray(self.candidates, np.float64)
    picked = np.full(len(q), self._index)
    for _ in range(self._DINKELBACH_ROUNDS):
      rows = sizes[picked].sum()
      rate = q[np.arange(len(q)), picked].sum() / max(fixed + per_row * rows, 1e-12)
      picked = allocate_group_sizes(q - rate * per_row * sizes[None, :], self.candidates,
                                    budget)
    return picked

  def observe_step(self, groups: Any) -> dict[str, float]:
    metrics = super().observe_step(groups)
    self._plan = None
    metrics["skipped_prompts"] = float(self._skipped)
    return metrics

  def state_dict(self) -> dict[str, Any]:
    state = super().state_dict()
    state["plan"] = None if self._plan is None else [self._plan.group_size,
                                                     self._plan.sizes.tolist()]
    state["skipped"] = self._skipped
    return state

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    super().load_state_dict(state)
    plan = state["plan"]
    self._plan = None if plan is None else GroupPlan(int(plan[0]), np.asarray(plan[1],
                                                                            np.int64))
    self._skipped = int(state["skipped"])
