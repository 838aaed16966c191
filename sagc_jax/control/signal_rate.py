"""Group size by learning signal per measured second (``controller.kind="signal_rate"``;
docs/controllers.md).

Why. SAGC maximises ``log2 G`` under a straggler cap. It sees neither what a step at each G
costs on the hardware at hand nor how often a group's rewards vary, and per step the
sizes learn at nearly the same rate while a G = 16 step costs 2-3x a G = 4 step
(docs/results.md). GRPO's advantages are nonzero only in a group whose rewards vary (a
prompt always or never solved gives no gradient at any G; DAPO keeps only those groups,
Yu et al. 2025), and the expected number of such groups among a step's P(G) prompts of
pass rates ``p_i`` is

    I(G) = sum_{i < P(G)} 1 - p_i^G - (1 - p_i)^G,

the one learning measure docs/results.md validates against measured learning on every
workload-mode that tested it (``informative_groups``). Every step this kind picks the G
of the candidates maximising ``I(G) / T(G)``, ``T(G)`` the step's seconds predicted by a
cost model fitted to the seconds every step reports (``StepGroups.time``). It allocates by
estimated pass rate as GRESO (Zheng et al. 2025), DUET and Knapsack RL (Li et al. 2025)
do, and prices each size against the measured step time, which none of them does.

Pass rates: a Beta posterior per prompt (prompt ids are stable across epochs), the pooled
prior ``Beta(m mu, m (1 - mu))`` plus the prompt's own correct / incorrect responses,
discounted by ``pass_forgetting`` each time the prompt is observed. The pooled prior is
fitted by the beta-binomial method of moments (empirical Bayes) to every observed group's
pass rate ``r`` at size ``G``, discounted by ``pool_forgetting`` per step::

    mu = E[r],   Var(p) = Var(r) - E[r (1 - r) / (G - 1)],   m = mu (1 - mu) / Var(p) - 1

(``E[r (1 - r)] = p (1 - p) (1 - 1/G)``, so the second term removes the binomial noise;
``m`` is clipped to [``pool_strength_min``, ``pool_strength_max``]). A prompt not seen
gets the pooled prior, ``Beta(1, 1)`` before any step. ``I`` is taken in expectation
under the posteriors, in closed form: ``E[p^G] = prod_{j < G} (a + j) / (a + b + j)``.
The spread of the pass rates over prompts is what makes a larger G pay: at ``p = 0.02`` a
group of 16 varies 3.5x as often as a group of 4, at ``p = 0.5`` 1.07x.

Step time, in the form calibrate fits to a trace (``replay.costs.DecodeCost``), rollout
and learner apart, each by Bayesian linear regression with forgetting ``cost_forgetting``
per step::

    rollout_s = c_step * rounds * L_max + c_slot * rows * L_med
    learner_s = c_update + c_token * P(G) * G * L_med        (the learner's row bucket)

``L_max`` is the step's longest group, ``L_med`` its mean group median, ``rows`` the rows
it sampled and ``rounds`` its sampling rounds (DAPO's extra rounds; 1 for GRPO); the
rest of the step (``total - rollout - learner``) is a discounted mean. A size is priced
from its rows and the recent lengths, so it need not be tried to be priced (the longest
response is taken as the recent steps', at every G: the tail's growth with G is the
straggler model's, ``straggler_constraint``). ``cost_seed = (step_s, slot_s,
learner_step_s, learner_token_s)``, calibrate's fit of its trace or, with ``--cost
aot:REPORT``, a pod preset's compiled cost linearised at the trace's lengths (it prints
the override), starts the coefficients there, worth ``cost_seed_steps`` steps.
For DAPO (once a step took more than one round) the value is the groups a step keeps
and the rollout is priced per round: both follow from the first round's mean
informative probability by the round process (``dapo_step``, capped at the most rounds a
step took).

Choice: ``"thompson"`` draws the cost coefficients from their Gaussian posterior (the
epistemic uncertainty: a size whose price is unknown is tried while the draws favour
it), ``"mean"`` takes the posterior means. The pass-rate part is the posterior
expectation either way: its spread across new prompts is not an uncertainty to explore.
With ``straggler_constraint`` a size is a candidate only when its SAGC risk posterior's
draw is at most ``delta`` (the smallest size always is); off by default. Every step's
observed seconds are in the diagnostics (``observed_*_s``), and the state holds every
posterior, so the same observations give the same decisions after a resume.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from sagc_jax.control.pass_rates import PassRates, dapo_step
from sagc_jax.control.protocol import ContextSource, GroupPlan, Needs, StepGroups
from sagc_jax.control.risk import GroupSizeController, RiskSettings, check_range, settings_of
from sagc_jax.control.step_cost import CostRegression, seed_coefficients
from sagc_jax.control.stragglers import straggler_flags, validated_lengths

__all__ = ["SignalRateController", "SignalRateSettings"]

CHOICES = ("thompson", "mean")


@dataclasses.dataclass(frozen=True)
class SignalRateSettings(RiskSettings):
  """The kind's settings (module docstring); the risk model's (``RiskSettings``) serve
  only ``straggler_constraint``."""

  pass_forgetting: float = 0.9
  pool_forgetting: float = 0.98
  pool_strength_min: float = 0.2
  pool_strength_max: float = 100.0
  cost_forgetting: float = 0.98
  cost_seed: tuple = ()
  cost_seed_steps: float = 4.0
  choice: str = CHOICES[0]
  straggler_constraint: bool = False


class SignalRateController(GroupSizeController):
  """G maximising expected informative groups per predicted second (module docstring)."""

  kind = "signal_rate"
  Settings = SignalRateSettings
  needs = Needs(context=True)

  def __init__(self, candidates: Sequence[int], tau: float = RiskSettings.tau,
               delta: float = RiskSettings.delta, *,
               prompts_for: Callable[[int], int] | None = None, **settings: Any):
    s = settings_of(self.Settings, self.kind, candidates=candidates, tau=tau, delta=delta,
                    **settings)
    super().__init__(s, min_candidates=1)       # one size: a static G (per prompt: skipping)
    for name in ("pass_forgetting", "pool_forgetting", "cost_forgetting"):
      check_range(name, getattr(s, name), 0.0, 1.0, high_closed=True)
    low = check_range("pool_strength_min", s.pool_strength_min)
    high = check_range("pool_strength_max", s.pool_strength_max, low)
    if s.choice not in CHOICES:
      raise ValueError(f"choice={s.choice!r} is not one of {CHOICES}")
    if not isinstance(s.straggler_constraint, (bool, np.bool_)):
      raise ValueError(f"straggler_constraint={s.straggler_constraint!r} must be a bool")
    self.settings = s
    self._prompts = None if prompts_for is None else [int(prompts_for(g))
                                                      for g in self.candidates]
    self.pass_rates = PassRates(s.pass_forgetting, s.pool_forgetting, (low, high))
    seeds, weight = ((0.0, 0.0), (0.0, 0.0)), 0.1
    if s.cost_seed:
      seeds = seed_coefficients(s.cost_seed)
      weight = check_range("cost_seed_steps", s.cost_seed_steps)
    self.rollout_cost = CostRegression(s.cost_forgetting, seeds[0], weight)
    self.learner_cost = CostRegression(s.cost_forgetting, seeds[1], weight)
    # Discounted means: the rest of a step's seconds, its longest and median lengths.
    self._means = {"other_s": [0.0, 0.0], "max_len": [0.0, 0.0], "median_len": [0.0, 0.0]}
    self._max_rounds = 1               # the most sampling rounds a step took (DAPO's cap)
    self._sizes = np.asarray(self.candidates)
    self._context_ids: np.ndarray | None = None      # the planned step's prompts
    self._priced: set[int] = set()                   # sizes whose first step was seen
    self._last: dict[str, np.ndarray] = {}

  @classmethod
  def from_settings(cls, settings: Any, *, prompts_for: Any = None) -> "SignalRateController":
    return cls(**dataclasses.asdict(settings), prompts_for=prompts_for)

  def _discount(self, name: str, value: float, gamma: float) -> None:
    total, weight = self._means[name]
    self._means[name] = [gamma * total + value, gamma * weight + 1.0]

  def _mean(self, name: str, default: float) -> float:
    total, weight = self._means[name]
    return total / weight if weight > 0 else default

  def prompts(self) -> np.ndarray:
    """P(G) per candidate: the run's rule, else the planned context's size (1 without
    one)."""
    if self._prompts is not None:
      return np.asarray(self._prompts)
    size = 1 if self._context_ids is None else self._context_ids.size
    return np.full(len(self.candidates), size)

  def predicted_seconds(self, draw: bool = False, rounds: Any = 1.0) -> np.ndarray:
    """The cost model's step seconds per candidate (module docstring): ``rounds``
    sampling rounds (per candidate, or one number), the learner on the row bucket and
    the rest of the step."""
    rollout = self.rollout_cost.draw(self._rng) if draw else self.rollout_cost.coefficients()
    learner = self.learner_cost.draw(self._rng) if draw else self.learner_cost.coefficients()
    longest, median = self._mean("max_len", 1.0), self._mean("median_len", 1.0)
    counts = self.prompts()
    fixed, per_row = rollout[0] * longest, rollout[1] * median
    update, per_token = learner[0] + self._mean("other_s", 0.0), learner[1] * median
    rounds = [rounds] * counts.size if np.ndim(rounds) == 0 else list(rounds)
    return np.array([max(r * (fixed + per_row * rows) + update + per_token * rows, 1e-9)
                     for r, rows in zip(rounds, (counts * self._sizes).tolist())])

  def expected_signal(self) -> np.ndarray:
    """``E[I(G)]`` per candidate over the step's first P(G) prompts (module docstring)."""
    ids = self._context_ids
    counts = self.prompts()
    most = int(counts.max())
    per_prompt = self.pass_rates.expected_informative(None if ids is None else ids[:most],
                                                      most, self.candidates)
    if counts.min() == most:                 # hold_prompts: every size the same prompts
      return per_prompt.sum(axis=0)
    running = np.cumsum(per_prompt, axis=0)
    return running[counts - 1, np.arange(len(self.candidates))]

  def plan(self, context: ContextSource | None = None) -> GroupPlan:
    if not self._pending:
      self._context_ids = None if context is None else np.asarray(context().prompt_ids,
                                                                  np.int64)
    return GroupPlan(self.propose())

  def _choose(self) -> int:
    if self.rollout_cost.n == 0 and not self.settings.cost_seed:
      return 0            # nothing priced yet: the smallest, cheapest size first
    thompson = self.settings.choice == "thompson"
    signal = self.expected_signal()
    if self._max_rounds > 1:           # DAPO (a step took extra rounds): kept groups
      counts = self.prompts()
      signal, rounds = dapo_step(signal / counts, counts, self._max_rounds)
    else:
      rounds = 1.0
    seconds = self.predicted_seconds(draw=thompson, rounds=rounds)
    rate = signal / seconds
    if self.settings.straggler_constraint:
      risk = np.array([self._rng.beta(a, b) for a, b in self.posterior_params()])
      allowed = risk <= self.params.delta
      allowed[0] = True
      rate = np.where(allowed, rate, -np.inf)
    self._last = {"signal": signal, "seconds": seconds}
    return int(np.argmax(rate))                  # ties: the smaller size

  def observe_step(self, groups: StepGroups) -> dict[str, float]:
    """Updates the pass-rate posteriors (``pass_rates``, ``prompt_ids``, ``group_sizes``),
    the cost model (``time``) and the straggler risk; returns the diagnostics:
    ``lambda`` and ``p_mean/G<g>`` (the risk model's), the predicted signal and seconds
    of the chosen G and the step's observed seconds."""
    gmax, gmed = validated_lengths(groups.group_max, groups.group_median)
    n = gmax.size
    sizes = (np.full(n, self.g) if groups.group_sizes is None
             else np.asarray(groups.group_sizes, np.int64))
    if groups.pass_rates is not None:
      ids = None if groups.prompt_ids is None else np.asarray(groups.prompt_ids, np.int64)
      self.pass_rates.update(ids, np.asarray(groups.pass_rates, np.float64), sizes)
    rows = float(sizes.sum())
    longest = float(gmax.max()) if n else 0.0
    median = float((gmed * sizes).sum() / rows) if rows else 0.0
    per_round = self.prompts()[self._index]
    rounds = max(math.ceil(n / per_round), 1)
    bucket = float(per_round * self.g)
    gamma = self.settings.cost_forgetting
    out = {}
    # A size's first step compiles its programs (a new row bucket): its seconds are not
    # the size's price, so the cost model skips them.
    first_of_size = self.g not in self._priced
    self._priced.add(self.g)
    if groups.time is not None and not first_of_size:
      t = groups.time
      self.rollout_cost.update((rounds * longest, rows * median), t.rollout_s)
      self.learner_cost.update((1.0, bucket * median), t.learner_s)
      self._discount("other_s", max(t.total_s - t.rollout_s - t.learner_s, 0.0), gamma)
      out = {"observed_rollout_s": t.rollout_s, "observed_learner_s": t.learner_s,
             "observed_total_s": t.total_s}
    self._max_rounds = max(self._max_rounds, rounds)
    for name, value in (("max_len", longest), ("median_len", median)):
      self._discount(name, value, gamma)
    if self._last:
      out.update(predicted_signal=float(self._last["signal"][self._index]),
                 predicted_s=float(self._last["seconds"][self._index]))
    diagnostics = self._record_step(straggler_flags(gmax, gmed, self.params.tau))
    return {**diagnostics, **out}

  def state_dict(self) -> dict[str, Any]:
    state = super().state_dict()
    state.update(pass_rates=self.pass_rates.state_dict(),
                 rollout_cost=self.rollout_cost.state_dict(),
                 learner_cost=self.learner_cost.state_dict(),
                 means={k: list(v) for k, v in self._means.items()},
                 priced=sorted(self._priced), max_rounds=self._max_rounds,
                 context_ids=None if self._context_ids is None else self._context_ids.tolist())
    return state

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    super().load_state_dict(state)
    self.pass_rates.load_state_dict(state["pass_rates"])
    self.rollout_cost.load_state_dict(state["rollout_cost"])
    self.learner_cost.load_state_dict(state["learner_cost"])
    self._means = {k: [float(x) for x in v] for k, v in state["means"].items()}
    self._priced = {int(g) for g in state["priced"]}
    self._max_rounds = int(state["max_rounds"])
    ids = state["context_ids"]
    self._context_ids = None if ids is None else np.asarray(ids, np.int64)
