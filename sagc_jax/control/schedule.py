"""A given G per step (``controller.kind="schedule"``): a size schedule replayed in
training.

Why. A controller's choice can fail for two reasons: its objective does not track
learning, or it estimates the objective badly. The replay's oracle arm
(``replay.oracle``) maximises the objective with the trace's true pass rates and the cost
model's true seconds; training an arm on the oracle's schedule of G measures the
objective itself, apart from its estimate (docs/controllers.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from sagc_jax.control.risk import GroupSizeController, RiskSettings, settings_of

__all__ = ["ScheduleController", "ScheduleSettings"]


@dataclasses.dataclass(frozen=True)
class ScheduleSettings(RiskSettings):
  """``schedule``: the G of each step, in order; after its end, its last size."""

  schedule: tuple = ()


class ScheduleController(GroupSizeController):
  """Step t uses ``schedule[t]`` (the last entry after the end); the straggler risk
  model reports as a static arm's does."""

  kind = "schedule"
  Settings = ScheduleSettings
  replay_by_default = False          # it replays a given schedule, not a default one

  def __init__(self, candidates: Sequence[int], tau: float = RiskSettings.tau,
               delta: float = RiskSettings.delta, **settings: Any):
    s = settings_of(self.Settings, self.kind, candidates=candidates, tau=tau, delta=delta,
                    **settings)
    super().__init__(s, min_candidates=1)
    schedule = tuple(s.schedule)
    bad = sorted({g for g in schedule if g not in self.candidates}, key=str)
    if not schedule or bad:
      raise ValueError(f"schedule must be a non-empty sequence of candidates "
                       f"{self.candidates}, got {bad[:3] or 'none'}")
    self._schedule = [self.candidates.index(g) for g in schedule]
    self._step = 0
    self._index = self._schedule[0]

  def _choose(self) -> int:
    index = self._schedule[min(self._step, len(self._schedule) - 1)]
    self._step += 1
    return index

  def state_dict(self) -> dict[str, Any]:
    return {**super().state_dict(), "step": self._step}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    super().load_state_dict(state)
    self._step = int(state["step"])
