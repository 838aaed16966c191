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

from sagc_jax.control.protocol import ContextSource, GroupPlan, StepGroups

__all__ = ["EVENTS", "GroupSizeController", "check_range", "straggler_flags",
           "validated_lengths"]

_STATE_VERSION = 1

# The straggler signal a step contributes (sagc module docstring): the fraction of its
# groups that straggle, or the seed's per-step indicator S_t (any group straggles).
EVENTS = ("group", "step")


def straggler_flags(group_max: np.ndarray, group_median: np.ndarray,
                    tau: float) -> np.ndarray:
  """Per-group straggler events ``max > tau * median`` (bool array).

  The multiplicative form is the ratio test ``max/median > tau`` with the
  zero-median case made explicit: a group whose median is 0 straggles iff its
  max is positive (an unbounded ratio); an all-zero group never straggles.
  """
  return group_max > tau * group_median


def validated_lengths(group_max: Any, group_median: Any) -> tuple[np.ndarray, np.ndarray]:
  """Checks the per-group length arrays of one step (the error names what is wrong);
  returns them as float64."""
  arrays = []
  for name, value in (("group_max", group_max), ("group_median", group_median)):
    try:
      arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
      raise ValueError(f"{name} must be an array of numbers, got {value!r:.80}") from None
    if arr.ndim != 1:
      raise ValueError(f"{name} must be 1-D (one entry per group), got shape {arr.shape}")
    if arr.size == 0:
      raise ValueError(f"{name} is empty: a step must report at least one group")
    if not np.isfinite(arr).all():
      raise ValueError(f"{name} contains NaN or infinite lengths at groups "
                       f"{np.flatnonzero(~np.isfinite(arr))[:4].tolist()}")
    if (arr < 0).any():
      raise ValueError(f"{name} contains negative lengths: {arr[arr < 0][:4].tolist()}")
    arrays.append(arr)
  gmax, gmed = arrays
  if gmax.shape != gmed.shape:
    raise ValueError(
        f"group_max has {gmax.size} groups but group_median has {gmed.size}: "
        "they must describe the same groups")
  if (gmed > gmax).any():
    bad = int(np.argmax(gmed > gmax))
    raise ValueError(
        f"group {bad}: median length {gmed[bad]:g} exceeds max length {gmax[bad]:g}")
  return gmax, gmed


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
                high_closed: bool = False) -> float:
  """``value`` as a float in ``(low, high)``, or in ``(low, high]`` when ``high_closed``."""
  if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
    raise ValueError(f"{name} must be a number, got {value!r}")
  value = float(value)
  if not (low < value < high or (high_closed and value == high)):   # NaN fails both
    raise ValueError(f"{name}={value!r} is outside ({low}, {high}{']' if high_closed else ')'}")
  return value


@dataclasses.dataclass(frozen=True)
class _RiskModelParams:
  tau: float
  delta: float
  event: str
  forgetting: float
  prior_alpha: float
  prior_beta: float


