"""The one interface between a group-size controller and whatever runs the steps.

The trainer (``training.step``), the replay engine and any other caller talk to every
controller kind through the same calls, and never ask which kind it is:

    plan = controller.plan(context)        # GroupPlan: the step's G, sizes per prompt
    ...sample plan.prompts(P) groups, score them, train, time the step...
    diagnostics = controller.observe_step(StepGroups(...))
    controller.state_dict() / load_state_dict(state)

A kind is a class (``GroupController``) that declares, beside its code, its name
(``kind``), its typed settings (``Settings``, a frozen dataclass whose defaults are
the kind's defaults) and what it needs from the run (``needs``, a ``Needs``). The
registry (``control.controller``) builds every kind from a config section, by name or
by import path (``"my_module:MyController"``), and every caller asks the kind's
``needs`` instead of listing kinds.

``context`` is a zero-argument callable returning the step's ``BatchContext``: it
is only called by the kinds that read the upcoming prompts, because building it
costs a tokenisation and, on several processes, an all-gather.

A step's straggler statistics are measured by the caller (``control.stragglers``, at
one measurement tau for every kind); ``observe_step`` returns only the controller's
own diagnostics (SAGC: lambda and its posterior means). The documented single-size
API stays beside it: ``propose() -> int`` and ``observe(group_max, group_median)``
(README, docs/controllers.md).

Per-group max and median lengths reach ``observe_step`` from the sampler's host
callback (``sampling.listener``), the design card's one path from the device to
the controller; rewards from the reward functions; the step's seconds from the
trainer's clock (process 0's, on every process) or the replay's cost model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Protocol

import numpy as np

from sagc_jax.control.context import BatchContext

__all__ = ["ContextSource", "GroupController", "GroupPlan", "Needs", "StepGroups", "StepTime"]

# The step's upcoming prompts, built only when a controller asks for them.
ContextSource = Callable[[], BatchContext]


@dataclasses.dataclass(frozen=True)
class GroupPlan:
  """What a controller decided for one step.

  ``group_size``: the step's G. It sets the prompts P(G) and the row bucket of the
  step (for per-prompt sizes it is the base size G_b whose budget the sizes share).
  ``sizes``: a size per prompt, in the order of the context's prompts, or None
  when every prompt gets ``group_size`` (SAGC, static, prompt_aware). The step consumes
  the first ``len(sizes)`` prompts and samples those of a size above 0.
  """

  group_size: int
  sizes: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class StepTime:
  """The step's seconds, sampling (with the scoring that waits for it) and learner
  apart, and the whole step without the controller's own ``observe_step``. Training:
  process 0's clock on every process, so every process decides alike; the replay: the
  cost model's priced seconds."""

  rollout_s: float
  learner_s: float
  total_s: float


@dataclasses.dataclass(frozen=True)
class StepGroups:
  """What a step observed, one entry per sampled group (every round of the step).

  ``group_max`` / ``group_median``: response lengths (the straggler signal);
  ``prompt_ids``, ``pass_rates`` (fraction of correct responses), ``group_sizes``,
  ``rewards`` (per group, an array of its responses' rewards) and ``time`` (the step's
  ``StepTime``) are there for the kinds that read them.
  """

  group_max: Any
  group_median: Any
  prompt_ids: Any = None
  pass_rates: Any = None
  group_sizes: Any = None
  rewards: Any = None
  time: StepTime | None = None


@dataclasses.dataclass(frozen=True)
class Needs:
  """What a kind needs from the run; the run's checks, the trainer, the replay and
  compare read it instead of listing kinds.

  ``context``: it reads the step's upcoming prompts (``BatchContext``);
  ``per_prompt_sizes``: its plans hold a size per prompt; ``one_process``: it runs on
  one process only; ``no_refill``: the refill sampler (``rollout.refill_slots > 0``)
  cannot run its steps; ``whole_step_per_call``: ``rollout.max_rows_per_call`` must be
  0 or hold its largest step (its groups are not split over sampler calls);
  ``peek``: its context holds ``peek`` times the prompts the largest step samples (a
  kind that skips prompts fills the step from further ones; its plan's sizes may be 0,
  each such prompt consumed without being sampled).
  """

  context: bool = False
  per_prompt_sizes: bool = False
  one_process: bool = False
  no_refill: bool = False
  whole_step_per_call: bool = False
  peek: int = 1


class GroupController(Protocol):
  """A controller kind (module docstring). ``from_settings`` builds it from its
  ``Settings`` and the run's prompts per step P(G) (``prompts_for``)."""

  kind: ClassVar[str]
  Settings: ClassVar[type]
  needs: ClassVar[Needs]

  @classmethod
  def from_settings(cls, settings: Any, *, prompts_for: Callable[[int], int] | None = None
                    ) -> "GroupController": ...

  def plan(self, context: ContextSource | None = None) -> GroupPlan: ...

  def observe_step(self, groups: StepGroups) -> dict[str, float]: ...

  def state_dict(self) -> dict[str, Any]: ...

  def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
