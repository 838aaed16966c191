"""SAGC and a static baseline: group-size controllers for synchronous GRPO/DAPO.

``sagc_jax.control.controller`` builds every controller kind from a config; the
contextual kinds (``prompt_aware``, ``per_prompt``) extend ``SAGCController`` in
their own modules (docs/controllers.md).

Synchronous on-policy RL samples a group of G responses per prompt and waits
for the longest response of the step. SAGC (Straggler-Aware Group Control)
picks G every step from a small sorted candidate set by online constrained
optimisation:

* utility of a group size ``u(G) = log2 G`` (larger groups, better advantage
  estimates, diminishing returns);
* straggler event of one group: ``max_len > tau * median_len`` (i.e.
  ``max/median > tau``, written multiplicatively so that a zero median needs
  no division: an all-zero group does not straggle, a zero median with a
  positive max does);
* straggler signal of one step, ``event``: ``"group"`` = the fraction of the
  step's groups that straggle; ``"step"`` = the seed's binary indicator S_t, 1 iff
  any group of the step straggles (the event whose rate the paper reports);
* constraint: long-run mean of the step's signal at most ``delta``;
* Lagrangian ``L(G; lam) = u(G) - lam * p(G)`` with the dual variable updated
  by projected ascent ``lam <- clip(lam + eta * (rate - delta), 0, lam_max)``
  after every step;
* risk model ``p(G) ~ Beta(alpha0 + s_G, beta0 + f_G)`` where ``s_G``/``f_G``
  are discounted straggler / non-straggler counts. After each step the counts of
  the G that was used are multiplied by the forgetting factor ``gamma`` and the
  step's counts are added to them (``"group"``: one Bernoulli observation per
  group; ``"step"``: one per step, S_t). The counts of the other candidates are
  left as they are (see "Deviations" below);
* selection by Thompson sampling: draw ``p~_G`` from every posterior and take
  the G maximising ``u(G) - lam * p~_G`` among the current size and its
  neighbours in the sorted candidate list (local search, no 4 -> 16 jumps).
  While ``lam`` is pinned at ``lam_max`` the controller instead steps down one
  size, or stays at the smallest (see "Deviations" below).

Deviations from SAGC as published, and why. Both concern the regime where even
the smallest G violates ``delta``: there the controller should settle at the
smallest G, with that G's own straggler rate, and with the published rules it
does not: they keep leaving it for larger sizes, most of all with the step event.
``python tests/test_controller.py`` compares both rule sets on feasible and
infeasible length scenarios (docs/results.md, "Controller: deviations from the
published SAGC").

1. Per-size forgetting. The published risk model discounts every candidate's
   counts every step (discounted Thompson sampling, Raj & Kalyani 2017), so a
   size that is not used decays back to its prior (mean ``alpha0 / (alpha0 +
   beta0)``, 0.5 by default) in about ``1 / (1 - gamma)`` steps and is tried
   again, whatever was learned about it. With one Bernoulli observation per step
   (``"step"``) a revisit restores little evidence, so the controller keeps
   leaving the smallest G. Here a size's evidence ages only when that size is
   observed: each posterior holds the discounted last ~``1 / (1 - gamma)``
   observations *of that size*, so the size in use still tracks drifting lengths
   at the published speed, while an unused size keeps what was last seen of it.
   Re-adaptation when lengths get lighter comes from the dual variable: with
   slack, ``lam`` falls by ``eta * (delta - rate)`` per step until the utility
   gain outweighs even a stale risk estimate and the larger size is observed
   afresh (after a phase at the cap this takes about ``lam_max / (eta * delta)``
   steps, 200 by default, where the published rules, exploring all along, often
   came back sooner). On the feasible regimes of the tests the long-run rate
   stays at ``delta`` (below it where G = 16 is safe), as with the published
   rules, and mean log2 G barely moves.
2. Backing off at the cap. With ``lam = lam_max`` the Lagrangian still trades
   one unit of log2 G for ``1 / lam_max`` of risk, although the constraint is
   violated at the highest price of risk the dual may set. Two things go wrong
   there even with exact posteriors: local search is trapped at the largest G
   whenever ``p(16) - p(8) < 1 / lam_max`` (both straggle in ~every step, so the
   Lagrangian prefers 16 to its only neighbour 8 although 4 is better), and
   Thompson sampling keeps exploring upward, since telling ``p(8) = 0.99`` from
   ``p(4) = 0.9`` takes dozens of one-bit observations of G = 8 (per-size
   forgetting alone still leaves G = 4 too often). So
   while ``lam`` sits at ``lam_max`` the controller steps down one size per step
   and stays at the smallest, the safe size (also the default ``initial_g``): SAGC's
   premise is that straggler risk grows with G. Stepping down only when the
   smaller size's sampled risk is lower was tried too: a stale, optimistic
   posterior of a larger size then held the controller there for tens of steps.
   The rule never fires while ``lam`` is below its cap: in feasible regimes the
   equilibrium ``lam`` is far below ``lam_max`` and the published selection is
   unchanged; with a small ``lam_max`` it keeps the constraint enforceable.
   Only steps with ``lam`` below the cap explore (with ``"step"``, those after a
   step without a straggler).

The class attributes ``_forget_unused = True`` and ``_back_off_at_cap = False``
restore the published rules (``PublishedSAGC`` in the tests, which compare the
two).

The inputs are only per-group max and median response lengths. The module is
plain numpy (it must never import jax: it runs on the host between jitted
steps and costs microseconds). All state, including the RNG, round-trips
through a JSON-serialisable ``state_dict`` so a resumed run decides exactly as
the uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from sagc_jax.control.protocol import ContextSource, GroupPlan, StepGroups

__all__ = [
    "EVENTS",
    "SAGCController",
    "StaticController",
    "check_range",
    "straggler_flags",
    "validated_lengths",
]

_STATE_VERSION = 1

# The straggler signal a step contributes (module docstring): the fraction of its
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
  """Checks the per-group length arrays of one step; returns them as float64.

  Runs on every step, so the common (valid) case costs a handful of numpy
  reductions; the detailed diagnosis only runs once something is wrong.
  """
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
    arrays.append(arr)
  gmax, gmed = arrays
  if gmax.shape != gmed.shape:
    raise ValueError(
        f"group_max has {gmax.size} groups but group_median has {gmed.size}: "
        "they must describe the same groups")
  lowest = np.minimum(gmax.min(), gmed.min())   # NaN propagates through np.minimum / .max
  highest = np.maximum(gmax.max(), gmed.max())
  if not (lowest >= 0.0 and highest < np.inf) or (gmed > gmax).any():
    _diagnose(gmax, gmed)
  return gmax, gmed


def _diagnose(gmax: np.ndarray, gmed: np.ndarray) -> None:
  """Raises the ValueError that names what is wrong with a step's lengths."""
  for name, arr in (("group_max", gmax), ("group_median", gmed)):
    bad = ~np.isfinite(arr)
    if bad.any():
      raise ValueError(f"{name} contains NaN or infinite lengths at groups "
                       f"{np.flatnonzero(bad)[:4].tolist()}")
    if (arr < 0).any():
      raise ValueError(f"{name} contains negative lengths: {arr[arr < 0][:4].tolist()}")
  bad = int(np.argmax(gmed > gmax))
  raise ValueError(
      f"group {bad}: median length {gmed[bad]:g} exceeds max length {gmax[bad]:g}")