class GroupSizeController:
  """Shared machinery: validation, straggler statistics, Beta risk posteriors.

  Subclasses override ``_choose`` (the next G; the default keeps the current one,
  a static size) and ``_update_dual``, and may extend the state.
  Both controllers keep the per-candidate Beta posteriors so a static baseline
  reports the same risk metrics as SAGC.
  """

  kind = "base"
  # The published SAGC discounts every candidate's evidence every step and keeps the
  # Thompson selection at the dual's cap; the default here does neither (sagc's
  # module docstring, "Deviations"). Subclasses may restore the published rules to measure
  # the difference (tests/test_controller.py does); neither flag is part of the state.
  _forget_unused = False
  _back_off_at_cap = True

  def __init__(self, candidates: Sequence[int], *, tau: float, delta: float,
               min_candidates: int, forgetting: float, prior_alpha: float,
               prior_beta: float, seed: int, event: str):
    self.candidates = _validate_candidates(candidates, min_candidates)
    if event not in EVENTS:
      raise ValueError(f"event={event!r} is not one of {EVENTS}")
    self.params = _RiskModelParams(
        tau=check_range("tau", tau, 1.0),
        delta=check_range("delta", delta, 0.0, 1.0),
        event=event,
        forgetting=check_range("forgetting", forgetting, 0.0, 1.0, high_closed=True),
        prior_alpha=check_range("prior_alpha", prior_alpha),
        prior_beta=check_range("prior_beta", prior_beta),
    )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    self.seed = int(seed)
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
    self._steps = 0
    self._group_rate_sum = 0.0               # sum of the steps' group straggler rates
    self._step_event_sum = 0.0               # number of steps with a straggler (S_t = 1)

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
    """``observe`` of the step's groups (the other fields are for contextual kinds)."""
    return self.observe(groups.group_max, groups.group_median)

  def check_process_count(self, processes: int) -> None:
    """Raises when the kind cannot run on ``processes`` processes (every size-per-step
    kind can: all processes see the same gathered lengths and propose the same G)."""

  def observe(self, group_max: Any, group_median: Any) -> dict[str, float]:
    """Feeds back the per-group max/median response lengths of the step.

    The groups must come from a step that used ``self.g`` (the last proposed
    size). Returns flat float metrics: ``g``, ``log2_g``, ``n_groups``,
    ``n_stragglers``, both straggler events of the step (``group_straggler_rate``,
    the fraction of groups; ``step_straggler``, 1.0 iff any group straggles),
    ``straggler_rate`` (the one of the two that ``event`` names: the signal of the
    constraint and of the posteriors), ``lambda`` (after the update), running means
    over steps (``mean_straggler_rate``, ``mean_group_straggler_rate``,
    ``mean_step_straggler_rate``) and ``p_mean/G<g>``, the posterior mean straggler
    probability of every candidate.
    """
    gmax, gmed = validated_lengths(group_max, group_median)
    return self._record_step(straggler_flags(gmax, gmed, self.params.tau))

  def _record_step(self, flags: np.ndarray,
                   size_index: np.ndarray | None = None) -> dict[str, float]:
    """Posterior, dual and running-mean updates of one step; returns its metrics.

    ``flags`` are the step's per-group straggler events; ``size_index`` the index
    (in ``candidates``) of each group's size, None when every group used the
    current size. With the group event each size is a Bernoulli observation per
    group of that size; with the step event the step's S_t is one observation of
    the current size. ``g`` and ``log2_g`` are means over the step's groups (the
    current size when the step used one).
    """
    n_groups = flags.size
    n_straggle = float(np.count_nonzero(flags))
    group_rate = n_straggle / n_groups
    step_straggler = 1.0 if n_straggle else 0.0
    step_event = self.params.event == "step"
    signal = step_straggler if step_event else group_rate
    if step_event:
      evidence = {self._index: (step_straggler, 1.0)}
    elif size_index is None:
      evidence = {self._index: (n_straggle, float(n_groups))}
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
    self._update_dual(signal)
    self._pending = False
    self._steps += 1
    self._group_rate_sum += group_rate
    self._step_event_sum += step_straggler
    if size_index is None:
      g, log2_g = float(self.candidates[self._index]), self._utility[self._index]
    else:
      g = float(np.mean(np.asarray(self.candidates)[size_index]))
      log2_g = float(np.mean(np.asarray(self._utility)[size_index]))
    metrics = {
        "g": g,
        "log2_g": log2_g,
        "n_groups": float(n_groups),
        "n_stragglers": n_straggle,
        "group_straggler_rate": group_rate,
        "step_straggler": step_straggler,
        "straggler_rate": signal,
        "lambda": self._lambda,
        "mean_straggler_rate": (self._step_event_sum if step_event
                                else self._group_rate_sum) / self._steps,
        "mean_group_straggler_rate": self._group_rate_sum / self._steps,
        "mean_step_straggler_rate": self._step_event_sum / self._steps,
    }
    for cand, (a, b) in zip(self.candidates, self.posterior_params()):
      metrics[f"p_mean/G{cand}"] = a / (a + b)
    return metrics

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
        "steps": self._steps,
        "group_rate_sum": self._group_rate_sum,
        "step_event_sum": self._step_event_sum,
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
    self._steps = int(state["steps"])
    # States written before both events existed are "group" states: their "rate_sum" is
    # the group one, and the step-event count is unknown (its running mean is NaN
    # rather than a mean over part of the run).
    self._group_rate_sum = float(state.get("group_rate_sum", state.get("rate_sum")))
    self._step_event_sum = float(state.get("step_event_sum", math.nan))

  # ---------------------------------------------------------- subclass hooks
  def _choose(self) -> int:
    """Index of the next G: by default the current one (a static size)."""
    return self._index

  def _update_dual(self, rate: float) -> None:
    del rate
