"""The ``controller`` config section: which group-size controller kind a run uses, and
its settings (the registry of kinds is ``sagc_jax.control.controller``).

The section's keys are ``kind``, every setting of every registered kind (their typed
``Settings``, in registry order, each default as that kind states it: a kind's defaults
are written once, beside its class) and ``options`` (a user kind's settings that no
registered kind has). One section serves every kind, so switching kind is one
override; each kind reads the keys its settings declare. A setting two kinds share
(``candidates``, ``tau``...) has one default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from sagc_jax.config.section import Section
from sagc_jax.control.controller import KINDS, controller_from_config, group_sizes, kind_class
from sagc_jax.control.protocol import Needs

__all__ = ["ControllerSection"]


class _ControllerChecks(Section):
  """The group-size controller (``sagc_jax.control``, docs/controllers.md): ``kind``, a
  built-in kind's name or a user's ``module:Class``, every registered kind's settings,
  and ``options`` (module docstring). This base holds the section's checks and what it
  answers; the fields are the kinds' (``ControllerSection``)."""

  NAME = "controller"

  def __post_init__(self):
    for field in ("candidates", "tail_edges", "length_edges", "cost_seed", "schedule"):
      self._tuple(field)
    if not isinstance(self.options, Mapping):
      raise ValueError(f"controller.options={self.options!r} must be a mapping of a user "
                       "kind's settings")
    self._set("options", dict(self.options))
    self.build()                 # raises "controller: ..." on bad settings

  def build(self, prompts_for=None):
    """The controller these settings describe; ``prompts_for``: the run's P(G)
    (``RolloutSection.prompts_for``), which the contextual kinds need."""
    return controller_from_config(self.to_dict(), prompts_for=prompts_for)

  @property
  def needs(self) -> Needs:
    """What the kind needs from the run (``control.protocol.Needs``)."""
    return kind_class(self.kind).needs

  def group_sizes(self) -> tuple[int, ...]:
    """The sizes this controller may pick (one for a static G; per-prompt sizes
    are candidates too)."""
    return group_sizes(self.to_dict())


def _kinds_settings() -> list[tuple[str, Any, Any]]:
  """Every registered kind's settings, first definition first."""
  fields: dict[str, tuple[str, Any, Any]] = {}
  for cls in KINDS.values():
    for f in dataclasses.fields(cls.Settings):
      fields.setdefault(f.name, (f.name, f.type, dataclasses.field(default=f.default)))
  return list(fields.values())


ControllerSection = dataclasses.make_dataclass(
    "ControllerSection",
    [("kind", "str", dataclasses.field(default="sagc")), *_kinds_settings(),
     ("options", "Mapping[str, Any]", dataclasses.field(default_factory=dict))],
    bases=(_ControllerChecks,), frozen=True)
ControllerSection.__module__ = __name__
ControllerSection.__doc__ = _ControllerChecks.__doc__