def _validate_candidates(candidates: Sequence[int], minimum: int) -> tuple[int, ...]:
  try:
    values = [c for c in candidates]
  except TypeError:
    raise ValueError(f"candidates must be a sequence of ints, got {candidates!r}") from None
  for c in values:
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c <= 0:
      raise ValueError(f"candidates must be positive ints, got {c!r} in {tuple(values)}")
  if len(set(values)) != len(values):
    raise ValueError(f"candidates contain duplicates: {tuple(values)}")
  if len(values) < minimum:
    raise ValueError(
        f"need at least {minimum} candidate group size(s), got {tuple(values)}")
  return tuple(sorted(int(c) for c in values))


def check_range(name: str, value: float, low: float, high: float,
                 low_open: bool, high_open: bool) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
    raise ValueError(f"{name} must be a number, got {value!r}")
  value = float(value)
  below = value <= low if low_open else value < low
  above = value >= high if high_open else value > high
  if math.isnan(value) or below or above:
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    raise ValueError(f"{name}={value!r} is outside {lo}{low}, {high}{hi}")
  return value


@dataclasses.dataclass(frozen=True)
class _RiskModelParams:
  tau: float
  delta: float
  event: str
  forgetting: float
  prior_alpha: float
  prior_beta: float


class _GroupSizeController:
  """Shared machinery: validation, straggler statistics, Beta risk posteriors.

  Subclasses implement ``_choose`` (the next G) and may extend the state.
  Both controllers keep the per-candidate Beta posteriors so a static baseline
  reports the same risk metrics as SAGC.
  """

  kind = "base"
  # The published SAGC discounts every candidate's evidence every step and keeps the
  # Thompson selection at the dual's cap; this module's default does neither (module
  # docstring, "Deviations"). Subclasses may restore the published rules to measure
  # the difference (tests/test_controller.py does); neither flag is part of the state.
  _forget_unused = False
  _back_off_at_cap = True

  def __init__(self, candidates: Sequence[int], *, tau: float, delta: float,
               forgetting: float, prior_alpha: float, prior_beta: float,
               seed: int, min_candidates: int, event: str = "group"):
    self.candidates = _validate_candidates(candidates, min_candidates)
    if event not in EVENTS:
      raise ValueError(f"event={event!r} is not one of {EVENTS}")
    self.params = _RiskModelParams(
        tau=check_range("tau", tau, 1.0, math.inf, True, True),
        delta=check_range("delta", delta, 0.0, 1.0, True, True),
        event=event,
        forgetting=check_range("forgetting", forgetting, 0.0, 1.0, True, False),
        prior_alpha=check_range("prior_alpha", prior_alpha, 0.0, math.inf, True, True),
        prior_beta=check_range("prior_beta", prior_beta, 0.0, math.inf, True, True),
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
    if self.params.event == "step":
      signal = step_straggler
      evidence = {self._index: (step_straggler, 1.0)}
    else:
      signal = group_rate
      if size_index is None:
        evidence = {self._index: (n_straggle, float(n_groups))}
      else:
        evidence = {int(k): (float(np.count_nonzero(flags[size_index == k])),
                             float(np.count_nonzero(size_index == k)))
                    for k in np.unique(size_index)}
    # Per-size forgetting (module docstring, deviation 1): only a size that was
    # observed has its evidence discounted; the others keep theirs.
    gamma = self.params.forgetting
    if self._forget_unused:
      self._straggle_counts = [gamma * c for c in self._straggle_counts]
      self._ok_counts = [gamma * c for c in self._ok_counts]
    for k, (hits, trials) in evidence.items():
      if not self._forget_unused:
        self._straggle_counts[k] *= gamma
        self._ok_counts[k] *= gamma
      self._straggle_counts[k] += hits
      self._ok_counts[k] += trials - hits
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
        "mean_straggler_rate": (self._step_event_sum if self.params.event == "step"
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
    if state["g"] not in self.candidates:
      raise ValueError(f"state g={state['g']!r} is not one of {self.candidates}")
    n = len(self.candidates)
    straggle = [float(c) for c in state["straggle_counts"]]
    ok = [float(c) for c in state["ok_counts"]]
    if len(straggle) != n or len(ok) != n or min(straggle + ok) < 0:
      raise ValueError(f"state posterior counts must be {n} non-negative numbers each")
    rng = state["rng"]
    if rng["bit_generator"] != "PCG64":
      raise ValueError(f"state RNG {rng['bit_generator']!r} is not PCG64")
    self._rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int(rng["state"]), "inc": int(rng["inc"])},
        "has_uint32": int(rng["has_uint32"]),
        "uinteger": int(rng["uinteger"]),
    }
    self._straggle_counts = straggle
    self._ok_counts = ok
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
    raise NotImplementedError

  def _update_dual(self, rate: float) -> None:
    del rate


