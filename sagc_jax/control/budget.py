"""The rollout budget of one step: which group sizes G may be used and how many
prompts P(G) a step samples at each.

The two ways of changing G (SAGC paper, Sec. 3): ``hold_rollouts`` keeps the rows
per step fixed (P = rollouts_per_step / G) and ``hold_prompts`` keeps the prompts
fixed (P = prompts_per_step, rows = P * G). This module is the one place that rule
is written: the trainer, the sampler's row buckets, the AOT sizing and the
simulator all call ``prompts_for``.
"""

from __future__ import annotations

from typing import Any, Sequence

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


def budget_from_flag(flag: str, rollout: dict[str, Any], candidates: Sequence[int]
                     ) -> dict[str, Any]:
  """The rollout budget a ``--budget MODE:SIZE`` flag names (``hold_prompts:8``: 8
  prompts per step at every G; ``hold_rollouts:64``: 64 rows per step, P = 64 / G),
  in place of ``rollout`` (the traced run's or the preset's), so that one trace is
  replayed under either way of changing G. SIZE must be a positive int, and under
  ``hold_rollouts`` divisible by every candidate G."""
  mode, _, size = flag.partition(":")
  if mode not in ROLLOUT_MODES or not size.isdigit() or int(size) < 1:
    raise ValueError(f"--budget={flag!r} is not MODE:SIZE with MODE one of "
                     f"{', '.join(ROLLOUT_MODES)} and SIZE a positive int (prompts per step "
                     "under hold_prompts, rows per step under hold_rollouts)")
  size_key = "prompts_per_step" if mode == "hold_prompts" else "rollouts_per_step"
  bad = [g for g in candidates if mode == "hold_rollouts" and int(size) % g]
  if bad:
    raise ValueError(f"--budget={flag}: {size} rows per step is not divisible by group "
                     f"size(s) {bad}: hold_rollouts needs whole prompts per step")
  return dict(rollout, mode=mode, **{size_key: int(size)})
