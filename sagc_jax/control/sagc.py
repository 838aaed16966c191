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
from typing import Any, Mapping, Sequence

from sagc_jax.control.risk import GroupSizeController, RiskSettings, check_range, settings_of

__all__ = ["SAGCController", "SAGCSettings", "StaticController", "StaticSettings"]


@dataclasses.dataclass(frozen=True)
class SAGCSettings(RiskSettings):
  """SAGC's settings and their defaults (``SAGCController``'s arguments)."""

  eta: float = 1.0
  lambda_max: float = 50.0
  initial_g: int | None = None
  initial_lambda: float = 0.0


@dataclasses.dataclass(frozen=True)
class StaticSettings(RiskSettings):
  """A static G's settings: the size, and the risk model it reports."""

  static_g: int = 8

  def group_sizes(self) -> tuple[int, ...]:
    return (self.static_g,)


class SAGCController(GroupSizeController):
  """Straggler-Aware Group Control (see the module docstring for the algorithm).

  Args (every one but the first three optional; the defaults are ``SAGCSettings``'s,
  stated there once):
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
  Settings = SAGCSettings

  def __init__(self, candidates: Sequence[int], tau: float, delta: float, **settings: Any):
    s = settings_of(self.Settings, self.kind, candidates=candidates, tau=tau, delta=delta,
                    **settings)
    super().__init__(s, min_candidates=2)
    self.eta = check_range("eta", s.eta)
    self.lambda_max = check_range("lambda_max", s.lambda_max)
    initial_g = self.candidates[0] if s.initial_g is None else s.initial_g
    if initial_g not in self.candidates:
      raise ValueError(f"initial_g={initial_g!r} is not one of candidates {self.candidates}")
    self._index = self.candidates.index(int(initial_g))
    # A warm start: the dual's equilibrium from calibrate's replay (its recommendation),
    # so the first steps price risk as the run's later ones will instead of climbing to
    # the largest G while lambda grows from 0 (the paper's start, the default).
    self._lambda = check_range("initial_lambda", s.initial_lambda, 0.0, self.lambda_max,
                               low_closed=True, high_closed=True)
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


class StaticController(GroupSizeController):
  """Fixed group size with the SAGC interface and metrics (baseline arms).

  It still tracks the Beta risk posterior of its G and the straggler rate,
  so static and SAGC runs produce the same metric columns (lambda stays 0). The
  settings beyond ``g`` and ``candidates`` are SAGC's.
  """

  kind = "static"
  Settings = StaticSettings

  def __init__(self, g: int, tau: float = RiskSettings.tau, delta: float = RiskSettings.delta,
               *, candidates: Sequence[int] | None = None, **settings: Any):
    s = settings_of(self.Settings, self.kind, candidates=(g,) if candidates is None
                    else candidates, tau=tau, delta=delta, static_g=g, **settings)
    super().__init__(s, min_candidates=1)
    if g not in self.candidates:
      raise ValueError(f"static g={g!r} is not one of candidates {self.candidates}")
    self._index = self.candidates.index(int(g))

  @classmethod
  def from_settings(cls, settings: Any, *, prompts_for: Any = None) -> "StaticController":
    values = dataclasses.asdict(settings)
    return cls(values.pop("static_g"), **values)
