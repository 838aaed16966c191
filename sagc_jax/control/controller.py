"""The registry of group-size controller kinds: the one place the kinds are listed,
and the one place a kind is built from a config section.

Built-in kinds (``controller.kind``):

* ``"sagc"``: Straggler-Aware Group Control, one G per step from a Beta risk
  posterior per size (``sagc_jax.control.sagc``, whose docstring gives the algorithm
  and its two documented deviations from the paper);
* ``"static"``: a fixed G with SAGC's risk model (baselines);
* ``"prompt_aware"``: SAGC whose risk is predicted from the step's own prompts
  (``sagc_jax.control.prompt_aware``);
* ``"per_prompt"``: one G_i per prompt under the step's row budget
  (``sagc_jax.control.per_prompt``);
* ``"signal_rate"``: the G of most expected informative groups per predicted second,
  from per-prompt pass-rate posteriors and a cost model fitted to the measured step
  seconds (``sagc_jax.control.signal_rate``);
* ``"signal_rate_per_prompt"``: a size per prompt by the same objective, skipping the
  prompts whose posterior says always or never solved
  (``sagc_jax.control.signal_rate_per_prompt``);
* ``"schedule"``: a given G per step, e.g. the replay oracle's schedule
  (``sagc_jax.control.schedule``).

A kind outside the package is named by import path, ``"my_module:MyController"``, as
``reward.fns`` names a user's reward: any class that meets the protocol
(``control.protocol.GroupController``: ``kind``, ``Settings``, ``needs``,
``from_settings``, ``plan``, ``observe_step``, ``state_dict``, ``load_state_dict``).
Its settings are the config section's keys that its ``Settings`` declares, plus
``controller.options`` for settings the section does not have.

Every caller (the config checks, the trainer, the replay, compare, the learning
checks) asks a kind what it needs (``needs``) rather than listing kinds.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

from sagc_jax.control.context import BatchContext
from sagc_jax.control.per_prompt import PerPromptController
from sagc_jax.control.prompt_aware import PromptAwareController
from sagc_jax.control.protocol import Needs
from sagc_jax.control.sagc import SAGCController, StaticController
from sagc_jax.control.schedule import ScheduleController
from sagc_jax.control.signal_rate import SignalRateController
from sagc_jax.control.signal_rate_per_prompt import SignalRatePerPromptController
from sagc_jax.control.stragglers import EVENTS, straggler_flags

__all__ = ["CONTROLLER_KINDS", "EVENTS", "KINDS", "BatchContext",
           "PerPromptController", "PromptAwareController", "SAGCController",
           "ScheduleController", "SignalRateController", "SignalRatePerPromptController",
           "StaticController", "arm_name", "controller_from_config", "group_sizes",
           "kind_class", "kind_settings", "straggler_flags"]

KINDS: dict[str, type] = {cls.kind: cls for cls in (
    SAGCController, StaticController, PromptAwareController, PerPromptController,
    SignalRateController, SignalRatePerPromptController, ScheduleController)}
CONTROLLER_KINDS = tuple(KINDS)



def kind_class(kind: str) -> type:
  """The class of a built-in kind's name or of a ``"module:Class"`` import path; an
  error names ``controller.kind`` and why."""
  if not isinstance(kind, str):
    raise ValueError(f"controller.kind={kind!r} must be a string (one of "
                     f"{list(CONTROLLER_KINDS)} or 'module:Class')")
  if kind in KINDS:
    return KINDS[kind]
  module, _, name = kind.partition(":")
  if not module or not name:
    raise ValueError(f"controller.kind={kind!r} is not one of {list(CONTROLLER_KINDS)} "
                     "nor an import path 'module:Class'")
  try:
    cls = getattr(importlib.import_module(module), name)
  except ImportError as err:
    raise ValueError(f"controller.kind={kind!r}: cannot import {module!r} ({err})") from None
  except AttributeError:
    raise ValueError(f"controller.kind={kind!r}: module {module!r} has no {name!r}") from None
  missing = [a for a in ("Settings", "needs", "from_settings", "plan", "observe_step",
                         "state_dict", "load_state_dict") if not hasattr(cls, a)]
  if missing or not dataclasses.is_dataclass(getattr(cls, "Settings", None)):
    raise ValueError(f"controller.kind={kind!r} is not a controller kind: it lacks "
                     f"{', '.join(missing) or 'a dataclass Settings'} "
                     "(control.protocol.GroupController)")
  return cls


def arm_name(kind: str) -> str:
  """A kind as an arm's name in the replay and compare (a file name: ``module:Class``
  becomes ``module.Class``)."""
  return kind.replace(":", ".")


def kind_settings(section: Mapping[str, Any]) -> tuple[type, Any]:
  """The kind's class and its typed ``Settings`` from a complete controller section
  (``config.ControllerSection.to_dict()``: the section states every default).

  The kind's settings are the section's keys its ``Settings`` declares, and the keys
  of ``options``; the other kinds' keys are ignored (one section serves every kind,
  so switching kind is one override). A key no kind has, or an option the kind does
  not declare, is an error. Errors name the offending ``controller.<key>``.
  """
  values = dict(section)
  if "kind" not in values:
    raise ValueError("controller section lacks kind: build it with "
                     "config.controller_settings (the section states every default)")
  kind = values.pop("kind")
  cls = kind_class(kind)
  options = dict(values.pop("options", None) or {})
  names = [f.name for f in dataclasses.fields(cls.Settings)]
  known = {f.name for c in (*KINDS.values(), cls) for f in dataclasses.fields(c.Settings)}
  if set(values) - known:
    raise ValueError(f"controller.{sorted(set(values) - known)[0]} is not a controller "
                     f"setting (allowed: kind, options, {', '.join(sorted(known))})")
  unknown = sorted(set(options) - set(names))
  if unknown:
    raise ValueError(f"controller.options.{unknown[0]} is not a setting of kind {kind!r} "
                     f"(its settings: {', '.join(names)})")
  picked = {k: v for k, v in {**values, **options}.items() if k in names}
  for key in ("candidates", "tail_edges", "length_edges", "cost_seed", "schedule"):
    if picked.get(key) is not None:
      try:
        picked[key] = tuple(picked[key])
      except TypeError:
        raise ValueError(f"controller.{key}={picked[key]!r} must be a sequence") from None
  try:
    return cls, cls.Settings(**picked)
  except TypeError as err:         # a setting without a default, not given
    raise ValueError(f"controller.kind={kind!r}: {err}") from None


def group_sizes(section: Mapping[str, Any]) -> tuple[int, ...]:
  """The sizes a controller section's kind may pick: its settings' ``group_sizes()``
  (a static G: its one size), else every candidate."""
  _, settings = kind_settings(section)
  sizes = getattr(settings, "group_sizes", None)
  return tuple(sizes()) if sizes else tuple(section["candidates"])


def controller_from_config(section: Mapping[str, Any], *,
                           prompts_for: Callable[[int], int] | None = None) -> Any:
  """Builds the controller a complete controller section describes (``kind_settings``);
  ``prompts_for`` is the run's P(G), for the kinds that read a context (None: every
  prompt of the context)."""
  cls, settings = kind_settings(section)
  try:
    return cls.from_settings(settings, prompts_for=prompts_for)
  except ValueError as err:
    raise ValueError(f"controller: {err}") from None
