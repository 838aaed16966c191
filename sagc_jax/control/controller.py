"""The group-size controllers, built from a config: the one import the trainer,
the simulator and the config checks use.

Kinds (``controller.kind``):

* ``"sagc"``: Straggler-Aware Group Control, one G per step from a
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

from typing import Any, Mapping

from sagc_jax.control.context import BatchContext
from sagc_jax.control.per_prompt import PerPromptController
from sagc_jax.control.prompt_aware import PromptAwareController, PromptsFor
from sagc_jax.control.risk import EVENTS, straggler_flags
from sagc_jax.control.sagc import SAGCController, StaticController

__all__ = [
    "CONTROLLER_KINDS",
    "KIND_SETTINGS",
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
KIND_SETTINGS = {"sagc": _SAGC_KEYS, "static": _STATIC_KEYS, "prompt_aware": _CONTEXT_KEYS,
         "per_prompt": _CONTEXT_KEYS}

Controller = SAGCController | StaticController | PromptAwareController | PerPromptController


def controller_from_config(section: Mapping[str, Any], *,
                           prompts_for: PromptsFor = None) -> Controller:
  """Builds the controller a complete controller section describes
  (``config.ControllerSection.to_dict()``: the section alone states the defaults).

  Keys: ``kind`` (``CONTROLLER_KINDS``), ``candidates``, ``tau``, ``delta``,
  ``event`` ('group' or 'step'), ``seed``, ``forgetting``, ``prior_alpha``,
  ``prior_beta``; SAGC and the contextual kinds use ``eta``, ``lambda_max``,
  ``initial_g`` (None = smallest); static uses ``static_g``; the contextual kinds
  also ``tail_edges``, ``length_edges``, ``cell_prior_strength``, ``history_size``,
  ``history_forgetting``. Keys of the other kinds are ignored; unknown keys are
  errors. Errors name the offending ``controller.<key>``.

  The contextual kinds need the caller's prompts per step P(G), ``prompts_for``
  (None: every prompt of the context).
  """
  values = dict(section)
  missing = sorted({"kind", *KIND_SETTINGS.get(values.get("kind"), ())} - set(values))
  if missing:
    raise ValueError(f"controller section lacks {', '.join(missing)}: build it with "
                     "config.controller_settings (the section states every default)")
  kind = values.pop("kind")
  if kind not in KIND_SETTINGS:
    raise ValueError(f"controller.kind={kind!r} is not one of {list(CONTROLLER_KINDS)}")
  known = sorted(set().union(*KIND_SETTINGS.values()))
  unknown = sorted(set(values) - set(known))
  if unknown:
    raise ValueError(f"controller.{unknown[0]} is not a controller setting "
                     f"(allowed: kind, {', '.join(known)})")
  # One config section serves every kind (switching kind is one override), so the
  # other kinds' settings are accepted and ignored.
  values = {k: v for k, v in values.items() if k in KIND_SETTINGS[kind]}
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
    return cls(prompts_for=prompts_for, **values)
  except ValueError as err:
    raise ValueError(f"controller: {err}") from None
