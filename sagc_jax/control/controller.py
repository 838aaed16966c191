"""The group-size controllers, built from a config: the one import the trainer,
the simulator and the config checks use.

Kinds (``controller.kind``):

* ``"sagc"`` (default): Straggler-Aware Group Control, one G per step from a
  Beta risk posterior per size (``sagc_jax.control.sagc``, whose docstring gives
  the algorithm and its two documented deviations from the paper);
* ``"static"``: a fixed G with SAGC's metrics (baselines);
* ``"prompt_aware"``: SAGC whose risk is predicted from the step's own prompts
  (history and length buckets; ``sagc_jax.control.prompt_aware``);
* ``"per_prompt"``: one G_i per prompt under the step's row budget
  (``sagc_jax.control.per_prompt``).

The equations of the two contextual kinds are in docs/controllers.md. Every
controller is plain numpy (no JAX), costs tens of microseconds (SAGC, static) to
about a millisecond (the contextual kinds) per step on the host, and round-trips
its whole state (RNG included) through a JSON ``state_dict``.
"""

from __future__ import annotations

from typing import Any

from sagc_jax.control import budget
from sagc_jax.control.context import BatchContext
from sagc_jax.control.per_prompt import PerPromptController
from sagc_jax.control.prompt_aware import PromptAwareController, PromptsFor
from sagc_jax.control.risk import EVENTS, straggler_flags
from sagc_jax.control.sagc import SAGCController, StaticController

__all__ = [
    "CONTROLLER_KINDS",
    "EVENTS",
    "BatchContext",
    "PerPromptController",
    "PromptAwareController",
    "SAGCController",
    "StaticController",
    "controller_from_config",
    "straggler_flags",
]

CONTROLLER_KINDS = ("sagc", "static", "prompt_aware", "per_prompt")

_SAGC_KEYS = ("candidates", "tau", "delta", "eta", "lambda_max", "forgetting",
              "prior_alpha", "prior_beta", "initial_g", "seed", "event")
_STATIC_KEYS = ("candidates", "tau", "delta", "forgetting", "prior_alpha",
                "prior_beta", "seed", "static_g", "event")
# The contextual kinds: SAGC's settings plus the features and the prompt history.
_CONTEXT_KEYS = _SAGC_KEYS + ("tail_edges", "length_edges", "cell_prior_strength",
                              "history_size", "history_forgetting")
_KEYS = {"sagc": _SAGC_KEYS, "static": _STATIC_KEYS, "prompt_aware": _CONTEXT_KEYS,
         "per_prompt": _CONTEXT_KEYS}

Controller = SAGCController | StaticController | PromptAwareController | PerPromptController


def _prompts_for_of(config: Any) -> PromptsFor:
  """P(G) from the config's rollout (training) or sim (simulator) section, if any."""
  for name in ("rollout", "sim"):
    if name in config and "mode" in config[name]:
      section = config[name]
      return lambda g: budget.prompts_for(section, g)
  return None


def controller_from_config(config: Any, *, prompts_for: PromptsFor = None) -> Controller:
  """Builds the controller described by ``config.controller`` (or a bare section).

  Keys: ``kind`` (``CONTROLLER_KINDS``), ``candidates``, ``tau``, ``delta``,
  ``event`` ('group' or 'step'), ``seed``, ``forgetting``, ``prior_alpha``,
  ``prior_beta``; SAGC and the contextual kinds use ``eta``, ``lambda_max``,
  ``initial_g`` (None = smallest); static uses ``static_g``; the contextual kinds
  also ``tail_edges``, ``length_edges``, ``cell_prior_strength``, ``history_size``,
  ``history_forgetting``. Keys of the other kinds are ignored; unknown keys are
  errors. Missing optional keys take the class defaults. Errors name the
  offending ``controller.<key>``.

  The contextual kinds need the caller's prompts per step P(G): ``prompts_for``
  when given, else ``prompts_for`` of the config's ``rollout`` section (or
  the simulator's ``sim``), else every prompt of the context (a bare section).
  """
  section = config["controller"] if "controller" in config else config
  values = dict(section.to_dict() if hasattr(section, "to_dict") else section)
  kind = values.pop("kind", "sagc")
  if kind not in _KEYS:
    raise ValueError(f"controller.kind={kind!r} is not one of {list(CONTROLLER_KINDS)}")
  known = sorted(set().union(*_KEYS.values()))
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise ValueError(f"controller.{unknown[0]} is not a controller setting "
                     f"(allowed: kind, {', '.join(known)})")
  # One config section serves every kind (switching kind is one override), so the
  # other kinds' settings are accepted and ignored.
  values = {k: v for k, v in values.items() if k in _KEYS[kind]}
  for key in ("candidates", "tail_edges", "length_edges"):
    if key in values and values[key] is not None:
      try:
        values[key] = tuple(values[key])
      except TypeError:
        raise ValueError(f"controller.{key}={values[key]!r} must be a sequence") from None
  try:
    if kind == "sagc":
      return SAGCController(**values)
    if kind == "static":
      g = values.pop("static_g", None)
      if g is None:
        raise ValueError("static_g is required for a 'static' controller (e.g. 8)")
      return StaticController(g, **values)
    cls = PromptAwareController if kind == "prompt_aware" else PerPromptController
    rule = prompts_for if prompts_for is not None else _prompts_for_of(config)
    return cls(prompts_for=rule, **values)
  except ValueError as err:
    raise ValueError(f"controller: {err}") from None
