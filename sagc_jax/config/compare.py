"""The ``compare`` config section: the matrix of a comparison (``python -m
sagc_jax.compare``; the runs are ``experiments.arms``), checked when built like every
other section.

Why typed: the arms, the comparison's record (``compare.json``) and its report all read
these keys; one frozen section states each default once and names a bad key before any
arm trains. A training run never sees it: the arms drop it (``RunConfig`` has no
compare section).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Iterable, Mapping

from sagc_jax.config.section import Section
from sagc_jax.control.controller import arm_name, kind_class
from sagc_jax.rl.config import ALGORITHM_PRESETS

__all__ = ["CompareSection"]

# Every comparison runs these kinds (SAGC, and a static arm per ``static_sizes``), so
# neither can be an extra arm.
_ALWAYS = ("sagc", "static")
# Keys a config may set to None for "the default" (read as ``value or default`` before
# the section was typed).
_NONE_IS_DEFAULT = ("static_sizes", "contextual", "kinds", "time_budget_s", "targets")


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class CompareSection(Section):
  """A comparison: ``algorithms`` x {a static-G arm per ``static_sizes`` (empty: every
  candidate G), SAGC, then the kinds of ``contextual`` and ``kinds``} x ``seeds`` seeds.

  ``contextual`` and ``kinds`` both add controller kinds as arms beside SAGC, by a
  built-in name or a user's ``"module:Class"`` (``control.controller``);
  ``contextual`` is the older key, kept for the configs that set it. ``time_budget_s``
  (0: none): every arm's ``train.time_budget_s``, with ``eval_points`` evaluations
  evenly spaced along it; ``train.steps`` is then a cap. ``targets``: held-out sampled
  accuracies whose time to reach is reported. ``equivalence_margin``: the difference in
  mean held-out accuracy over [0, H] within which two arms are called equivalent (two
  one-sided tests). ``priced_cost``: the second clock's price of a step's logged work,
  ``fit`` (fitted to the comparison's steps) or ``cpu:TRACE.jsonl`` (calibrate's)
  (docs/claims.md). ``named_arms``: ``{arm name: controller overrides}``, arms of a kind
  with settings of their own, e.g. a warm-started SAGC, ``{"sagc_warm": {"kind": "sagc",
  "initial_lambda": 2.0}}`` (each must name its ``kind``)."""

  NAME = "compare"
  algorithms: tuple = tuple(ALGORITHM_PRESETS)
  seeds: int = 1
  static_sizes: tuple = ()
  contextual: tuple = ()
  kinds: tuple = ()
  time_budget_s: float = 0.0
  eval_points: int = 8
  targets: tuple = ()
  equivalence_margin: float = 0.02
  priced_cost: str = "fit"
  named_arms: Any = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for field in _NONE_IS_DEFAULT:
      if getattr(self, field) is None:
        self._set(field, CompareSection.__dataclass_fields__[field].default)
    self._items("algorithms", ALGORITHM_PRESETS.__contains__,
                f"distinct algorithms of {tuple(ALGORITHM_PRESETS)}")
    self._positive_int("seeds")
    self._items("static_sizes", lambda g: isinstance(g, int) and not isinstance(g, bool)
                and g >= 2, "distinct ints >= 2 (() = every controller.candidates size)")
    for field in ("contextual", "kinds"):
      self._kinds(field)
    budget = self.time_budget_s
    if not _number(budget) or not 0 <= budget < math.inf:     # also refuses nan
      raise ValueError(f"compare.time_budget_s={budget!r} must be a number of seconds >= 0 "
                       "(0 = no budget: every arm runs train.steps)")
    self._set("time_budget_s", float(budget))
    self._positive_int("eval_points")
    targets = self._items("targets", lambda t: _number(t) and 0 < t <= 1,
                          "accuracies in (0, 1]", repeated="repeats a target (each is "
                          "reported once)")
    self._set("targets", tuple(float(t) for t in targets))
    margin = self.equivalence_margin
    if not _number(margin) or not 0 < margin < 1:
      raise ValueError(f"compare.equivalence_margin={margin!r} must be an accuracy "
                       "difference in (0, 1)")
    self._set("equivalence_margin", float(margin))
    self._named_arms()
    cost = self.priced_cost
    if not isinstance(cost, str) or not (cost == "fit" or cost.startswith("cpu:")
                                         and len(cost) > 4):
      raise ValueError(f"compare.priced_cost={cost!r} must be 'fit' or 'cpu:TRACE.jsonl'")

  def _items(self, field: str, ok: Callable[[Any], bool], wanted: str,
             repeated: str = "") -> tuple:
    """``field`` as a tuple of distinct items that pass ``ok``; the error says what is
    ``wanted`` (a repeat: ``repeated`` where given)."""
    items = self._tuple(field)
    if not isinstance(items, tuple) or not all(ok(v) for v in items):
      raise ValueError(f"{self._key(field)}={items!r} must be {wanted}")
    if len(set(items)) < len(items):
      raise ValueError(f"{self._key(field)}={items!r} {repeated or f'must be {wanted}'}")
    return items

  def _positive_int(self, field: str) -> None:
    value = getattr(self, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise ValueError(f"{self._key(field)}={value!r} must be a positive int")

  def _kinds(self, field: str) -> None:
    kinds = self._items(field, lambda k: k not in _ALWAYS, "distinct kinds other than "
                        "'sagc' and 'static' (every comparison has those arms)")
    with self._errors_as(f"{self._key(field)}={kinds!r}: "):
      for kind in kinds:
        kind_class(kind)

  def _named_arms(self) -> None:
    arms = self.named_arms
    if not isinstance(arms, Mapping):
      raise ValueError(f"compare.named_arms={arms!r} must map arm names to controller "
                       "overrides")
    for name, overrides in arms.items():
      key = f"compare.named_arms.{name}"
      if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_.]*", name) or (
          name == "sagc" or re.fullmatch(r"static\d+", name) or name in map(
              arm_name, self.contextual + self.kinds)):
        raise ValueError(f"{key}: an arm name must be lower-case letters, digits, '_' and "
                         "'.', and not another arm's (sagc, static<G>, a kind's)")
      if not isinstance(overrides, Mapping) or "kind" not in overrides:
        raise ValueError(f"{key}={overrides!r} must be a mapping of controller settings "
                         "with its kind")
      with self._errors_as(f"{key}.kind: "):
        kind_class(overrides["kind"])
    self._set("named_arms", {name: dict(o) for name, o in arms.items()})

  def variants(self, candidates: Iterable[int]) -> list[tuple[str, dict[str, Any]]]:
    """``(arm name after the algorithm, its controller overrides)`` of each arm of one
    algorithm; ``candidates``: the controller's, the static sizes by default. A kind in
    both ``contextual`` and ``kinds`` is one arm; the named arms come last."""
    sizes = self.static_sizes or tuple(candidates)
    extra = dict.fromkeys(self.contextual + self.kinds)
    return ([(f"static{g}", {"kind": "static", "static_g": g}) for g in sizes]
            + [("sagc", {"kind": "sagc"})]
            + [(arm_name(kind), {"kind": kind}) for kind in extra]
            + list(self.named_arms.items()))
