"""The signal_rate kind (control.signal_rate), the schedule kind, SAGC's warm start and
the replay's oracle arm, against hand computations and independent references (scipy's
Beta function, numpy's least squares)."""

import json

import numpy as np
import pytest
from scipy import special

from sagc_jax.config import controller_settings
from sagc_jax.control.context import BatchContext
from sagc_jax.control.controller import controller_from_config
from sagc_jax.control.protocol import StepGroups, StepTime
from sagc_jax.control.pass_rates import PassRates, dapo_step, expected_informative
from sagc_jax.control.step_cost import CostRegression
from sagc_jax.replay.oracle import OracleArm

PROMPTS = 8


def build(**changes):
  return controller_from_config(controller_settings(dict(kind="signal_rate", **changes)),
                                prompts_for=lambda g: PROMPTS)


def play(ctrl, steps, pass_rate, seconds, rng, new_prompts=True):
  """``steps`` steps: prompts drawn fresh each step, each group's pass rate drawn at
  ``pass_rate``, the step's seconds ``seconds(g)`` (rollout 70%, learner 30%); the Gs."""
  chosen = []
  for step in range(steps):
    ids = (rng.integers(0, 10**6, PROMPTS) if new_prompts
           else np.arange(PROMPTS) + 100 * (step % 2))
    g = ctrl.plan(lambda: BatchContext(ids, np.full(PROMPTS, 10))).group_size
    chosen.append(g)
    rates = rng.binomial(g, pass_rate, PROMPTS) / g
    t = seconds(g)
    ctrl.observe_step(StepGroups(np.full(PROMPTS, 50.0), np.full(PROMPTS, 30.0),
                                 prompt_ids=ids, pass_rates=rates,
                                 group_sizes=np.full(PROMPTS, g),
                                 time=StepTime(0.7 * t, 0.3 * t, t)))
  return chosen


@pytest.mark.parametrize("pass_rate, seconds, expected", [
    (0.02, lambda g: 0.2, 16),               # rare successes, a flat cost: the largest G
    (0.5, lambda g: 0.01 * g, 4),            # even odds, cost proportional to rows
])
def test_choice_follows_signal_per_second(pass_rate, seconds, expected):
  rng = np.random.default_rng(0)
  chosen = play(build(choice="mean"), 120, pass_rate, seconds, rng)
  last = chosen[-40:]
  assert last.count(expected) >= 38, (expected, last)


def test_expected_informative_matches_beta_functions_on_a_three_prompt_step():
  # Three prompts with posteriors Beta(1, 1), Beta(2, 5), Beta(0.5, 3): E[p^G] = B(a + G, b)
  # / B(a, b) (scipy), summed over the step.
  a, b = np.array([1.0, 2.0, 0.5]), np.array([1.0, 5.0, 3.0])
  sizes = (4, 8, 16)
  got = expected_informative(a, b, sizes).sum(axis=0)
  for col, g in enumerate(sizes):
    by_hand = sum(1 - np.exp(special.betaln(ai + g, bi) - special.betaln(ai, bi))
                  - np.exp(special.betaln(ai, bi + g) - special.betaln(ai, bi))
                  for ai, bi in zip(a, b))
    assert got[col] == pytest.approx(by_hand, rel=1e-12)
  # Beta(1, 1) at G = 4: 1 - 2 / 5 by the uniform integral of p^4 + (1 - p)^4.
  assert expected_informative(a[:1], b[:1], (4,))[0, 0] == pytest.approx(0.6)


