"""The replay's oracle arm: every step, the G of most informative groups per second
computed from what a controller can only estimate, the trace's true pass rates and the
cost model's true seconds of the step's own rollouts.

Why. ``signal_rate`` (``control.signal_rate``) maximises expected informative groups per
predicted second from estimates: per-prompt pass-rate posteriors and a fitted cost
model. The oracle maximises the same objective exactly, so the replay scores how much
each estimate costs, and training an arm on the oracle's G schedule
(``control.schedule``; ``python -m sagc_jax.experiments.oracle_schedule``) measures
whether the objective itself tracks learning.
The oracle is scored by the quantity it maximises; it is not a bound on learning.

It maximises informative groups per second over the run, not per step: a step's best
ratio is not the run's (a step worth 3 groups in 4 s lowers a run at 1 group per second
less than it adds). So after the first step it takes the G of most ``value - rate *
seconds``, ``rate`` the run's informative groups per second so far (Dinkelbach's
iteration, online); on a stationary world the two rules agree.

For each candidate G it takes the step's first P(G) prompts (``budget.prompts_for``),
their pass rates ``p_i``, the value ``sum_i 1 - p_i^G - (1 - p_i)^G`` and the cost
``cost([(their first G responses' lengths, prompt tokens)], trained=the same rows)``,
the step a GRPO arm would run. For DAPO (``max_rounds > 1``) the value is the groups the
step keeps and the rollout is priced per expected round, by ``control.signal_rate``'s
round process on the prompts' true mean.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sagc_jax.control.protocol import ContextSource, GroupPlan, Needs, StepGroups
from sagc_jax.control.pass_rates import dapo_step, informative_groups

__all__ = ["OracleArm"]


class OracleArm:
  """The oracle (module docstring). The engine hands it each step's block of the world
  (``see``) before it plans; it runs only in the replay."""

  kind = "oracle"
  needs = Needs(context=True)
  sees_world = True

  def __init__(self, candidates: Sequence[int], prompts_for: Callable[[int], int],
               cost: Callable, max_rounds: int = 1):
    self.candidates = tuple(sorted(candidates))
    self.max_rounds = max_rounds
    self._prompts = [int(prompts_for(g)) for g in self.candidates]
    self.cost = cost
    self._block: Mapping[str, Any] | None = None
    self._gained = self._spent = 0.0           # its informative groups, priced seconds
    self.g = self.candidates[0]

  def see(self, block: Mapping[str, Any]) -> None:
    if block.get("pass_rate") is None:
      raise ValueError("the oracle arm needs a world with pass rates (a trace or the pool)")
    self._block = block

  def options(self) -> tuple[np.ndarray, np.ndarray]:
    """(informative groups, priced seconds) of each candidate on the block seen."""
    block = self._block
    value, rollout, learner = (np.empty(len(self.candidates)) for _ in range(3))
    for j, (g, k) in enumerate(zip(self.candidates, self._prompts)):
      value[j] = informative_groups(block["pass_rate"][:k], g)
      rows = block["lengths"][:k, :g].reshape(-1)
      prompts = np.repeat(block["prompt_tokens"][:k], g)
      priced = self.cost([(rows, block["prompt_tokens"][:k])], (rows, prompts))
      rollout[j], learner[j] = priced["rollout_s"], priced["total_s"] - priced["rollout_s"]
    rounds = 1.0
    if self.max_rounds > 1:             # DAPO: the groups kept, rounds until then
      value, rounds = dapo_step(value / self._prompts, self._prompts, self.max_rounds)
    return value, np.maximum(rounds * rollout + learner, 1e-12)

  def plan(self, context: ContextSource | None = None) -> GroupPlan:
    """The first step: the most informative groups per second; then the most of
    ``value - rate * seconds`` at the run's rate so far (module docstring)."""
    if self._block is None:
      raise ValueError("the oracle arm plans only in the replay (it sees the world's block)")
    value, seconds = self.options()
    if self._spent:
      score = value - self._gained / self._spent * seconds
    else:
      score = value / seconds
    pick = int(np.argmax(score))                        # ties: the smaller size
    self._gained += float(value[pick])
    self._spent += float(seconds[pick])
    self.g = self.candidates[pick]
    return GroupPlan(self.g)

  def observe_step(self, groups: StepGroups) -> dict[str, float]:
    del groups
    self._block = None
    return {}

  def state_dict(self) -> dict[str, Any]:
    return {}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    del state

