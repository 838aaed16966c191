"""Packed learner (#13): the packer, exact aggregation weights, per-sequence attention,
and packed == padded == an independent reference for loss, gradients and metrics."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sagc_jax.models import init_model
from sagc_jax.models.transformer import ForwardOptions
from sagc_jax.rl import losses
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.learner import Learner
from sagc_jax.rl.packing import first_fit_decreasing, ladder_split, sequence_weights
from sagc_jax.rl.rollout import RolloutBatch
from sagc_jax.runtime.shapes import row_ladder
from test_learner import PROMPT_BUCKET, small_config

N_RESP = 16


def test_first_fit_decreasing_fills_bins_deterministically():
  lengths = [5, 9, 3, 7, 2, 10, 4]
  bins = first_fit_decreasing(lengths, 10)
  assert bins == [[5], [1], [3, 2], [0, 6], [4]]        # worked by hand
  assert bins == first_fit_decreasing(lengths, 10)
  assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
  assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
  with pytest.raises(ValueError, match="a sequence of 11 tokens exceeds the pack length 10"):
    first_fit_decreasing([11], 10)


def test_row_ladder_and_split_cover_the_rows_with_little_padding():
  assert row_ladder(64, 1) == (1, 2, 4, 8, 16, 32, 64)
  assert row_ladder(32, 4) == (4, 8, 16, 32)
  assert row_ladder(12, 4) == (4, 8, 12)      # doublings of the 'data' axis, and the top
  assert ladder_split(7, (4, 8, 12)) == [4, 4]
  with pytest.raises(ValueError, match="top=6 must be a multiple of base=4"):
    row_ladder(6, 4)
  assert ladder_split(26, (1, 2, 4, 8, 16)) == [16, 8, 2]
  assert ladder_split(13, (4, 8, 16)) == [8, 4, 4]
  assert ladder_split(0, (4, 8)) == []


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_sequence_weights_reproduce_every_aggregation_mode(mode):
  """sum_t w_t L_t == losses.aggregate(L, mask, mode) (a separate implementation)."""
  rng = np.random.default_rng(0)
  loss = rng.normal(size=(9, 13)).astype(np.float32)
  lengths = rng.integers(0, 14, 9)
  lengths[3] = 0                               # a row with nothing in the loss
  mask = np.arange(13)[None, :] < lengths[:, None]
  scale = 7.0 if mode == "seq-mean-token-sum-norm" else None
  weights = sequence_weights(mask.sum(1), mode, scale or 1.0)
  ours = float(np.sum(loss * mask * weights[:, None]))
  expected = float(losses.aggregate(loss, mask, mode, scale))
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attention", ["dense", "blocked", "splash"])
def test_packed_row_computes_each_sequence_as_if_alone(attention):
  """Three sequences and padding in one row: every sequence's hidden states equal the
  model run on that sequence alone (attention never crosses segments, positions restart)."""
  model = init_model(small_config(), seed=0, init_std=0.1)
  options = ForwardOptions(attention=attention, attention_block=8)
  rng = np.random.default_rng(1)
  seqs = [rng.integers(3, 100, n) for n in (7, 12, 5)]
  tokens = np.zeros((1, 30), np.int32)
  segments = np.zeros((1, 30), np.int32)
  positions = np.zeros((1, 30), np.int32)
  col = 0
  for i, s in enumerate(seqs, start=1):
    tokens[0, col:col + len(s)] = s
    segments[0, col:col + len(s)] = i
    positions[0, col:col + len(s)] = np.arange(len(s))
    col += len(s)
  hidden = nnx.jit(lambda m, *args, **kwargs: m.hidden_states(*args, **kwargs,
                                                               options=options)[0])
  packed = hidden(model, jnp.asarray(tokens), positions=jnp.asarray(positions),
                  segment_ids=jnp.asarray(segments))
  col = 0
  for s in seqs:
    alone = hidden(model, jnp.asarray(s[None]))
    np.testing.assert_allclose(np.asarray(packed[0, col:col + len(s)]), np.asarray(alone[0]),
                               rtol=1e-5, atol=1e-5)
    col += len(s)


def random_rollouts(seed: int, rows: int = 16, mix: str = "uniform") -> RolloutBatch:
  """A rollout batch with a chosen length mix (the learner needs no sampler for this):
  4 groups, left-padded prompts of 2..8 tokens, responses of 1..N_RESP tokens, noisy
  sampler log-probs (so ratios leave the clip range), two padding rows."""
  rng = np.random.default_rng(seed)
  real = rows - 2
  prompt_len = rng.integers(2, PROMPT_BUCKET + 1, rows)
  if mix == "heavy":
    resp = np.where(rng.random(rows) < 0.8, rng.integers(1, 4, rows),
                    rng.integers(N_RESP - 2, N_RESP + 1, rows))
  else:
    resp = rng.integers(1, N_RESP + 1, rows)
  resp[real:] = 0
  prompt_mask = np.arange(PROMPT_BUCKET)[None, :] >= (PROMPT_BUCKET - prompt_len)[:, None]
  response_mask = np.arange(N_RESP)[None, :] < resp[:, None]
  return RolloutBatch(
      prompt_tokens=np.where(prompt_mask, rng.integers(3, 100, prompt_mask.shape), 0
                             ).astype(np.int32),
      prompt_mask=prompt_mask,
      response_tokens=np.where(response_mask, rng.integers(3, 100, response_mask.shape), 0
                               ).astype(np.int32),
      response_mask=response_mask,
      old_logprobs=np.where(response_mask, rng.normal(-4.6, 0.4, response_mask.shape), 0
                            ).astype(np.float32),
      lengths=resp.astype(np.int32),
      group_ids=np.minimum(np.arange(rows) // 4, 3).astype(np.int32),
      row_valid=np.arange(rows) < real,
      scores=np.where(np.arange(rows) < real, rng.normal(size=rows), 0).astype(np.float32),
      group_size=4)


def reference_gradients(model, reference_params, batch: RolloutBatch, cfg: LearnerConfig,
                        learner: Learner):
  """The minibatch objective written straight from ``losses`` on the padded arrays
  (full-vocabulary logits, ``policy_loss`` + ``aggregate``): no learner code but its
  ``prepare`` (advantages, DAPO mask; tested against numpy in test_learner)."""
  adv, keep, _ = learner.prepare(batch)
  tokens = np.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
  attn = np.concatenate([batch.prompt_mask, batch.response_mask], axis=1)
  mask = batch.response_mask & keep[:, None]
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  scale = (float(cfg.max_response_len) if cfg.agg == "seq-mean-token-sum-norm" else None)

  def logprobs(p):
    logits = nnx.merge(graphdef, p, rest)(jnp.asarray(tokens), attention_mask=jnp.asarray(attn))
    logits = logits[:, PROMPT_BUCKET - 1:-1] / cfg.temperature
    return losses.token_logprobs(logits, jnp.asarray(batch.response_tokens))

  ref_logp = jax.lax.stop_gradient(logprobs(reference_params))

  def objective(p):
    logp = logprobs(p)
    pg, metrics = losses.policy_loss(logp, batch.old_logprobs, adv, mask, cfg.clip_low,
                                     cfg.clip_high, cfg.clip_c, cfg.agg, scale)
    total = pg
    if cfg.kl_coef > 0:
      kl = losses.aggregate(losses.kl_penalty(logp, ref_logp, cfg.kl_kind), mask, cfg.agg,
                            scale)
      total = total + cfg.kl_coef * kl
      metrics["kl"] = kl
    return total, metrics
  (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params)
  return float(loss), {k: float(v) for k, v in metrics.items()}, grads


# Every aggregation mode; GRPO (KL to a reference that differs) and DAPO (no KL, dynamic
# sampling); a uniform and a heavy-tailed length mix; with and without accumulation.
CASES = [("grpo", "seq-mean-token-mean", "uniform", 1), ("grpo", "token-mean", "heavy", 2),
         ("dapo", "token-mean", "uniform", 2), ("grpo", "token-sum", "heavy", 1),
         ("grpo", "seq-mean-token-sum", "uniform", 2),
         ("dapo", "seq-mean-token-sum-norm", "heavy", 1)]


def mesh_of(devices: int):
  if devices == 1:
    return None
  if jax.device_count() < devices:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  return jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


@pytest.mark.parametrize("preset,agg,mix,grad_accum", CASES)
def test_packed_and_padded_learners_equal_the_reference(preset, agg, mix, grad_accum):
  check_against_reference(preset, agg, mix, grad_accum, devices=1)


def test_packed_and_padded_learners_equal_the_reference_on_8_devices():
  check_against_reference("grpo", "seq-mean-token-mean", "heavy", 2, devices=8)


def check_against_reference(preset, agg, mix, grad_accum, devices):
  """Loss, gradients and metrics of one minibatch: packed == padded == reference, float32."""
  cfg = getattr(LearnerConfig, preset)(agg=agg, grad_accum=grad_accum, max_response_len=N_RESP,
                                       kl_coef=0.05 if preset == "grpo" else 0.0,
                                       dynamic_sampling=preset == "dapo")
  batch = random_rollouts(seed=len(agg) + grad_accum, mix=mix)
  batch.scores[:4] = 1.0                     # group 0: equal rewards (DAPO drops it)
  results = {}
  mesh = mesh_of(devices)
  for packing in (True, False):
    model = init_model(small_config(), seed=0, init_std=0.1, mesh=mesh)
    learner = Learner(model, dataclasses.replace(cfg, packing=packing), (16,),
                      (PROMPT_BUCKET,), (N_RESP,), mesh=mesh)
    reference = init_model(small_config(), seed=1, init_std=0.1)
    if learner.reference is not None:          # a reference that differs: KL has a gradient
      learner.reference = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding),
                                       nnx.state(reference, nnx.Param), learner.reference)
    results[packing] = learner.gradients(batch)
  loss, metrics, grads = reference_gradients(init_model(small_config(), seed=0, init_std=0.1),
                                             nnx.state(reference, nnx.Param), batch, cfg,
                                             learner)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads))
  assert scale > 1e-4
  for packing, (g, m) in results.items():
    np.testing.assert_allclose(m["loss"], loss, rtol=1e-5, atol=1e-6, err_msg=str(packing))
    for key in ("pg_loss", "clipfrac", "approx_kl", "ratio_mean", "ratio_max") + (
        ("kl",) if cfg.kl_coef else ()):
      np.testing.assert_allclose(m[key], metrics[key], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{key} packing={packing}")
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(grads)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale)
  assert metrics["clipfrac"] > 0                  # the clip branch is exercised
  for key in ("loss", "entropy", "clipfrac", "ratio_max"):
    np.testing.assert_allclose(results[True][1][key], results[False][1][key], rtol=1e-5,
                               atol=1e-6)


def test_recomputed_old_logprobs_replace_the_samplers_and_the_mismatch_is_logged():
  """The batch's "sampler" log-probs are noise: without recomputation the PPO ratio
  sees it (clipping); with it, the ratio of the first update is exactly 1. Both runs
  log the same sampler-vs-learner mismatch (one minibatch: every token is measured
  before the update)."""
  batch = random_rollouts(seed=5)
  metrics = {}
  for recompute in (False, True):
    learner = Learner(init_model(small_config(), seed=0, init_std=0.1),
                      LearnerConfig.grpo(recompute_old_logprobs=recompute),
                      (16,), (PROMPT_BUCKET,), (N_RESP,))
    metrics[recompute] = learner.update(batch)
  assert metrics[False]["clipfrac"] > 0.1 and abs(metrics[False]["ratio_mean"] - 1) > 0.01
  assert metrics[True]["clipfrac"] == 0.0
  np.testing.assert_allclose(metrics[True]["ratio_mean"], 1.0, atol=1e-5)
  np.testing.assert_allclose(metrics[True]["ratio_max"], 1.0, atol=1e-5)
  assert metrics[False]["logprob_mismatch_mean"] > 0.1
  for key in ("logprob_mismatch_mean", "logprob_mismatch_max"):
    np.testing.assert_allclose(metrics[True][key], metrics[False][key], rtol=1e-4)