class SAGCController(_GroupSizeController):
  """Straggler-Aware Group Control (see the module docstring for the algorithm).

  Args:
    candidates: allowed group sizes (at least two, positive, distinct; sorted
      internally).
    tau: straggler threshold on max/median response length, > 1.
    delta: target long-run straggler rate, in (0, 1).
    eta: dual step size of the projected ascent on lambda (> 0). Lambda moves
      by ``eta * (rate - delta)`` per step.
    lambda_max: projection bound of lambda (> 0). It caps how strongly risk
      can outweigh utility, and so how long lambda needs to come back down
      after a heavy-tailed phase (at least ``lambda_max / (eta * delta)`` steps).
      While lambda sits at the bound the controller steps down one size per
      step (or stays at the smallest).
    forgetting: discount in (0, 1] of a candidate's posterior evidence each
      time that candidate is observed (1 = never forget). The evidence
      half-life is ``ln 2 / (1 - forgetting)`` observations of that size; an
      unused size keeps its evidence.
    prior_alpha, prior_beta: Beta prior of each candidate's straggler
      probability (the posterior of a size never observed).
    initial_g: the G of the first step (default: the smallest candidate, the
      safe start).
    seed: seed of the Thompson-sampling RNG.
    event: the straggler signal of a step (``EVENTS``): ``"group"``, the fraction
      of its groups that straggle (one posterior observation per group), or
      ``"step"``, the seed's S_t = 1 iff any group straggles (one observation per
      step; ``delta`` then bounds the fraction of steps with a straggler).
  """

  kind = "sagc"

  def __init__(self, candidates: Sequence[int] = (4, 8, 16), tau: float = 2.0,
               delta: float = 0.25, *, eta: float = 1.0, lambda_max: float = 50.0,
               forgetting: float = 0.99, prior_alpha: float = 1.0,
               prior_beta: float = 1.0, initial_g: int | None = None, seed: int = 0,
               event: str = "group"):
    super().__init__(candidates, tau=tau, delta=delta, forgetting=forgetting,
                     prior_alpha=prior_alpha, prior_beta=prior_beta, seed=seed,
                     min_candidates=2, event=event)
    self.eta = check_range("eta", eta, 0.0, math.inf, True, True)
    self.lambda_max = check_range("lambda_max", lambda_max, 0.0, math.inf, True, True)
    if initial_g is None:
      initial_g = self.candidates[0]
    if initial_g not in self.candidates:
      raise ValueError(f"initial_g={initial_g!r} is not one of candidates {self.candidates}")
    self._index = self.candidates.index(int(initial_g))
    self._first = True

  def _choose(self) -> int:
    # One draw per candidate every step, whatever the neighbourhood, so the
    # RNG stream (and thus determinism across resumes) does not depend on G.
    beta = self._rng.beta
    return self._lagrangian_choice([beta(a, b) for a, b in self.posterior_params()])

  def _lagrangian_choice(self, sampled_risk: Sequence[float]) -> int:
    """Index of the next G given a sampled risk per candidate (sorted order).

    The first step uses ``initial_g``; while lambda sits at its cap, one size
    down; otherwise the Lagrangian's argmax over the current size and its
    neighbours. Shared with the contextual controllers, which sample the risk
    differently.
    """
    if self._first:          # the first step uses initial_g as configured
      self._first = False
      return self._index
    lo = max(self._index - 1, 0)
    if self._back_off_at_cap and self._lambda >= self.lambda_max:
      # Backing off at the cap (module docstring, deviation 2): the constraint is
      # violated at the highest price of risk the dual may set; step down one size.
      return lo
    hi = min(self._index + 2, len(self.candidates))
    # Lagrangian u(G) - lambda * p~(G) over the local neighbourhood; ties go
    # to the smaller G (the safer choice).
    scores = [self._utility[k] - self._lambda * sampled_risk[k] for k in range(lo, hi)]
    return lo + scores.index(max(scores))

  def _update_dual(self, rate: float) -> None:
    updated = self._lambda + self.eta * (rate - self.params.delta)
    self._lambda = float(min(max(updated, 0.0), self.lambda_max))

  def state_dict(self) -> dict[str, Any]:
    state = super().state_dict()
    state["first"] = self._first
    return state

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    super().load_state_dict(state)
    self._first = bool(state["first"])


class StaticController(_GroupSizeController):
  """Fixed group size with the SAGC interface and metrics (baseline arms).

  It still tracks the Beta risk posterior of its G and the straggler rate,
  so static and SAGC runs produce the same metric columns (lambda stays 0).
  """

  kind = "static"

  def __init__(self, g: int = 8, tau: float = 2.0, delta: float = 0.25, *,
               candidates: Sequence[int] | None = None, forgetting: float = 0.99,
               prior_alpha: float = 1.0, prior_beta: float = 1.0, seed: int = 0,
               event: str = "group"):
    if candidates is None:
      candidates = (g,)
    super().__init__(candidates, tau=tau, delta=delta, forgetting=forgetting,
                     prior_alpha=prior_alpha, prior_beta=prior_beta, seed=seed,
                     min_candidates=1, event=event)
    if g not in self.candidates:
      raise ValueError(f"static g={g!r} is not one of candidates {self.candidates}")
    self._index = self.candidates.index(int(g))

  def _choose(self) -> int:
    return self._index
