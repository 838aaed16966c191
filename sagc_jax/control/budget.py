"""The rollout budget of one step: which group sizes G may be used and how many
prompts P(G) a step samples at each.

The two ways of changing G (SAGC paper, Sec. 3): ``hold_rollouts`` keeps the rows
per step fixed (P = rollouts_per_step / G) and ``hold_prompts`` keeps the prompts
fixed (P = prompts_per_step, rows = P * G). This module is the one place that rule
is written: the trainer, the sampler's row buckets, the AOT sizing and the
simulator all call ``prompts_for``.
"""

from __future__ import annotations

from typing import Any

ROLLOUT_MODES = ("hold_prompts", "hold_rollouts")


def prompts_for(section: Any, g: int) -> int:
  """P(G): prompts per sampling round at group size ``g``.

  ``section`` is a rollout (or simulator ``sim``) config section with ``mode``,
  ``rollouts_per_step`` and ``prompts_per_step``; ``base.checks.group_budget``
  validates it at start-up.
  """
  if section.mode == "hold_rollouts":
    return section.rollouts_per_step // g
  return section.prompts_per_step