def test_pass_rate_posterior_closed_form():
  rates = PassRates(forgetting=0.5, pool_forgetting=1.0, strength=(0.2, 100.0))
  assert rates.prior() == (1.0, 1.0)                       # nothing seen: Beta(1, 1)
  observed = np.array([0.0, 0.25, 0.5, 1.0, 0.75, 0.25])
  sizes = np.full(6, 4)
  rates.update(np.array([3, 3, 7, 8, 9, 10]), observed, sizes)
  # Method of moments: mu = mean r, Var(p) = Var(r) - mean r (1 - r) / (G - 1).
  mu = observed.mean()
  spread = observed.var() - np.mean(observed * (1 - observed) / 3)
  m = mu * (1 - mu) / spread - 1
  assert rates.prior() == pytest.approx((m * mu, m * (1 - mu)))
  # Prompt 3 seen twice in the step: its evidence 0 then 0.5 x 0 + 1 correct of 4 trials
  # each (np.add.at adds both groups after one discount); prompt 5 never: the pool.
  a, b = rates.posterior(np.array([3, 5]), 2)
  assert (a[0], b[0]) == pytest.approx((m * mu + 1.0, m * (1 - mu) + 7.0))
  assert (a[1], b[1]) == pytest.approx((m * mu, m * (1 - mu)))
  rates.update(np.array([3]), np.array([1.0]), np.array([4]))   # discounted by 0.5 first
  a, b = rates.posterior(np.array([3]), 1)
  a0, b0 = rates.prior()
  assert (a[0], b[0]) == pytest.approx((a0 + 0.5 * 1 + 4, b0 + 0.5 * 7))


def test_cost_model_recovers_known_coefficients():
  rng = np.random.default_rng(1)
  truth = np.array([0.002, 3e-5])
  model = CostRegression(forgetting=1.0)
  x = np.stack([rng.uniform(20, 80, 200), rng.uniform(1e3, 2e4, 200)], axis=1)
  y = x @ truth + rng.normal(0, 1e-3, 200)
  for xi, yi in zip(x, y):
    model.update(xi, yi)
  reference = np.linalg.lstsq(x, y, rcond=None)[0]
  # A tenth of a prior step against 200 observed: within 1% of least squares.
  assert model.coefficients() == pytest.approx(reference, rel=1e-2)
  assert model.coefficients() == pytest.approx(truth, rel=0.05)


def test_a_size_is_priced_without_being_tried():
  # Only G = 4 steps seen, with calibrate's fit as the seed: G = 16's seconds follow from
  # the seed's per-row cost, not from a G = 16 step.
  ctrl = build(choice="mean", cost_seed=(0.0, 1e-4, 0.0, 0.0), cost_seed_steps=1e6,
               candidates=(4, 16))
  rng = np.random.default_rng(2)
  play(ctrl, 5, 0.5, lambda g: 1e-4 * PROMPTS * g * 30, rng)   # exactly the seed's cost
  assert ctrl.predicted_seconds() == pytest.approx(1e-4 * PROMPTS * np.array([4, 16]) * 30,
                                                   rel=1e-3)


def test_exact_resume():
  rng = np.random.default_rng(3)
  ctrl = build()
  play(ctrl, 15, 0.1, lambda g: 0.05 + 0.01 * g, rng, new_prompts=False)
  resumed = build()
  resumed.load_state_dict(json.loads(json.dumps(ctrl.state_dict())))
  rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
  seconds = lambda g: 0.05 + 0.01 * g
  assert (play(ctrl, 25, 0.1, seconds, rng_a, new_prompts=False)
          == play(resumed, 25, 0.1, seconds, rng_b, new_prompts=False))


def test_bad_settings_are_named():
  for changes, name in ((dict(choice="ucb"), "choice"), (dict(pass_forgetting=1.5),
                        "pass_forgetting"), (dict(cost_seed=(1.0, 2.0)), "cost_seed")):
    with pytest.raises(ValueError, match=name):
      build(**changes)


def test_schedule_follows_its_list_then_its_last_size():
  ctrl = controller_from_config(controller_settings(dict(kind="schedule",
                                                         schedule=(4, 16, 8))))
  sizes = []
  for _ in range(5):
    sizes.append(ctrl.propose())
    ctrl.observe([3.0], [2.0])
  assert sizes == [4, 16, 8, 8, 8]
  with pytest.raises(ValueError, match="schedule"):
    controller_from_config(controller_settings(dict(kind="schedule", schedule=(4, 5))))


