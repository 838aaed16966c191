"""Start-up validation helpers of config values (typed sections, simulator configs).

Every check raises ``ValueError`` naming the dotted key, the bad value and what
is allowed, so a bad command-line override fails before any work is done.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping


def lookup(config: Any, key: str) -> Any:
  """Value at a dotted key (``'sim.steps'``) of nested mappings or objects (a
  ConfigDict, a typed section); a missing key is an error naming it."""
  node = config
  for part in key.split("."):
    try:
      node = node[part] if isinstance(node, Mapping) else getattr(node, part)
    except (KeyError, AttributeError, TypeError):
      raise ValueError(f"config key {key!r} is missing") from None
  return node


def _int_at_least(config: Any, key: str, low: int, wanted: str) -> int:
  value = lookup(config, key)
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise ValueError(f"{key}={value!r} must be {wanted}")
  return value


def positive_int(config: Any, key: str) -> int:
  return _int_at_least(config, key, 1, "a positive integer")


def non_negative_int(config: Any, key: str) -> int:
  return _int_at_least(config, key, 0, "an integer >= 0")


def number_in(config: Any, key: str, low: float = -math.inf, high: float = math.inf,
              *, low_open: bool = False, high_open: bool = False) -> float:
  """A finite number inside the given interval (open or closed at each end; an infinite
  end is open). inf is refused like nan: no setting means "never" by it, and a run's
  config.json must stay standard JSON."""
  value = lookup(config, key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f"{key}={value!r} must be a finite number")
  below = value <= low if low_open else value < low
  above = value >= high if high_open else value > high
  if below or above:
    lo = "(" if low_open or math.isinf(low) else "["
    hi = ")" if high_open or math.isinf(high) else "]"
    raise ValueError(f"{key}={value!r} must be in {lo}{low}, {high}{hi}")
  return float(value)


def finite_numbers(values: Any, key: str = "") -> None:
  """Refuses inf and nan anywhere in nested mappings and sequences, naming the dotted
  key: the catch-all behind the checks of single keys (a setting of a controller kind
  the run does not use, a user kind's options), so that a run's config.json is
  standard JSON, which ``json.dumps`` would otherwise write with ``Infinity``."""
  if isinstance(values, Mapping):
    for name, value in values.items():
      finite_numbers(value, f"{key}.{name}" if key else str(name))
  elif isinstance(values, (list, tuple)):
    for i, value in enumerate(values):
      finite_numbers(value, f"{key}[{i}]")
  elif isinstance(values, float) and not math.isfinite(values):
    raise ValueError(f"{key}={values!r} must be a finite number")


def one_of(config: Any, key: str, allowed: Iterable[Any]) -> Any:
  value = lookup(config, key)
  allowed = tuple(allowed)
  if value not in allowed:
    raise ValueError(f"{key}={value!r} is not one of {allowed}")
  return value


def group_budget(config: Any, section: str, mode: str, group_sizes: Iterable[int]) -> None:
  """Checks the per-step budget of ``<section>`` for the two ways of changing G.

  ``hold_rollouts``: ``<section>.rollouts_per_step`` must be a positive int that
  every group size divides (whole prompts per step); ``hold_prompts``:
  ``<section>.prompts_per_step`` must be a positive int.
  """
  if mode == "hold_rollouts":
    key = f"{section}.rollouts_per_step"
    rollouts = positive_int(config, key)
    bad = [g for g in group_sizes if rollouts % g]
    if bad:
      raise ValueError(f"{key}={rollouts} is not divisible by group size(s) {bad}: "
                       "hold_rollouts needs whole prompts per step")
  else:
    positive_int(config, f"{section}.prompts_per_step")
