"""Contextual controllers (prompt_aware, per_prompt): the batch features, the per-prompt
history, the contextual posterior and the per-prompt allocation against numpy
re-derivations and brute force; local moves, budgets, exact resume, validation."""

import itertools
import json
import math

import numpy as np
import pytest

from sagc_jax.control.context import (TAIL_SCORE_CAP, BatchContext, FeatureBuckets,
                                      PromptHistory, tail_scores)
from sagc_jax.control.controller import (PerPromptController, PromptAwareController,
                                         SAGCController, StaticController,
                                         controller_from_config)
from controllers import build, per_prompt, prompt_aware, sagc, static
from sagc_jax.config import controller_settings
from sagc_jax.control.per_prompt import allocate_group_sizes

CANDIDATES = (4, 8, 16)
HOLD_ROLLOUTS = {4: 16, 8: 8, 16: 4}          # P(G) = 64 rows / G


# ------------------------------------------------------------------ a small world
class World:
  """A pool of prompts with their own tail weights and pass rates; steps hand out
  ``per_step`` prompts in shuffled epochs. Response lengths: log-normal body,
  2-5x tails with the prompt's own probability."""

  def __init__(self, seed, pool=60, per_step=16, tail_lo=0.0, tail_hi=0.25, sigma=0.3):
    rng = np.random.default_rng([seed, 1])
    self.seed, self.pool, self.per_step, self.sigma = seed, pool, per_step, sigma
    self.tail = rng.uniform(tail_lo, tail_hi, pool)
    self.pass_rate = rng.uniform(0.0, 1.0, pool)
    self.tokens = rng.integers(20, 400, pool)

  def step(self, t):
    start = t * self.per_step
    pos = np.arange(start, start + self.per_step)
    ids = np.empty(self.per_step, np.int64)
    for epoch in np.unique(pos // self.pool):
      order = np.random.default_rng([self.seed, 2, int(epoch)]).permutation(self.pool)
      here = pos // self.pool == epoch
      ids[here] = order[pos[here] % self.pool]
    rng = np.random.default_rng([self.seed, 3, t])
    shape = (self.per_step, 16)
    lengths = 500 * np.exp(self.sigma * rng.standard_normal(shape))
    lengths *= np.where(rng.random(shape) < self.tail[ids, None], rng.uniform(2, 5, shape), 1)
    passed = rng.random(shape) < self.pass_rate[ids, None]
    return ids, np.maximum(np.rint(lengths), 1), passed


def run(ctrl, world, steps, start=0):
  """Drives a controller; returns per step (sizes, metrics)."""
  out = []
  for t in range(start, start + steps):
    ids, lengths, passed = world.step(t)
    context = BatchContext(ids, world.tokens[ids])
    if isinstance(ctrl, PerPromptController):
      sizes = ctrl.propose_groups(context)
    else:
      g = ctrl.propose(context) if isinstance(ctrl, PromptAwareController) else ctrl.propose()
      sizes = np.full(ctrl.prompts_for(g, len(context))
                      if isinstance(ctrl, PromptAwareController) else len(ids), g)
    k = sizes.size
    gmax = np.array([lengths[i, :s].max() for i, s in enumerate(sizes)])
    gmed = np.array([np.median(lengths[i, :s]) for i, s in enumerate(sizes)])
    rates = np.array([passed[i, :s].mean() for i, s in enumerate(sizes)])
    if isinstance(ctrl, PromptAwareController):
      metrics = ctrl.observe(gmax, gmed, prompt_ids=ids[:k], pass_rates=rates,
                             group_sizes=sizes)
    else:
      metrics = ctrl.observe(gmax, gmed)
    out.append((sizes, metrics))
  return out


# ------------------------------------------------------------- features, history
def test_batch_context_validates_and_converts():
  ctx = BatchContext([3, 1, 2], np.array([10, 20, 30], np.int32))
  assert ctx.prompt_ids.dtype == np.int64 and ctx.prompt_lengths.dtype == np.int64
  assert len(ctx) == 3
  for ids, lengths, match in [([1, 2], [10], "2 prompt_ids but 1"), ([], [], "non-empty"),
                              ([1.5], [3], "integers"), ([1], [-3], ">= 0"),
                              ([[1]], [[2]], "1-D")]:
    with pytest.raises(ValueError, match=match):
      BatchContext(ids, lengths)


def test_tail_scores_and_buckets_match_hand_computation():
  gmax = np.array([10., 40., 0., 5., 1e6])
  gmed = np.array([10., 10., 0., 0., 1.])
  np.testing.assert_allclose(tail_scores(gmax, gmed, 2.0),
                             [0.0, 2.0, 0.0, TAIL_SCORE_CAP, TAIL_SCORE_CAP])
  features = FeatureBuckets((0.5, 1.0), (1.0,))
  assert features.count == 8
  scores = np.array([np.nan, 0.2, 0.5, 0.99, 1.0, np.nan])
  lengths = np.array([50, 150, 99, 100, 300, 100])
  # tail class: unseen 0, [0, .5) 1, [.5, 1) 2, [1, inf) 3; length class: >= mean 100
  expected = [0 * 2 + 0, 1 * 2 + 1, 2 * 2 + 0, 2 * 2 + 1, 3 * 2 + 1, 0 * 2 + 1]
  np.testing.assert_array_equal(features.of(scores, lengths, 100.0), expected)
  for edges in [(1.0, 0.5), (0.5, 0.5), (-1.0,), ("a",)]:
    with pytest.raises(ValueError, match="tail_edges"):
      FeatureBuckets(edges, (1.0,))


def test_history_discounts_per_visit_and_evicts_the_least_recently_observed():
  h = PromptHistory(capacity=3, forgetting=0.5)
  h.update([7], [1.0], [4], [0.5], [100.0])
  h.update([7, 8], [3.0, 0.0], [8, 4], [1.0, 0.0], [100.0, math.nan])
  scores, weights = h.lookup(np.array([7, 8, 9]))
  # prompt 7: tail (0.5 * 1 + 3) / (0.5 + 1); pass hits 0.5 * 2 + 8, trials 0.5 * 4 + 8
  assert scores[0] == pytest.approx(3.5 / 1.5) and scores[1] == 0.0 and np.isnan(scores[2])
  a, b = 1 + 9.0, 1 + 10.0 - 9.0
  assert weights[0] == pytest.approx(4 * a * b / ((a + b) * (a + b + 1)))
  assert weights[1] == pytest.approx(4 * 1 * 5 / (6 * 7)) and weights[2] == pytest.approx(2 / 3)
  assert h.mean_length(fallback=1.0) == 100.0          # unknown lengths are not counted
  h.update([9, 10], [0.0, 0.0], [4, 4], None, [1.0, 1.0])   # 7 was observed least recently
  assert 7 not in h and all(p in h for p in (8, 9, 10)) and len(h) == 3
  h.update([8, 11], [0.0, 0.0], [4, 4], None, [1.0, 1.0])   # now 9 is the oldest
  assert 9 not in h and 8 in h
  twin = PromptHistory(3, 0.5)
  twin.load_state_dict(json.loads(json.dumps(h.state_dict())))
  assert twin.state_dict() == h.state_dict()
  with pytest.raises(ValueError, match="more than history_size=2"):
    PromptHistory(2, 0.5).load_state_dict(h.state_dict())


# ------------------------------------------------- re-derivations from the state
def cell_params(state, kappa):
  """Cell Beta parameters from a state_dict: prior kappa * m_G (SAGC's posterior mean)."""
  a0 = 1.0 + np.array(state["straggle_counts"])
  b0 = 1.0 + np.array(state["ok_counts"])
  m = (a0 / (a0 + b0))[:, None]
  return (kappa * m + np.array(state["cells"]["straggle"]),
          kappa * (1 - m) + np.array(state["cells"]["ok"]))


def features_from_state(state, ids, lengths, tail_edges=(0.8, 1.25), length_edges=(1.0,)):
  """Buckets and utility weights of ``ids`` from a state_dict's history, by hand."""
  records = {r[0]: r for r in state["history"]["records"]}
  h = state["history"]
  mean = h["length_sum"] / h["length_count"] if h["length_count"] else lengths.mean()
  buckets, weights = [], []
  for pid, length in zip(ids.tolist(), lengths.tolist()):
    rec = records.get(pid)
    tail = 0 if rec is None else 1 + sum(e <= rec[1] / rec[2] for e in tail_edges)
    buckets.append(tail * (len(length_edges) + 1) + sum(e * mean <= length for e in length_edges))
    a, b = (1.0, 1.0) if rec is None else (1 + rec[3], 1 + rec[4] - rec[3])
    weights.append(4 * a * b / ((a + b) * (a + b + 1)))
  return np.array(buckets), np.array(weights)


def twin_rng(state):
  rng = np.random.Generator(np.random.PCG64(0))
  r = state["rng"]
  rng.bit_generator.state = {"bit_generator": "PCG64",
                             "state": {"state": int(r["state"]), "inc": int(r["inc"])},
                             "has_uint32": r["has_uint32"], "uinteger": r["uinteger"]}
  return rng


def sagc_rule(state, risk, lambda_max=50.0):
  """SAGC's selection: first step, back-off at the cap, else local Lagrangian argmax."""
  index = CANDIDATES.index(state["g"])
  if state["first"]:
    return index
  if state["lambda"] >= lambda_max:
    return max(index - 1, 0)
  lo, hi = max(index - 1, 0), min(index + 2, len(CANDIDATES))
  scores = [math.log2(CANDIDATES[k]) - state["lambda"] * risk[k] for k in range(lo, hi)]
  return lo + int(np.argmax(scores))


@pytest.mark.parametrize("event", ["group", "step"])
def test_prompt_aware_decisions_and_cells_match_a_numpy_rederivation(event):
  """Every decision re-derived from the JSON state alone (Beta draw per cell with a twin
  RNG, per-prompt buckets from the history, P(G) prompts, SAGC's local rule), and the
  cells' update re-derived from the observed groups."""
  kappa, gamma = 3.0, 0.9
  ctrl = prompt_aware(CANDIDATES, delta=0.2 if event == "group" else 0.6,
                               prompts_for=HOLD_ROLLOUTS, cell_prior_strength=kappa,
                               forgetting=gamma, seed=4, event=event, eta=2.0)
  world = World(seed=1, per_step=16)
  s_cells = np.zeros((3, 8))
  f_cells = np.zeros((3, 8))
  moves = set()
  for t in range(250):
    ids, lengths, _ = world.step(t)
    state = json.loads(json.dumps(ctrl.state_dict()))
    buckets, _ = features_from_state(state, ids, world.tokens[ids])
    a, b = cell_params(state, kappa)
    draws = twin_rng(state).beta(a, b)
    risk = []
    for k, g in enumerate(CANDIDATES):
      p = draws[k, buckets[:HOLD_ROLLOUTS[g]]]
      risk.append(p.mean() if event == "group" else 1 - np.prod(1 - p))
    expected = sagc_rule(state, risk)
    moves.add(expected - CANDIDATES.index(state["g"]))
    sizes, _ = run(ctrl, world, 1, start=t)[0]
    assert sizes[0] == CANDIDATES[expected], t
    k, n = expected, sizes.size
    flags = np.array([lengths[i, :sizes[0]].max() > 2 * np.median(lengths[i, :sizes[0]])
                      for i in range(n)])
    for cell in set(buckets[:n].tolist()):                  # per-cell forgetting
      s_cells[k, cell] *= gamma
      f_cells[k, cell] *= gamma
    np.add.at(s_cells[k], buckets[:n], flags)
    np.add.at(f_cells[k], buckets[:n], ~flags)
    np.testing.assert_allclose(np.array(ctrl.state_dict()["cells"]["straggle"]), s_cells,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.array(ctrl.state_dict()["cells"]["ok"]), f_cells,
                               rtol=1e-12, atol=1e-12)
  a, b = cell_params(ctrl.state_dict(), kappa)
  np.testing.assert_allclose(ctrl.cell_posterior_mean(), a / (a + b), rtol=1e-12)
  assert moves <= {-1, 0, 1} and {-1, 1} <= moves         # local moves, both ways


def test_prompt_aware_without_context_is_sagc():
  world = World(seed=2)
  plain = sagc(CANDIDATES, seed=3, event="step")
  aware = prompt_aware(CANDIDATES, seed=3, event="step")
  for t in range(300):
    _, lengths, _ = world.step(t)
    g1, g2 = plain.propose(), aware.propose()
    assert g1 == g2
    block = lengths[:, :g1]
    prediction = plain.posterior_mean()[CANDIDATES.index(g1)]    # before the update
    m1 = plain.observe(block.max(1), np.median(block, 1))
    m2 = aware.observe(block.max(1), np.median(block, 1))
    assert {k: m2[k] for k in m1} == m1
    assert m2["predicted_straggler_rate"] == prediction


def test_prompt_aware_moves_locally_and_prices_risky_batches():
  """Batches alternate between 16 safe prompts and 16 risky ones. Through the history,
  prompt_aware learns which is which and uses a larger G on the safe batches (SAGC,
  blind to the prompts, cannot), with more log2 G at the same straggler rate."""
  tail = np.r_[np.zeros(32), np.full(32, 0.1)]   # groups straggle at G = 4 / 8 / 16:
                                                 # safe 0.04 / 0.09 / 0.16, risky 0.29 / 0.55 / 0.80
  world = World(seed=3, pool=64, per_step=16)

  def step(t):
    rng = np.random.default_rng([9, t])
    ids = rng.choice(32, 16, replace=False) + (32 if t % 2 else 0)
    lengths = 500 * np.exp(0.3 * rng.standard_normal((16, 16)))
    lengths *= np.where(rng.random((16, 16)) < tail[ids, None], rng.uniform(2, 5, (16, 16)), 1)
    return ids, np.rint(lengths), rng.random((16, 16)) < 0.5

  world.step = step
  for seed in (0, 1):
    result = {}
    for kind in ("prompt_aware", "sagc"):
      out = run(build(kind, candidates=CANDIDATES, delta=0.35, seed=seed), world, 1200)
      gs = np.log2([s[0] for s, _ in out])
      rate = np.mean([m["straggler_rate"] for _, m in out[400:]])
      assert abs(rate - 0.35) < 0.02 and np.abs(np.diff(gs)).max() <= 1
      result[kind] = (gs[400::2].mean() - gs[401::2].mean(), gs[400:].mean())
    (aware_gap, aware_g), (sagc_gap, sagc_g) = result["prompt_aware"], result["sagc"]
    assert aware_gap > 0.2 and aware_gap > sagc_gap + 0.3, (seed, result)
    assert aware_g > sagc_g, (seed, result)


# ---------------------------------------------------------------- allocation
def brute_force(values, sizes, budget):
  best, arg = -np.inf, None
  for pick in itertools.product(range(len(sizes)), repeat=len(values)):
    if sum(sizes[j] for j in pick) <= budget:
      v = sum(values[i, j] for i, j in enumerate(pick))
      if v > best:
        best, arg = v, pick
  return best, arg


@pytest.mark.parametrize("sizes", [(4, 8, 16), (2, 3, 8), (4, 16)])
def test_allocation_equals_brute_force(sizes):
  rng = np.random.default_rng(0)
  cases = 0
  for _ in range(60):
    k = int(rng.integers(1, 6))
    values = rng.normal(size=(k, len(sizes))) + np.log2(sizes) * rng.uniform(0, 2)
    budget = int(rng.integers(k * sizes[0], k * sizes[-1] + 3))
    best, arg = brute_force(values, sizes, budget)
    picked = allocate_group_sizes(values, sizes, budget)
    assert sum(sizes[j] for j in picked) <= budget
    assert values[np.arange(k), picked].sum() == pytest.approx(best, abs=1e-12)
    assert tuple(picked.tolist()) == arg            # continuous values: a unique optimum
    cases += budget < k * sizes[-1]
  assert cases > 20                                  # the budget bound in most cases
  with pytest.raises(ValueError, match="row budget 7 is below 2 prompts x G=4"):
    allocate_group_sizes(np.zeros((2, 3)), (4, 8, 16), 7)


def test_per_prompt_allocation_matches_brute_force_from_the_state():
  """A hand-made pool: 2 prompts that always pass, 2 that pass half the time, 2 with
  heavy tails. Each proposal is re-derived from the JSON state (twin RNG, buckets and
  pass-rate weights from the history, SAGC's base rule) and brute-forced over all
  3^6 assignments under the budget P(G_b) * G_b."""
  world = World(seed=4, pool=6, per_step=6, tail_lo=0.0, tail_hi=0.0)
  world.pass_rate[:] = [1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
  world.tail[:] = [0.0, 0.0, 0.0, 0.0, 0.4, 0.4]
  ctrl = per_prompt(CANDIDATES, delta=0.3, prompts_for={4: 6, 8: 6, 16: 6},
                             seed=5, cell_prior_strength=2.0)
  checked = mixed = 0
  for t in range(150):
    ids, _, _ = world.step(t)
    state = json.loads(json.dumps(ctrl.state_dict()))
    buckets, weights = features_from_state(state, ids, world.tokens[ids])
    a, b = cell_params(state, 2.0)
    draws = twin_rng(state).beta(a, b)
    base = sagc_rule(state, [draws[k, buckets].mean() for k in range(3)])
    wbar = weights / weights.mean()
    values = wbar[:, None] * np.log2(CANDIDATES) - state["lambda"] * draws[:, buckets].T
    _, arg = brute_force(values, CANDIDATES, 6 * CANDIDATES[base])
    sizes, metrics = run(ctrl, world, 1, start=t)[0]
    np.testing.assert_array_equal(sizes, np.array(CANDIDATES)[list(arg)])
    assert ctrl.base_g == CANDIDATES[base] and metrics["allocated_rows"] <= metrics["row_budget"]
    checked += 1
    mixed += len(set(sizes.tolist())) > 1
  assert checked == 150 and mixed > 50
  # Late in the run: the half-solved, light prompts get the largest groups.
  late = [run(ctrl, world, 1, start=t)[0][0] for t in range(150, 250)]
  order = [np.argsort(world.step(t)[0]) for t in range(150, 250)]
  by_prompt = np.array([s[o] for s, o in zip(late, order)])      # columns: prompt 0..5
  mean_g = np.log2(by_prompt).mean(axis=0)
  assert mean_g[2:4].min() > mean_g[:2].max() and mean_g[2:4].min() > mean_g[4:].max(), mean_g


def test_per_prompt_budget_never_exceeded_and_interface():
  ctrl = per_prompt(seed=1, prompts_for=lambda g: 64 // g)      # hold_rollouts, 64 rows
  assert isinstance(ctrl, PerPromptController)
  assert [ctrl.prompts_for(g, 99) for g in CANDIDATES] == [16, 8, 4]
  world = World(seed=6, per_step=16)
  for t in range(300):
    sizes, metrics = run(ctrl, world, 1, start=t)[0]
    assert sizes.sum() <= 64 and set(sizes.tolist()) <= set(CANDIDATES)
    assert metrics["allocated_rows"] == sizes.sum() and metrics["row_budget"] == 64
    assert metrics["g"] == pytest.approx(sizes.mean())
    assert ctrl.g == max(CANDIDATES, key=lambda c: (np.sum(sizes == c), -c))
  with pytest.raises(ValueError, match="propose_groups"):
    ctrl.propose(BatchContext(np.arange(16), np.ones(16, int)))
  with pytest.raises(ValueError, match="BatchContext"):
    ctrl.propose_groups(None)
  with pytest.raises(ValueError, match="context holds 5 prompts, but candidate G=4 samples "
                                       "P\\(4\\)=16"):
    ctrl.propose_groups(BatchContext(np.arange(5), np.ones(5, int)))
  sizes = ctrl.propose_groups(BatchContext(np.arange(16), np.ones(16, int)))
  np.testing.assert_array_equal(ctrl.propose_groups(BatchContext(np.arange(16) + 5,
                                                                 np.ones(16, int))), sizes)
  with pytest.raises(ValueError, match="group_sizes is required"):
    ctrl.observe(np.ones(sizes.size + 1), np.ones(sizes.size + 1))
  with pytest.raises(ValueError, match="not among the candidates"):
    ctrl.observe(np.ones(sizes.size), np.ones(sizes.size), group_sizes=np.full(sizes.size, 5))
  with pytest.raises(ValueError, match="per_prompt supports only 'group'"):
    per_prompt(event="step")


# ---------------------------------------------------------------- resume
@pytest.mark.parametrize("kind", ["prompt_aware", "per_prompt"])
@pytest.mark.parametrize("cut_between_propose_and_observe", [False, True])
def test_resume_through_json_continues_exactly(kind, cut_between_propose_and_observe):
  """Mid-run resume, with a history small enough to evict (the LRU order matters)."""
  world = World(seed=7, pool=90, per_step=16)
  make = lambda seed: build(kind, candidates=CANDIDATES, delta=0.2, prompts_for=HOLD_ROLLOUTS,
                            seed=seed, history_size=40, forgetting=0.95)
  reference = run(make(3), world, 300)
  first = make(3)
  run(first, world, 150)
  if cut_between_propose_and_observe:
    ids, _, _ = world.step(150)
    context = BatchContext(ids, world.tokens[ids])
    first.propose_groups(context) if kind == "per_prompt" else first.propose(context)
  state = json.loads(json.dumps(first.state_dict()))
  assert len(state["history"]["records"]) == 40
  resumed = make(99)
  resumed.load_state_dict(state)
  assert resumed.state_dict() == first.state_dict()
  rest = run(resumed, world, 150, start=150)
  for (s1, m1), (s2, m2) in zip(reference[150:], rest):
    np.testing.assert_array_equal(s1, s2)
    assert m1 == m2
  with pytest.raises(ValueError, match="feature buckets"):
    build(kind, candidates=CANDIDATES, prompts_for=HOLD_ROLLOUTS,
          tail_edges=(0.3,)).load_state_dict(state)
  with pytest.raises(ValueError, match="state is for a 'sagc' controller"):
    make(0).load_state_dict(sagc(CANDIDATES).state_dict())


# ----------------------------------------------------------- regimes
@pytest.mark.parametrize("kind", ["prompt_aware", "per_prompt"])
def test_infeasible_regime_settles_at_the_smallest_size(kind):
  """Even G = 4 straggles in more than delta of the groups: after warm-up both modes
  use G = 4 (per_prompt: nearly every group) at G = 4's own rate."""
  for seed in range(3):
    world = World(seed=10 + seed, per_step=16, tail_lo=0.15, tail_hi=0.35)
    baseline = run(static(4), world, 600)
    own = np.mean([m["straggler_rate"] for _, m in baseline[100:]])
    assert own > 0.25 + 0.02
    out = run(build(kind, candidates=CANDIDATES, delta=0.25,
                    prompts_for={4: 16, 8: 16, 16: 16}, seed=seed), world, 600)
    at_4 = np.mean([np.mean(s == 4) for s, _ in out[100:]])
    rate = np.mean([m["straggler_rate"] for _, m in out[100:]])
    assert at_4 >= 0.95 and abs(rate - own) <= 0.03, (seed, at_4, rate, own)
    assert out[-1][1]["lambda"] > 10


def test_prompt_aware_feasible_regime_holds_the_rate_at_delta():
  world = World(seed=20, per_step=16, tail_lo=0.0, tail_hi=0.08)
  rates = [np.mean([m["straggler_rate"] for _, m in run(static(g), world, 1500)[300:]])
           for g in CANDIDATES]
  assert rates[0] < 0.2 < rates[2], rates
  for kind in ("prompt_aware", "per_prompt"):
    out = run(build(kind, candidates=CANDIDATES, delta=0.2, prompts_for={4: 16, 8: 16, 16: 16},
                    seed=0), world, 1500)
    rate = np.mean([m["straggler_rate"] for _, m in out[300:]])
    assert abs(rate - 0.2) < 0.03, (kind, rate, rates)


# ------------------------------------------------------------ observe, config
def test_observe_metrics_and_rejected_steps_change_nothing():
  ctrl = prompt_aware(CANDIDATES, prompts_for=HOLD_ROLLOUTS, seed=0)
  world = World(seed=8)
  _, metrics = run(ctrl, world, 5)[-1]
  sagc_keys = set(run(sagc(CANDIDATES), world, 1)[0][1])
  assert sagc_keys < set(metrics)
  assert {"predicted_straggler_rate", "feature_coverage", "history_prompts"} <= set(metrics)
  ids, _, _ = world.step(5)
  g = ctrl.propose(BatchContext(ids, world.tokens[ids]))
  n = HOLD_ROLLOUTS[g]
  before = json.dumps(ctrl.state_dict())
  for kwargs, match in [(dict(pass_rates=np.full(n, 1.5)), "fractions in"),
                        (dict(group_sizes=np.full(n, 2 * g if g < 16 else 4)), "one size"),
                        (dict(prompt_ids=np.arange(n - 1)), "one entry per group"),
                        (dict(prompt_ids=np.full(n, 0.5)), "integers")]:
    with pytest.raises(ValueError, match=match):
      ctrl.observe(np.full(n, 10.0), np.full(n, 5.0), **kwargs)
    assert json.dumps(ctrl.state_dict()) == before
  metrics = ctrl.observe(np.full(n, 10.0), np.full(n, 5.0))     # groups = context order
  assert metrics["n_groups"] == n and metrics["feature_coverage"] > 0


def base_section(**overrides):
  """A complete controller section (the schema's defaults) with ``overrides``, unchecked."""
  section = dict(controller_settings({}), kind="prompt_aware", tail_edges=(0.5, 1.0),
                 history_size=100)
  section.update(overrides)
  return section


@pytest.mark.parametrize("key, value, match", [
    ("kind", "prompt-aware", "controller.kind='prompt-aware' is not one of"),
    ("tail_edges", (1.0, 0.5), "controller: tail_edges=\\(1.0, 0.5\\) must be"),
    ("length_edges", (-1.0,), "controller: length_edges"),
    ("length_edges", 3.0, "controller.length_edges=3.0 must be a sequence"),
    ("cell_prior_strength", 0.0, "controller: cell_prior_strength=0.0 is outside"),
    ("history_size", 0, "controller: history_size must be a positive int, got 0"),
    ("history_forgetting", 1.5, "controller: history_forgetting=1.5 is outside"),
    ("history_sise", 10, "controller.history_sise is not a controller setting"),
])
def test_invalid_config_values_name_the_key(key, value, match):
  for kind in ("prompt_aware", "per_prompt"):
    section = base_section(**{"kind": kind, key: value})
    with pytest.raises(ValueError, match=match):
      controller_from_config(section)
  if key not in ("kind", "history_sise"):
    controller_from_config(base_section(kind="sagc", **{key: value}))   # ignored by sagc


def test_config_builds_every_kind_from_the_schema():
  from sagc_jax.config import run_config
  from sagc_jax.config.schema import base_config

  config = base_config()
  for kind, cls in [("sagc", SAGCController), ("static", StaticController),
                    ("prompt_aware", PromptAwareController),
                    ("per_prompt", PerPromptController)]:
    config.controller.kind = kind
    ctrl = run_config(config).build_controller()
    assert type(ctrl) is cls
    assert run_config(config).group_sizes() == ((8,) if kind == "static" else CANDIDATES)
  assert ctrl.prompts_for(16, 99) == config.rollout.prompts_per_step      # hold_prompts
  assert ctrl.features.tail_edges == (0.8, 1.25) and ctrl.cell_prior_strength == 2.0
  section = run_config(config).controller.to_dict()
  ctrl = controller_from_config(section, prompts_for=lambda g: 64 // g)
  assert ctrl.prompts_for(16, 99) == 4
  with pytest.raises(ValueError, match="prompts_for gives P\\(4\\)=0"):
    controller_from_config(section, prompts_for={4: 0, 8: 1, 16: 1})