def test_sagc_warm_start_prices_risk_from_the_first_step():
  warm = controller_from_config(controller_settings(dict(initial_lambda=3.0)))
  assert warm.lam == 3.0
  with pytest.raises(ValueError, match="initial_lambda"):
    controller_from_config(controller_settings(dict(initial_lambda=-1.0)))


def test_dapo_round_process_against_a_simulation():
  # Target 3 groups, q = 0.4, at most 3 rounds: kept groups and rounds by Monte Carlo.
  rng = np.random.default_rng(5)
  kept, rounds = [], []
  for _ in range(200_000):
    total, r = 0, 0
    while r < 3 and total < 3:
      total += rng.binomial(3, 0.4)
      r += 1
    kept.append(min(total, 3))
    rounds.append(r)
  want_kept, want_rounds = dapo_step(np.array([0.4]), [3], 3)
  assert want_kept[0] == pytest.approx(np.mean(kept), abs=0.01)
  assert want_rounds[0] == pytest.approx(np.mean(rounds), abs=0.01)


def test_oracle_takes_the_most_informative_groups_per_priced_second_of_the_run():
  # Two prompts at p = 0.05 and 0.5, all lengths 10; cost: 1 s a step plus 0.01 s a row.
  block = {"pass_rate": np.array([0.05, 0.5]), "lengths": np.full((2, 16), 10),
           "prompt_tokens": np.array([5, 5])}
  def cost(rounds, trained):
    rollout = 0.01 * sum(r.size for r, _ in rounds)
    return {"rollout_s": rollout, "learner_s": 1.0, "total_s": 1.0 + rollout}
  oracle = OracleArm((4, 8, 16), lambda g: 2, cost)
  oracle.see(block)
  value = [sum(1 - p ** g - (1 - p) ** g for p in (0.05, 0.5)) for g in (4, 8, 16)]
  seconds = [1.0 + 0.02 * g for g in (4, 8, 16)]
  assert oracle.options()[0] == pytest.approx(value)
  assert oracle.options()[1] == pytest.approx(seconds)
  first = int(np.argmax(np.divide(value, seconds)))       # the first step: the best ratio
  assert oracle.plan().group_size == (4, 8, 16)[first]
  oracle.observe_step(None)
  # Then value - rate x seconds at the run's rate so far: a run at 10 groups per second
  # (a hand-set history) takes the size that loses least at that rate.
  oracle._gained, oracle._spent = 10.0, 1.0
  oracle.see(block)
  assert oracle.plan().group_size == (4, 8, 16)[int(np.argmax(
      np.subtract(value, 10.0 * np.asarray(seconds))))]


def test_named_arms_carry_their_settings_and_bad_ones_are_named():
  import runpy

  from sagc_jax.experiments.arms import arm_configs

  config = runpy.run_path("configs/compare_signal_rate_cpu.py")["get_config"]()
  arms = arm_configs(config)
  assert arms["grpo_sagc_warm"].controller.kind == "sagc"
  assert arms["grpo_sagc_warm"].controller.initial_lambda > 0
  assert arms["grpo_sagc"].controller.initial_lambda == 0
  for bad, message in (({"static4": {"kind": "sagc"}}, "arm name"),
                       ({"warm": {"initial_lambda": 1.0}}, "with its kind"),
                       ({"warm": {"kind": "magic"}}, "named_arms.warm.kind")):
    with config.unlocked():
      config.compare.named_arms = bad
    with pytest.raises(ValueError, match=message):
      arm_configs(config)


def _per_prompt(**changes):
  return controller_from_config(controller_settings(dict(kind="signal_rate_per_prompt",
                                                         choice="mean", pass_forgetting=1.0,
                                                         **changes)),
                                prompts_for=lambda g: 4)


