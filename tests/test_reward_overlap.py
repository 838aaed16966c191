"""Scoring finished rows while the rest decode (``rollout.overlap_rewards``).

The samplers must hand every real row to the listener exactly once, only when it is
final (its tokens equal the call's output), and before the call ends when rows finish
early (refill boundaries, sub-calls); the listener changes neither the tokens nor the
compiled programs. The scorer must return what one reward call over the whole round
returns, in row order, whatever the chunks.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from sagc_jax.rewards.mix import RewardMix, RewardTerm
from sagc_jax.rewards.streaming import StreamingScorer
from sagc_jax.runtime import compilation
from sagc_jax.sampling import Sampler, SamplingParams
from test_refill import N_NEW, STOPS, refill_sampler
from test_sampler import fused_reference, random_prompts
from test_segmented import assert_same_samples


class Recorder:
  """A listener that keeps what the sampler tells it, in order."""

  def __init__(self):
    self.events: list[tuple] = []

  def rows_done(self, rows, tokens, lengths):
    self.events.append(("rows", np.array(rows), np.array(tokens), np.array(lengths)))

  def work_while(self, busy):
    self.events.append(("lent", bool(busy())))

  def delivered(self):
    return [e for e in self.events if e[0] == "rows"]


def assert_each_real_row_delivered_once_as_final(recorder, batch):
  rows = np.concatenate([e[1] for e in recorder.delivered()])
  assert sorted(rows.tolist()) == list(range(batch.num_rows))
  for _, got_rows, tokens, lengths in recorder.delivered():
    np.testing.assert_array_equal(lengths, batch.lengths[got_rows])
    for row, row_tokens, n in zip(got_rows, tokens, lengths):
      np.testing.assert_array_equal(row_tokens[:n], batch.response_tokens[row, :n])


@pytest.mark.parametrize("kv_pages", [None, 8], ids=["no-eviction", "evicting-pool"])
def test_refill_hands_over_rows_as_they_stop_and_samples_the_same_tokens(llama, kv_pages):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS if kv_pages is None
                          else (7, 11))
  refill = refill_sampler(llama.model, params, kv_pages=kv_pages)
  prompts = random_prompts(4, 6, 12, seed=81)
  plain = refill.generate(llama.model, prompts, group_size=4, seed=3)
  recorder = Recorder()
  heard = refill.generate(llama.model, prompts, group_size=4, seed=3, listener=recorder)
  assert_same_samples(plain, heard)
  assert_each_real_row_delivered_once_as_final(recorder, heard)
  deliveries = recorder.delivered()
  assert len(deliveries) > 1, "every row came at once: nothing could overlap"
  # Rows arrive in the order they stop: the last delivery holds the longest row, and
  # the host was lent to the listener while segments ran after earlier deliveries.
  assert heard.lengths[:16].max() in deliveries[-1][3]
  first = recorder.events.index(deliveries[0])
  assert any(e[0] == "lent" for e in recorder.events[first:])
  if kv_pages is not None:
    assert refill.refill.evictions > 0, "the pool never ran short: the test proves nothing"


def test_sub_calls_hand_over_each_sub_call_s_rows_before_the_next_one_runs(llama):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  whole = fused_reference(llama.model, params)
  split = Sampler(llama.model, params, row_buckets=(16,), prompt_buckets=(12,),
                  decode_segment=0, max_rows_per_call=8)
  prompts = random_prompts(3, 2, 12, seed=82)        # 12 real rows of 16
  recorder = Recorder()
  a = whole.generate(llama.model, prompts, group_size=4, seed=5)
  b = split.generate(llama.model, prompts, group_size=4, seed=5, listener=recorder)
  assert_same_samples(a, b)
  assert_each_real_row_delivered_once_as_final(recorder, b)
  assert [e[1].tolist() for e in recorder.delivered()] == [list(range(8)), list(range(8, 12))]
  kinds = [e[0] for e in recorder.events]
  assert kinds.index("rows") < len(kinds) - 1 - kinds[::-1].index("lent"), (
      "the second sub-call did not lend the host after the first one's rows arrived")


def test_a_listener_compiles_nothing_after_warm_up(llama):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  refill = refill_sampler(llama.model, params)
  refill.warmup(llama.model)
  before = compilation.compile_count()
  for seed, g in enumerate((2, 8, 4)):
    recorder = Recorder()
    batch = refill.generate(llama.model, random_prompts(16 // g, 1, 12, seed=90 + seed), g,
                            seed=seed, listener=recorder)
    assert_each_real_row_delivered_once_as_final(recorder, batch)
  assert compilation.compile_count() == before


# ----------------------------------------------------------------- the scorer
def reward_mix():
  return RewardMix("exact_match", [RewardTerm("exact_match", "exact_match", 1.0),
                                   RewardTerm("format", "format", 0.5)], log=lambda m: None)


def synthetic_round(rows=12, n_new=6, seed=0):
  """Token rows whose text is 'answer <digit>' or junk, and the answers."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, n_new + 1, rows).astype(np.int32)
  tokens = rng.integers(0, 10, (rows, n_new)).astype(np.int32)
  answers = [str(a) for a in rng.integers(0, 10, rows)]
  return tokens, lengths, answers


