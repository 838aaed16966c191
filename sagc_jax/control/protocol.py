"""The one interface between a group-size controller and whatever runs the steps.

The trainer (``training.step``), the simulators and any other caller talk to every
controller kind through the same three calls, and never ask which kind it is:

    plan = controller.plan(context)        # GroupPlan: the step's G, sizes per prompt
    ...sample plan.prompts(P) groups, score them...
    metrics = controller.observe_step(StepGroups(...))
    controller.state_dict() / load_state_dict(state)

``context`` is a zero-argument callable returning the step's ``BatchContext``: it
is only called by the kinds that read the upcoming prompts (prompt_aware,
per_prompt), because building it costs a tokenisation and, on several processes,
an all-gather that SAGC and static never need.

The documented single-size API stays beside it: ``propose() -> int`` and
``observe(group_max, group_median)`` (README, docs/controllers.md); for those kinds
``plan`` and ``observe_step`` are that API.

Per-group max and median lengths reach ``observe_step`` from the sampler's host
callback (``sampling.listener``), the design card's one path from the device to
the controller.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from sagc_jax.control.context import BatchContext

__all__ = ["ContextSource", "GroupPlan", "StepGroups"]

# The step's upcoming prompts, built only when a controller asks for them.
ContextSource = Callable[[], BatchContext]


@dataclasses.dataclass(frozen=True)
class GroupPlan:
  """What a controller decided for one step.

  ``group_size``: the step's G. It sets the prompts P(G) and the row bucket of the
  step (for per-prompt sizes it is the base size G_b whose budget the sizes share).
  ``sizes``: a size per prompt, in the order of the context's prompts, or None
  when every prompt gets ``group_size`` (SAGC, static, prompt_aware).
  """

  group_size: int
  sizes: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class StepGroups:
  """What a step observed, one entry per sampled group (every round of the step).

  ``group_max`` / ``group_median``: response lengths (the straggler signal);
  ``prompt_ids``, ``pass_rates`` (fraction of correct responses) and
  ``group_sizes`` feed the contextual kinds and are ignored by the others.
  """

  group_max: Any
  group_median: Any
  prompt_ids: Any = None
  pass_rates: Any = None
  group_sizes: Any = None
