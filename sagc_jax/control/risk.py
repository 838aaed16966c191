"""The per-size straggler risk model every group-size controller shares: the checks
of a step's lengths and of the settings, the discounted Beta posteriors of the
candidate sizes, the dual variable's bookkeeping, the running means and the
JSON state.

The decision rules are the subclasses': ``sagc_jax.control.sagc`` (SAGC's Thompson
sampling and Lagrangian, whose module docstring gives the algorithm, the per-size
forgetting and the other deviation from the published rules) and the contextual
kinds built on it. Plain numpy: it runs on the host between jitted steps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from sagc_jax.control.protocol import ContextSource, GroupPlan, Needs, StepGroups
from sagc_jax.control.stragglers import (EVENTS, step_straggler_stats, straggler_flags,
                                         validated_lengths)

__all__ = ["GroupSizeController", "RiskSettings", "check_range", "settings_of"]

_STATE_VERSION = 1


def _validate_candidates(candidates: Sequence[int], minimum: int) -> tuple[int, ...]:
  values = tuple(candidates)     # controller_from_config names a non-sequence
  for c in values:
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c <= 0:
      raise ValueError(f"candidates must be positive ints, got {c!r} in {values}")
  if len(set(values)) != len(values):
    raise ValueError(f"candidates contain duplicates: {values}")
  if len(values) < minimum:
    raise ValueError(
        f"need at least {minimum} candidate group size(s), got {values}")
  return tuple(sorted(int(c) for c in values))


def check_range(name: str, value: float, low: float = 0.0, high: float = math.inf, *,
                low_closed: bool = False, high_closed: bool = False) -> float:
  """``value`` as a float in ``(low, high)``; ``low_closed`` / ``high_closed`` include
  that end."""
  if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
    raise ValueError(f"{name} must be a number, got {value!r}")
  value = float(value)
  if not (low < value < high or (low_closed and value == low)
          or (high_closed and value == high)):   # NaN fails every test
    raise ValueError(f"{name}={value!r} is outside {'[' if low_closed else '('}{low}, "
                     f"{high}{']' if high_closed else ')'}")
  return value


@dataclasses.dataclass(frozen=True)
class RiskSettings:
  """The settings every kind's straggler risk model shares, with their defaults (the
  config's ``controller`` section takes its defaults from here and from the kinds'
  own ``Settings``, which extend this). The controllers check the values."""

  candidates: tuple = (4, 8, 16)
  tau: float = 2.0
  delta: float = 0.25
  event: str = EVENTS[0]           # "group"
  forgetting: float = 0.99
  prior_alpha: float = 1.0
  prior_beta: float = 1.0
  seed: int = 0

  def group_sizes(self) -> tuple[int, ...]:
    """The sizes the kind may pick."""
    return tuple(self.candidates)


def settings_of(settings: type, kind: str, **values: Any) -> Any:
  """``settings(**values)``, an unknown name refused by name (not a ``TypeError``)."""
  names = [f.name for f in dataclasses.fields(settings)]
  unknown = sorted(set(values) - set(names))
  if unknown:
    raise ValueError(f"{unknown[0]} is not a setting of a {kind!r} controller "
                     f"(its settings: {', '.join(names)})")
  return settings(**values)


class GroupSizeController:
  """Shared machinery: validation, straggler statistics, Beta risk posteriors.

  Subclasses override ``_choose`` (the next G; the default keeps the current one,
  a static size) and ``_update_dual``, and may extend the state.
  Both controllers keep the per-candidate Beta posteriors so a static baseline
  reports the same risk metrics as SAGC.
  """

  kind = "base"
  Settings = RiskSettings
  needs = Needs()
  # The published SAGC discounts every candidate's evidence every step and keeps the
  # Thompson selection at the dual's cap; the default here does neither (sagc's
  # module docstring, "Deviations"). Subclasses may restore the published rules to measure
  # the difference (tests/test_controller.py does); neither flag is part of the state.
  _forget_unused = False
  _back_off_at_cap = True

  def __init__(self, settings: RiskSettings, *, min_candidates: int):
    s = settings
    self.candidates = _validate_candidates(s.candidates, min_candidates)
    event, seed = s.event, s.seed
    if event not in EVENTS:
      raise ValueError(f"event={event!r} is not one of {EVENTS}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    self.seed = int(seed)
    self.params = RiskSettings(
        candidates=self.candidates, seed=self.seed,
        tau=check_range("tau", s.tau, 1.0),
        delta=check_range("delta", s.delta, 0.0, 1.0),
        event=event,
        forgetting=check_range("forgetting", s.forgetting, 0.0, 1.0, high_closed=True),
        prior_alpha=check_range("prior_alpha", s.prior_alpha),
        prior_beta=check_range("prior_beta", s.prior_beta),
    )
    # The per-candidate state is a few floats: plain Python lists are several
    # times cheaper than numpy arrays at this size (the controller runs every
    # step, on the host, between accelerator calls).
    self._utility = [math.log2(c) for c in self.candidates]
    self._rng = np.random.Generator(np.random.PCG64(self.seed))
    n = len(self.candidates)
    self._straggle_counts = [0.0] * n        # discounted straggler groups per G
    self._ok_counts = [0.0] * n              # discounted non-straggler groups per G
    self._lambda = 0.0
    self._index = 0                          # index of the current G
    self._pending = False                    # propose() called, observe() not yet

  @classmethod
  def from_settings(cls, settings: Any, *, prompts_for: Any = None) -> "GroupSizeController":
    """The controller ``settings`` (a ``cls.Settings``) describe (the registry's call)."""
    del prompts_for                          # the kinds that read a context take it
    return cls(**dataclasses.asdict(settings))

  # ---------------------------------------------------------------- public API
  @property
  def g(self) -> int:
    """The current (last proposed) group size."""
    return self.candidates[self._index]

  @property
  def lam(self) -> float:
    return self._lambda

  def posterior_params(self) -> list[tuple[float, float]]:
    """Beta (alpha, beta) of every candidate's straggler probability (sorted order)."""
    a0, b0 = self.params.prior_alpha, self.params.prior_beta
    return [(a0 + s, b0 + f) for s, f in zip(self._straggle_counts, self._ok_counts)]

  def posterior_mean(self) -> np.ndarray:
    """Posterior mean straggler probability per candidate (sorted order)."""
    return np.array([a / (a + b) for a, b in self.posterior_params()])

  def propose(self) -> int:
    """Group size for the next step.

    Calling ``propose`` again before ``observe`` returns the same G without a
    new draw, so a step that collects several sampling rounds (DAPO dynamic
    sampling) keeps one decision.
    """
    if not self._pending:
      self._index = self._choose()
      self._pending = True
    return self.g

  # ------------------------------------------- the protocol (control.protocol)
  def plan(self, context: ContextSource | None = None) -> GroupPlan:
    """The step's plan: ``propose()``'s G for every prompt (no context needed)."""
    return GroupPlan(self.propose())

  def observe_step(self, groups: StepGroups) -> dict[str, float]:
    """The step's groups, which must come from a step that used ``self.g``; returns the
    controller's diagnostics (``_record_step``)."""
    gmax, gmed = validated_lengths(groups.group_max, groups.group_median)
    return self._record_step(straggler_flags(gmax, gmed, self.params.tau))

  def observe(self, group_max: Any, group_median: Any, **fields: Any) -> dict[str, float]:
    """Feeds back the per-group max/median response lengths of the step (the
    single-size API; the contextual kinds also take ``StepGroups``' other fields).
    Returns the step's straggler statistics at this controller's ``tau`` and ``event``
    (``control.stragglers.step_straggler_stats``: ``g``, ``log2_g``, ``n_groups``,
    ``n_stragglers``, ``group_straggler_rate``, ``step_straggler``,
    ``straggler_rate``) and its diagnostics."""
    groups = StepGroups(group_max, group_median, **fields)
    sizes = np.asarray(self.candidates)[self._observed_sizes(groups.group_sizes,
                                                             np.size(group_max))]
    diagnostics = self.observe_step(groups)          # checks the lengths first
    return {**step_straggler_stats(group_max, group_median, sizes, tau=self.params.tau,
                                   event=self.params.event), **diagnostics}

  def _observed_sizes(self, group_sizes: Any, n: int) -> np.ndarray:
    """Index in ``candidates`` of every group's size: a size-per-step kind's step uses
    ``g``."""
    del group_sizes
    return np.full(n, self._index)

  def _record_step(self, flags: np.ndarray,
                   size_index: np.ndarray | None = None) -> dict[str, float]:
    """Posterior and dual updates of one step; returns the diagnostics: ``lambda``
    (after the update) and ``p_mean/G<g>``, the posterior mean straggler probability
    of every candidate.

    ``flags`` are the step's per-group straggler events at this controller's tau;
    ``size_index`` the index (in ``candidates``) of each group's size (None: every
    group used the current size, the common case, counted without a pass per size).
    With the group event each size is a Bernoulli observation per group of that size;
    with the step event the step's S_t is one observation of the current size.
    """
    n_straggle = float(np.count_nonzero(flags))
    step_straggler = 1.0 if n_straggle else 0.0
    step_event = self.params.event == "step"
    if step_event:
      evidence = {self._index: (step_straggler, 1.0)}
    elif size_index is None:
      evidence = {self._index: (n_straggle, float(flags.size))}
    else:
      evidence = {int(k): (float(np.count_nonzero(flags[size_index == k])),
                           float(np.count_nonzero(size_index == k)))
                  for k in np.unique(size_index)}
    # Per-size forgetting (sagc module docstring, deviation 1): only a size that was
    # observed has its evidence discounted; the others keep theirs.
    gamma = self.params.forgetting
    for k in range(len(self.candidates)) if self._forget_unused else evidence:
      hits, trials = evidence.get(k, (0.0, 0.0))
      self._straggle_counts[k] = gamma * self._straggle_counts[k] + hits
      self._ok_counts[k] = gamma * self._ok_counts[k] + (trials - hits)
    self._update_dual(step_straggler if step_event else n_straggle / flags.size)
    self._pending = False
    means = {f"p_mean/G{cand}": a / (a + b)
             for cand, (a, b) in zip(self.candidates, self.posterior_params())}
    return {"lambda": self._lambda, **means}

  def state_dict(self) -> dict[str, Any]:
    """JSON-serialisable state (posteriors, lambda, current G, RNG, counters).

    The PCG64 state integers exceed 64 bits, so they are stored as decimal
    strings to survive any JSON reader.
    """
    rng_state = self._rng.bit_generator.state
    return {
        "version": _STATE_VERSION,
        "kind": self.kind,
        "event": self.params.event,
        "candidates": list(self.candidates),
        "straggle_counts": list(self._straggle_counts),
        "ok_counts": list(self._ok_counts),
        "lambda": self._lambda,
        "g": self.candidates[self._index],
        "pending": self._pending,
        "rng": {
            "bit_generator": rng_state["bit_generator"],
            "state": str(rng_state["state"]["state"]),
            "inc": str(rng_state["state"]["inc"]),
            "has_uint32": int(rng_state["has_uint32"]),
            "uinteger": int(rng_state["uinteger"]),
        },
    }

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores a ``state_dict``; the candidate set must match this controller's."""
    if state.get("version") != _STATE_VERSION:
      raise ValueError(f"unsupported controller state version {state.get('version')!r}, "
                       f"expected {_STATE_VERSION}")
    if state.get("kind") != self.kind:
      raise ValueError(f"state is for a {state.get('kind')!r} controller, this is {self.kind!r}")
    # States written before both events existed are "group" states.
    if state.get("event", "group") != self.params.event:
      raise ValueError(f"state counts {state.get('event', 'group')!r} straggler events, "
                       f"this controller counts {self.params.event!r} (controller.event): "
                       "its posteriors and lambda would mean something else")
    if tuple(state["candidates"]) != self.candidates:
      raise ValueError(f"state candidates {tuple(state['candidates'])} differ from "
                       f"this controller's {self.candidates}")
    rng = state["rng"]
    self._rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int(rng["state"]), "inc": int(rng["inc"])},
        "has_uint32": int(rng["has_uint32"]),
        "uinteger": int(rng["uinteger"]),
    }
    self._straggle_counts = [float(c) for c in state["straggle_counts"]]
    self._ok_counts = [float(c) for c in state["ok_counts"]]
    self._lambda = float(state["lambda"])
    self._index = self.candidates.index(int(state["g"]))
    self._pending = bool(state["pending"])
    # States written before the straggler measurement left the controllers also hold
    # running means ("steps", "group_rate_sum", ...): they never entered a decision.

  # ---------------------------------------------------------- subclass hooks
  def _choose(self) -> int:
    """Index of the next G: by default the current one (a static size)."""
    return self._index

  def _update_dual(self, rate: float) -> None:
    del rate