def detokenize(tokens):
  """Token t -> digit t; a response whose first token is even reads 'answer <last>'."""
  digits = "".join(map(str, tokens))
  return f"answer {digits[-1]}" if digits and int(digits[0]) % 2 == 0 else f"junk {digits}"


@pytest.mark.parametrize("background", [False, True], ids=["main-thread", "worker-thread"])
@pytest.mark.parametrize("share", [range(0, 12), range(4, 10), range(0, 0)],
                         ids=["all-rows", "this-process-rows-4-to-9", "empty-share"])
def test_streamed_scores_equal_one_reward_call_over_the_round(share, background):
  tokens, lengths, answers = synthetic_round()
  mix = reward_mix()
  texts = [detokenize(tokens[r, :lengths[r]]) for r in share]
  expected = mix(texts, [answers[r] for r in share])           # one call, row order
  calls = []

  def score(local, chunk_texts):
    calls.append(len(local))
    return mix(chunk_texts, [answers[share.start + i] for i in local])

  scorer = StreamingScorer(share, detokenize, score, background=background, chunk_rows=2)
  busy = iter([True, True, False] + [True] * 100)
  # Rows finish out of order, some of them another process's (outside ``share``).
  for rows in ([7, 1, 11], [0, 4], [9, 5, 2]):
    scorer.rows_done(np.array(rows), tokens[rows], lengths[rows])
    scorer.work_while(lambda: next(busy))
  delivered = len({7, 1, 11, 0, 4, 9, 5, 2} & set(share))
  deadline = time.monotonic() + 30
  while background and sum(calls) < delivered and time.monotonic() < deadline:
    time.sleep(0.01)             # the worker thread scores the delivered rows of the share
  got_texts, got = scorer.finish(tokens, lengths)
  assert got_texts == texts
  for field, want in zip(got, expected):
    np.testing.assert_array_equal(field, want)
  if share:
    assert scorer.overlapped_rows > 0 and sum(calls) == len(share)
    assert max(calls[:-1], default=0) <= 2          # chunks while decoding, then the rest


def test_the_scorer_stops_working_when_the_device_is_done():
  tokens, lengths, answers = synthetic_round()
  mix = reward_mix()
  calls = []

  def score(local, texts):
    calls.append(len(local))
    return mix(texts, [answers[i] for i in local])
  scorer = StreamingScorer(range(12), detokenize, score, background=False, chunk_rows=3)
  scorer.rows_done(np.arange(12), tokens, lengths)
  checks = []

  def busy():
    checks.append(1)
    return len(checks) <= 2                        # the program ends after 2 chunks
  scorer.work_while(busy)
  assert calls == [3, 3]
  scorer.finish(tokens, lengths)                    # the other 6 in one call at the end
  assert calls == [3, 3, 6] and scorer.overlapped_rows == 6


