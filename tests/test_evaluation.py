"""Held-out evaluation metrics users report (#15): pass@k, mean@k, length percentiles."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sagc_jax.config import preset, validate
from sagc_jax.training.evaluation import (length_stats, paired_gain, pass_at_k,
                                         straggler_profile)


def _pass_at_j_by_enumeration(row: np.ndarray, j: int) -> float:
  """The share of j-subsets of a problem's samples holding a correct one (what the
  unbiased estimator estimates), by brute force."""
  subsets = list(itertools.combinations(range(len(row)), j))
  return sum(any(row[list(s)]) for s in subsets) / len(subsets)


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_pass_at_k_matches_subset_enumeration_and_the_closed_form(k):
  rng = np.random.default_rng(k)
  correct = rng.random((12, k)) < rng.random((12, 1))      # per-problem difficulty
  correct[0] = False
  correct[1] = True
  out = pass_at_k(correct)
  assert out[f"eval_mean@{k}"] == pytest.approx(correct.mean())
  js = sorted({j for j in (2, 4, 8) if j <= k} | {k})
  assert sorted(int(key.split("@")[1]) for key in out if key.startswith("eval_pass@")) == js
  for j in js:
    enumerated = np.mean([_pass_at_j_by_enumeration(row, j) for row in correct])
    c = correct.sum(axis=1)
    closed = np.mean([1 - math.comb(k - ci, j) / math.comb(k, j) for ci in c])
    assert out[f"eval_pass@{j}"] == pytest.approx(enumerated) == pytest.approx(closed)
  # pass@k with n = k samples is the share of problems with at least one correct.
  assert out[f"eval_pass@{k}"] == pytest.approx(correct.any(axis=1).mean())


def test_length_stats_are_numpy_percentiles():
  lengths = np.array([[3, 100], [5, 7], [9, 11]])
  out = length_stats("len", lengths)
  flat = lengths.reshape(-1)
  assert out == {"len": pytest.approx(flat.mean()), "len_p50": pytest.approx(8.0),
                 "len_p90": pytest.approx(np.percentile(flat, 90)), "len_max": 100.0}


@pytest.mark.parametrize("k, rows, match", [
    (-1, 0, "train.eval_k=-1 must be an integer >= 0"),
    (1, 0, "train.eval_k=1 must be 0 .off. or >= 2"),
    (65, 0, "train.eval_k=65 must be <= rollout.eval_batch=64"),
    (32, 16, "train.eval_k=32 must be <= rollout.max_rows_per_call=16")])
def test_bad_eval_k_is_refused(k, rows, match):
  c = preset("grpo", "sagc")
  c.train.eval_k = k
  c.rollout.max_rows_per_call = rows
  with pytest.raises(ValueError, match=match):
    validate(c)


def test_paired_gain_is_the_mean_difference_with_a_t_style_interval():
  """Against a direct computation: 10 examples, 4 gained, 1 lost."""
  before = [0, 0, 0, 0, 1, 1, 0, 0, 1, 0]
  after = [1, 1, 1, 1, 0, 1, 0, 0, 1, 0]
  d = np.array([1, 1, 1, 1, -1, 0, 0, 0, 0, 0], float)
  half = 1.96 * math.sqrt(((d - d.mean()) ** 2).sum() / 9) / math.sqrt(10)
  out = paired_gain(before, after)
  assert out["eval_sampled_gain"] == pytest.approx(0.3)
  assert out["eval_sampled_gain_ci95_low"] == pytest.approx(0.3 - half)
  assert out["eval_sampled_gain_ci95_high"] == pytest.approx(0.3 + half)
  assert out["eval_sampled_gain_examples"] == 10
  with pytest.raises(ValueError, match="equal-length"):
    paired_gain([0, 1], [0, 1, 1])


def test_straggler_profile_matches_a_loop_over_groups_and_exact_step_probabilities():
  """Hand-built lengths with known events, then a random case against a plain loop:
  groups are disjoint chunks of each prompt's k draws, the group event is max > tau *
  median, and a step of m distinct prompts with one random chunk each straggles with
  probability 1 - mean over m-subsets S of prod_{p in S} (1 - share of p's chunks
  that straggle), enumerated here."""
  # 2 prompts x 8 draws. G=4 chunks: p0 [10,10,10,40] (4.0 > 1.8: straggles),
  # p0 [10,10,10,10], p1 [5,5,5,5], p1 [5,5,9,9] (9/7 = 1.29: no).
  lengths = np.array([[10, 10, 10, 40, 10, 10, 10, 10], [5, 5, 5, 5, 5, 5, 9, 9]])
  out = straggler_profile(lengths, 1.8, lambda g: 2, sizes=(4, 8, 16))
  assert out["eval_g4_groups"] == 4 and out["eval_g4_group_straggler_rate"] == 0.25
  # a step holds both prompts; it straggles iff p0's first chunk is drawn: 1/2.
  assert out["eval_g4_step_straggler_rate"] == pytest.approx(0.5, abs=0.04)
  assert out["eval_g4_ratio_max"] == 4.0
  # G=8: p0 max 40, median 10 -> straggles; p1 max 9, median 5 -> 1.8, not > 1.8.
  assert out["eval_g8_group_straggler_rate"] == 0.5
  assert out["eval_g8_step_straggler_rate"] == 1.0 and out["eval_g8_groups_per_step"] == 2
  assert "eval_g16_groups" not in out            # 16 > k draws: no groups of 16

  rng = np.random.default_rng(0)
  lengths = np.ceil(rng.lognormal(4.0, 0.8, size=(9, 16)))
  out = straggler_profile(lengths, 1.8, lambda g: 16 // g, sizes=(4, 8, 16))
  for g in (4, 8, 16):
    groups = [[lengths[p, c * g:(c + 1) * g] for c in range(16 // g)] for p in range(9)]
    events = [[max(x) > 1.8 * float(np.median(x)) for x in chunks] for chunks in groups]
    share = [np.mean(e) for e in events]
    m = 16 // g
    exact = 1 - np.mean([np.prod([1 - share[p] for p in subset])
                         for subset in itertools.combinations(range(9), m)])
    assert out[f"eval_g{g}_groups"] == 9 * m
    assert out[f"eval_g{g}_group_straggler_rate"] == pytest.approx(np.mean(events))
    assert out[f"eval_g{g}_step_straggler_rate"] == pytest.approx(exact, abs=0.04)
    ratios = [max(x) / np.median(x) for chunks in groups for x in chunks]
    assert out[f"eval_g{g}_ratio_p90"] == pytest.approx(np.percentile(ratios, 90))


@pytest.mark.parametrize("segmented", [False, True], ids=["fused", "segmented"])
def test_evaluation_reports_pass_at_k_without_new_compilations(shared, tmp_path, segmented):
  """k samples per example go through the sampled eval sampler's compiled bucket (one
  group per example; the segmented sampler compiles the k-group at warm-up); the
  greedy and one-sample results do not change with k."""
  from test_trainer import small_config

  from sagc_jax.runtime import compilation
  from sagc_jax.training.loop import Trainer

  config = small_config(shared)
  config.rollout.segmented_eval = segmented
  plain_trainer = Trainer(config, tmp_path / "plain", log=lambda m: None)
  try:
    plain = plain_trainer.evaluate()        # compiles only the evaluation's programs
  finally:
    plain_trainer.close()
  config.train.eval_k = 4
  trainer = Trainer(config, tmp_path / "with_k", log=lambda m: None)
  try:
    trainer.warmup()
    compilation.install()
    before = compilation.compile_count()
    with_k = trainer.evaluate()
    assert compilation.compile_count() == before
  finally:
    trainer.close()
  for key, value in plain.items():
    if key != "eval_seconds":
      assert with_k[key] == value, key
  for key in ("eval_pass@2", "eval_pass@4", "eval_mean@4", "eval_k4_response_len_p90",
              "eval_k4_response_len_p99", "eval_g4_group_straggler_rate"):
    assert key in with_k
  assert 0.0 <= with_k["eval_mean@4"] <= with_k["eval_pass@2"] <= with_k["eval_pass@4"] <= 1.0
  assert (with_k["eval_response_len"] <= with_k["eval_response_len_max"]
          and with_k["eval_response_len_p50"] <= with_k["eval_response_len_p90"])


def test_the_eval_report_prints_each_g_s_straggler_profile():
  """``python -m sagc_jax.eval`` with ``train.eval_k`` > 1 prints a line per G from the
  profile's own keys."""
  from sagc_jax.eval import format_result

  lengths = np.array([[10, 10, 10, 40, 10, 10, 10, 10], [5, 5, 5, 5, 5, 5, 9, 9]])
  result = {"eval_sampled_accuracy": 0.5, "eval_examples": 2.0, "source": "step 3",
            **straggler_profile(lengths, 1.8, lambda g: 2, sizes=(4, 8))}
  lines = format_result(result).splitlines()
  assert lines[1].startswith("  G=4: max/median p50") and "0.250 of 4 groups" in lines[1]
  assert "of steps of 2 groups" in lines[2] and lines[2].startswith("  G=8:")