def _observe_plan(ctrl, plan, ids, rates):
  sampled = plan.sizes > 0
  ctrl.observe_step(StepGroups(np.full(sampled.sum(), 40.0), np.full(sampled.sum(), 30.0),
                               prompt_ids=ids[:plan.sizes.size][sampled],
                               pass_rates=rates[:plan.sizes.size][sampled],
                               group_sizes=plan.sizes[sampled],
                               time=StepTime(0.1, 0.05, 0.15)))


def _history(ctrl, solved):
  """200 steps of prompts ``solved`` solved by every response (800 correct of 800: a
  group of 16 would vary about 4% of the time), beside prompts 100-103 solved half the
  time (the pooled prior then spreads over both)."""
  both = np.concatenate([solved, np.arange(100, 104)])
  for _ in range(200):
    ctrl.observe_step(StepGroups(np.full(8, 40.0), np.full(8, 30.0), prompt_ids=both,
                                 pass_rates=np.repeat([1.0, 0.5], 4),
                                 group_sizes=np.full(8, 4), time=StepTime(0.1, 0.05, 0.15)))


def test_per_prompt_skips_prompts_always_solved_and_retests_some():
  # Prompts 0-3 always solved (_history); 4-7 never seen: they get the pooled prior.
  solved, fresh = np.arange(4), np.arange(4, 8)
  for retest, skipped in ((0.0, [0, 0, 0, 0]), (1.0, None)):
    ctrl = _per_prompt(retest_prob=retest)
    _history(ctrl, solved)
    ids = np.concatenate([solved, fresh])
    plan = ctrl.plan(lambda: BatchContext(ids, np.full(8, 10)))
    if skipped is None:                    # every skip re-tested: the first 4 prompts
      assert plan.sizes.size == 4 and (plan.sizes > 0).all()
    else:                                  # the solved ones skipped, the fresh ones sampled
      assert plan.sizes[:4].tolist() == skipped and (plan.sizes[4:] > 0).all()
      assert sum(plan.sizes) <= 4 * plan.group_size
    _observe_plan(ctrl, plan, ids, np.concatenate([np.ones(4), np.full(4, 0.5)]))
  # With re-test probability 0.3, about 30% of the solved prompts are sampled again.
  ctrl = _per_prompt(retest_prob=0.3)
  _history(ctrl, solved)
  retested = []
  for _ in range(200):
    plan = ctrl.plan(lambda: BatchContext(np.concatenate([solved, fresh]), np.full(8, 10)))
    retested.append(np.mean(plan.sizes[:4] > 0))
    _observe_plan(ctrl, plan, np.concatenate([solved, fresh]),
                  np.concatenate([np.ones(4), np.full(4, 0.5)]))
  assert 0.2 < np.mean(retested) < 0.4


def test_the_straggler_constraint_keeps_sizes_whose_groups_straggle_out():
  # Rare successes and a flat cost pick G = 16 (test_choice_follows_signal_per_second);
  # with every group straggling (max / median 5 > tau) and the constraint on, the sizes
  # above the smallest are admitted only while their risk is unknown.
  ctrl = build(choice="mean", straggler_constraint=True, delta=0.25)
  rng = np.random.default_rng(6)
  chosen = []
  for _ in range(150):
    ids = rng.integers(0, 10**6, PROMPTS)
    g = ctrl.plan(lambda: BatchContext(ids, np.full(PROMPTS, 10))).group_size
    chosen.append(g)
    ctrl.observe_step(StepGroups(np.full(PROMPTS, 50.0), np.full(PROMPTS, 10.0),
                                 prompt_ids=ids, pass_rates=rng.binomial(g, 0.02, PROMPTS) / g,
                                 group_sizes=np.full(PROMPTS, g),
                                 time=StepTime(0.14, 0.06, 0.2)))
  assert chosen[-50:].count(4) >= 48, chosen[-50:]