def test_a_row_scored_early_that_differs_from_the_final_output_is_an_error():
  tokens, lengths, answers = synthetic_round()
  mix = reward_mix()
  scorer = StreamingScorer(range(12), detokenize,
                           lambda local, t: mix(t, [answers[i] for i in local]), background=True)
  early = tokens.copy()
  early[3, 0] = (early[3, 0] + 1) % 10
  scorer.rows_done(np.array([3]), early[3:4], lengths[3:4])
  with pytest.raises(RuntimeError, match="row 3: .* differ from the call's final"):
    scorer.finish(tokens, lengths)
  twice = StreamingScorer(range(12), detokenize, lambda local, t: mix(t, ["0"] * len(t)),
                          background=False)
  twice.rows_done(np.array([2]), tokens[2:3], lengths[2:3])
  with pytest.raises(RuntimeError, match="row 2 was delivered twice"):
    twice.rows_done(np.array([2]), tokens[2:3], lengths[2:3])


def test_a_failing_reward_on_the_worker_thread_is_raised_by_finish():
  tokens, lengths, _ = synthetic_round()

  def broken(local, texts):
    raise ZeroDivisionError("a bug in the reward")
  scorer = StreamingScorer(range(12), detokenize, broken, background=True)
  scorer.rows_done(np.arange(4), tokens[:4], lengths[:4])
  with pytest.raises(ZeroDivisionError, match="a bug in the reward"):
    scorer.finish(tokens, lengths)


def test_math_verify_in_process_asks_for_the_main_thread_and_in_a_pool_does_not():
  """An in-process math-verify keeps its signal.alarm timeouts only on the main
  thread, so the trainer must not move it to the scorer's worker thread."""
  assert RewardMix("math_verify", [], workers=0).needs_main_thread
  pooled = RewardMix("math_verify", [], workers=1)
  try:
    assert not pooled.needs_main_thread
  finally:
    pooled.close()
  assert not reward_mix().needs_main_thread


@pytest.mark.parametrize("background", [False, True], ids=["main-thread", "worker-thread"])
def test_scoring_a_real_refill_call_as_it_runs_gives_one_call_s_rewards(llama, background):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  refill = refill_sampler(llama.model, params)
  mix = reward_mix()
  answers = [str(i % 10) for i in range(16)]
  text = lambda tokens: detokenize(np.asarray(tokens) % 10)
  scorer = StreamingScorer(range(16), text,
                           lambda local, texts: mix(texts, [answers[i] for i in local]),
                           background=background, chunk_rows=3)
  batch = refill.generate(llama.model, random_prompts(4, 1, 12, seed=95), 4, seed=7,
                          listener=scorer)
  texts, got = scorer.finish(batch.response_tokens, batch.lengths)
  expected_texts = [text(batch.response_tokens[r, :batch.lengths[r]]) for r in range(16)]
  assert texts == expected_texts
  for field, want in zip(got, mix(expected_texts, answers)):
    np.testing.assert_array_equal(field, want)


def test_closing_without_draining_stops_the_worker_after_its_current_chunk():
  """What a failed sampler call does (``RLStep.sample_round``'s ``finally``): the rows
  still queued are dropped, not scored before the error surfaces."""
  tokens, lengths, answers = synthetic_round()
  mix = reward_mix()
  scored = []

  def slow(local, texts):
    time.sleep(0.05)
    scored.extend(local)
    return mix(texts, [answers[i] for i in local])
  scorer = StreamingScorer(range(12), detokenize, slow, background=True, chunk_rows=2)
  scorer.rows_done(np.arange(12), tokens, lengths)
  scorer.close()
  assert len(scored) <= 2, scored
