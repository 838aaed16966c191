"""GRPO/DAPO learner: presets, prepare vs numpy, loss decrease, accumulation,
NaN skip, zero recompiles, sharded == unsharded, rollout assembly."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from sagc_jax.runtime import compilation
from sagc_jax.models import init_model, tiny_config
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.learner import Learner
from sagc_jax.training.build import rollout_batch
from sagc_jax.rl.rollout import concat_rollouts, select_groups
from sagc_jax.sampling import Sampler, SamplingParams

N_NEW = 12
PROMPT_BUCKET = 8


def small_config():
  return dataclasses.replace(tiny_config(), hidden_size=64, intermediate_size=128,
                             num_layers=2, head_dim=16)


def new_model(seed=0):
  return init_model(small_config(), seed=seed, init_std=0.1)


@pytest.fixture(scope="module")
def samples():
  """Two sampled rollout batches (16 rows: 4 prompts x G=4, and 2 x 8) with rewards."""
  model = new_model()
  sampler = Sampler(model, SamplingParams(N_NEW, temperature=1.0, stop_ids=(2,)),
                    row_buckets=(16,), prompt_buckets=(PROMPT_BUCKET,))
  rng = np.random.default_rng(0)
  out = []
  for step, (prompts, g) in enumerate([(4, 4), (2, 8)]):
    prompt_ids = [rng.integers(5, 100, rng.integers(3, 9)).tolist() for _ in range(prompts)]
    batch = sampler.generate(model, prompt_ids, g, seed=step)
    real = batch.response_tokens[:batch.num_rows]
    scores = (real == 50).sum(1) + rng.normal(0, 0.5, batch.num_rows)
    scores[:g] = 1.0            # one group with equal rewards (dropped by DAPO)
    out.append(rollout_batch(batch, scores))
  return out


def params_of(model):
  return jax.tree.map(np.asarray, nnx.state(model, nnx.Param))


def max_param_diff(a, b):
  return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a),
                                                         jax.tree.leaves(b)))


def test_presets_match_the_papers():
  grpo, dapo = LearnerConfig.grpo(), LearnerConfig.dapo(max_response_len=64, overlong_buffer=16)
  assert (grpo.clip_low, grpo.clip_high, grpo.kl_coef, grpo.kl_kind, grpo.agg) == (
      0.2, 0.2, 0.04, "k3", "seq-mean-token-mean")
  assert grpo.normalize_std and not grpo.dynamic_sampling
  assert (dapo.clip_low, dapo.clip_high, dapo.kl_coef, dapo.agg) == (0.2, 0.28, 0.0, "token-mean")
  assert dapo.dynamic_sampling and dapo.overlong_buffer == 16


@pytest.mark.parametrize("values, match", [
    (dict(lr=0.0), "learner.lr=0.0"),
    (dict(agg="mean"), "learner.agg='mean'"),
    (dict(kl_kind="k4"), "learner.kl_kind='k4'"),
    (dict(mini_batches=0), "learner.mini_batches=0"),
    (dict(clip_c=0.5), "learner.clip_c=0.5"),
    (dict(schedule="linear"), "learner.schedule='linear'"),
    (dict(overlong_buffer=10, max_response_len=5), "learner.overlong_buffer=10"),
    (dict(algorithm="ppo"), "learner.algorithm='ppo'"),
    (dict(learning_rate=1e-3), "learner.learning_rate is not a learner setting"),
])
def test_invalid_learner_settings_name_the_key(values, match):
  with pytest.raises(ValueError, match=match):
    LearnerConfig.from_dict(values)


def numpy_advantages(scores, group_ids, valid, normalize_std=True, eps=1e-6):
  adv = np.zeros_like(scores, dtype=np.float64)
  for g in np.unique(group_ids[valid]):
    rows = valid & (group_ids == g)
    s = scores[rows].astype(np.float64)
    centred = s - s.mean()
    std = s.std(ddof=1) if s.size > 1 else 0.0
    adv[rows] = centred / (std + eps) if normalize_std else centred
  return adv


def test_prepare_matches_numpy_with_overlong_shaping_and_dynamic_sampling(samples):
  batch = samples[0]
  cfg = LearnerConfig.dapo(max_response_len=N_NEW, overlong_buffer=4, overlong_factor=0.5)
  learner = Learner(new_model(), cfg, (16,), (PROMPT_BUCKET,), (N_NEW,))
  adv, keep, shaped = learner.prepare(batch)
  valid = batch.row_valid
  lengths = batch.lengths.astype(np.float64)
  penalty = np.where(lengths <= N_NEW - 4, 0.0,
                     np.maximum((N_NEW - 4 - lengths) / 4 * 0.5, -0.5))
  expected_scores = np.where(valid, batch.scores + penalty, 0)
  np.testing.assert_allclose(shaped, expected_scores, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(adv, numpy_advantages(expected_scores, batch.group_ids, valid),
                             rtol=1e-4, atol=1e-5)
  for g in range(4):
    rows = batch.group_ids == g
    assert keep[rows].all() == (np.ptp(expected_scores[rows]) > 0)


@pytest.mark.parametrize("preset", ["grpo", "dapo"])
def test_presets_give_finite_loss_that_decreases_on_a_fixed_batch(samples, preset):
  cfg = getattr(LearnerConfig, preset)(lr=3e-3, max_response_len=N_NEW, mini_batches=2)
  model = new_model()
  learner = Learner(model, cfg, (16,), (PROMPT_BUCKET,), (N_NEW,))
  losses = [learner.update(samples[0])["loss"] for _ in range(6)]
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.01, losses
  if preset == "grpo":
    assert learner.reference is not None
  else:
    assert learner.reference is None            # DAPO keeps no reference model


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_equals_one_big_minibatch(samples, agg):
  # Adam's first step is ~lr * sign(g); with eps = 1 it is ~ -lr * g / (|g| + 1), so the
  # parameter change tracks the gradient itself and tiny gradients cannot flip signs.
  initial = params_of(new_model())
  deltas = []
  for accum in (1, 4):
    model = new_model()
    cfg = LearnerConfig.grpo(lr=1.0, eps=1.0, agg=agg, grad_accum=accum, weight_decay=0.0,
                             max_grad_norm=1e6)
    learner = Learner(model, cfg, (16,), (PROMPT_BUCKET,), (N_NEW,))
    learner.update(samples[0])
    deltas.append(jax.tree.map(np.subtract, params_of(model), initial))
  biggest = max(float(np.abs(x).max()) for x in jax.tree.leaves(deltas[0]))
  assert biggest > 1e-4                          # a real update happened
  assert max_param_diff(*deltas) < 1e-3 * biggest


def test_non_finite_update_is_skipped_and_counted(samples):
  model = new_model()
  before = params_of(model)
  learner = Learner(model, LearnerConfig.grpo(lr=1e-2, mini_batches=2), (16,),
                    (PROMPT_BUCKET,), (N_NEW,))
  bad = dataclasses.replace(samples[0], old_logprobs=samples[0].old_logprobs.copy())
  bad.old_logprobs[0, 0] = np.nan               # a real token of row 0
  assert bad.response_mask[0, 0]
  metrics = learner.update(bad, seed=0)
  assert metrics["skipped_updates"] == 1        # the minibatch holding row 0 only
  assert metrics["updates"] == 2
  after = params_of(model)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))
  assert learner.skipped_updates == 1
  nan_scores = dataclasses.replace(samples[0], scores=np.full_like(samples[0].scores, np.nan))
  model2 = new_model()
  learner2 = Learner(model2, LearnerConfig.grpo(lr=1e-2), (16,), (PROMPT_BUCKET,), (N_NEW,))
  assert learner2.update(nan_scores)["skipped_updates"] == 1
  assert max_param_diff(params_of(model2), before) == 0.0


def test_dynamic_sampling_judges_raw_rewards_not_the_overlong_penalty(samples):
  cfg = LearnerConfig.dapo(max_response_len=N_NEW, overlong_buffer=6)
  learner = Learner(new_model(), cfg, (16,), (PROMPT_BUCKET,), (N_NEW,))
  all_wrong = dataclasses.replace(samples[0], scores=np.zeros(16, np.float32),
                                  lengths=np.tile([2, 4, 11, 12], 4).astype(np.int32))
  adv, keep, shaped = learner.prepare(all_wrong)
  assert np.ptp(shaped[:4]) > 0           # the penalty differs inside the group ...
  assert not keep.any()                   # ... but every group is all-wrong: dropped


def test_minibatches_without_real_tokens_are_not_updated(samples):
  one_group = concat_rollouts([select_groups(samples[0], [1])], rows=16)   # 4 real rows
  model = new_model()
  learner = Learner(model, LearnerConfig.grpo(lr=1e-2, mini_batches=4), (16,),
                    (PROMPT_BUCKET,), (N_NEW,))
  metrics = learner.update(one_group)
  assert metrics["updates"] + metrics["empty_minibatches"] == 4
  assert metrics["empty_minibatches"] >= 1 and learner.step == metrics["updates"]


@pytest.mark.parametrize("packing", [True, False])
def test_zero_compilations_after_warmup_across_group_sizes(samples, packing):
  model = new_model()
  cfg = LearnerConfig.grpo(lr=1e-3, mini_batches=2, packing=packing)
  learner = Learner(model, cfg, (16,), (PROMPT_BUCKET,), (6, N_NEW))
  # prepare, zeros, apply + (gradient step, reference pass) per microbatch shape:
  # packed, 2 pack lengths (8 + 6, 8 + 12) x row ladder (8, 4, 2, 1 rows); padded, one
  # 8-row microbatch per response bucket.
  expected = 3 + 2 * (2 * 4 if packing else 2)
  assert learner.warmup() == expected
  before = compilation.compile_count()
  rng = np.random.default_rng(1)
  for step in range(10):
    batch = samples[int(rng.integers(0, 2))]
    cut = int(rng.choice([1, 4, 6, N_NEW]))    # responses short enough for a smaller bucket
    lengths = np.minimum(batch.lengths, cut)
    trimmed = dataclasses.replace(
        batch, lengths=lengths,
        response_mask=np.arange(N_NEW)[None, :] < lengths[:, None])
    metrics = learner.update(trimmed, seed=step)
    assert metrics["response_bucket"] == (6 if cut <= 6 else N_NEW)
    assert metrics["updates"] == 2
  assert compilation.compile_count() == before
  assert learner.num_executables == expected


def test_sharded_update_equals_single_device(samples):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  # eps = 1 keeps Adam's step proportional to the gradient (see the accumulation test).
  cfg = LearnerConfig.grpo(lr=1.0, eps=1.0, mini_batches=2, max_grad_norm=1e6)
  initial = params_of(new_model())
  single = new_model()
  Learner(single, cfg, (16,), (PROMPT_BUCKET,), (N_NEW,)).update(samples[1])
  sharded = init_model(small_config(), seed=0, init_std=0.1, mesh=mesh)
  learner = Learner(sharded, cfg, (16,), (PROMPT_BUCKET,), (N_NEW,), mesh=mesh)
  learner.update(samples[1])
  kernel = sharded.layers[0].mlp.up_proj.kernel[...]
  assert len(kernel.sharding.device_set) == 8
  delta = jax.tree.map(np.subtract, params_of(single), initial)
  biggest = max(float(np.abs(x).max()) for x in jax.tree.leaves(delta))
  assert biggest > 1e-4
  assert max_param_diff(params_of(single), params_of(sharded)) < 1e-3 * biggest


def test_bad_batches_are_refused(samples):
  learner = Learner(new_model(), LearnerConfig.grpo(), (16,), (PROMPT_BUCKET,), (6,))
  with pytest.raises(ValueError, match="longest response=12 exceeds the largest response "
                                       "bucket 6"):
    learner.update(samples[0])
  with pytest.raises(ValueError, match="row bucket 16 does not split"):
    Learner(new_model(), LearnerConfig.grpo(mini_batches=3), (16,), (PROMPT_BUCKET,), (6,))
  small = concat_rollouts([select_groups(samples[0], [1])], rows=8)
  with pytest.raises(ValueError, match="batch has 8 rows"):
    learner.update(small)


def test_concat_rollouts_renumbers_groups_and_pads(samples):
  a = select_groups(samples[0], [2, 0])
  b = select_groups(samples[0], [3])
  merged = concat_rollouts([a, b], rows=16)
  assert merged.num_rows == 16 and merged.row_valid.sum() == 12
  np.testing.assert_array_equal(merged.group_ids[:12], np.repeat([0, 1, 2], 4))
  source = samples[0]
  np.testing.assert_array_equal(merged.response_tokens[:4], source.response_tokens[8:12])
  np.testing.assert_array_equal(merged.scores[8:12], source.scores[12:16])
  assert not merged.response_mask[12:].any() and (merged.scores[12:] == 0).all()
  with pytest.raises(ValueError, match="do not fit"):
    concat_rollouts([a, b], rows=8)


def test_dynamic_sampling_refills_with_informative_groups(samples):
  from sagc_jax.rl.dynamic_sampling import collect_informative_groups
  learner = Learner(new_model(), LearnerConfig.dapo(max_response_len=N_NEW), (16,),
                    (PROMPT_BUCKET,), (N_NEW,))
  keep = lambda b: learner.prepare(b)[1]
  rounds = [samples[0], samples[0]]              # 3 informative groups of 4 per round
  result = collect_informative_groups(lambda r: (rounds[r], f"stats {r}"), keep,
                                      target_groups=4, rows=16, max_rounds=2)
  assert result.rounds == 2 and result.informative_groups == 4 and result.message is None
  assert result.round_stats == ["stats 0", "stats 1"]     # every round's, in order
  merged = result.batch
  assert merged.row_valid.all()
  for g in range(4):                             # every kept group has reward variance
    assert np.ptp(merged.scores[merged.group_ids == g]) > 0
  np.testing.assert_array_equal(merged.scores[:4], samples[0].scores[4:8])

  partial = collect_informative_groups(lambda r: (samples[0], None), keep, target_groups=4,
                                       rows=16, max_rounds=1)
  assert partial.informative_groups == 3 and partial.batch.row_valid.sum() == 12
  assert "only 3/4 informative groups after max_rounds=1" in partial.message
  flat = dataclasses.replace(samples[0], scores=np.where(samples[0].row_valid, 1.0, 0.0))
  none = collect_informative_groups(lambda r: (flat, None), keep, target_groups=4, rows=16,
                                    max_rounds=2)
  assert none.batch is None and "skipping the update" in none.message

  # Rounds whose groups differ in size (per_prompt; extra rounds at the base size): a
  # group that would overflow the row bucket is not taken, and the merged batch of
  # mixed sizes keeps each group's rows together.
  mixed = collect_informative_groups(lambda r: ([samples[0], samples[1]][r], None), keep,
                                     target_groups=4, rows=16, max_rounds=2)
  assert mixed.informative_groups == 3 and mixed.batch.row_valid.sum() == 12
  bigger = collect_informative_groups(lambda r: ([samples[1], samples[0]][r], None), keep,
                                      target_groups=4, rows=16, max_rounds=2)
  sizes = np.bincount(bigger.batch.group_ids[bigger.batch.row_valid])
  assert sizes.tolist() == [8, 4, 4] and bigger.batch.row_valid.sum() == 16
