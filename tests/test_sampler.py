"""Jitted sampler vs transformers (greedy generate, forward log-probs), sampling
statistics, stop handling, host-callback stats, sharding and compile counts."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

import hf_fixtures as hf
from sagc_jax.runtime import compilation
from sagc_jax.sampling import Sampler, SamplingParams, row_buckets_for
from sagc_jax.sampling.group_stats import LengthStatsSink

torch = pytest.importorskip("torch")

PAD = 0
# Several decode segments per call (the default, auto_segment, is >= 32 tokens): the
# segmented sampler's segment boundaries are inside every comparison below.
SEGMENT = 8


_FUSED_REFERENCES: dict = {}


def fused_reference(model, params):
  """The fused sampler (16 rows, prompts up to 12 tokens) that the segmented, refill and
  sub-call samplers are compared with, one per (model, params) in a process, so the
  tests that compare against the same settings share its programs (its stats programs
  carry the host callback, which the persistent compilation cache cannot serve)."""
  key = (id(model), params)
  if key not in _FUSED_REFERENCES:
    _FUSED_REFERENCES[key] = Sampler(model, params, row_buckets=(16,), prompt_buckets=(12,),
                                     decode_segment=0)
  return _FUSED_REFERENCES[key]


def random_prompts(n, low, high, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.integers(4, 256, rng.integers(low, high + 1)).tolist() for _ in range(n)]


def left_pad(prompts, length):
  ids = np.full((len(prompts), length), PAD, np.int64)
  mask = np.zeros((len(prompts), length), np.int64)
  for i, p in enumerate(prompts):
    ids[i, length - len(p):] = p
    mask[i, length - len(p):] = 1
  return ids, mask


def hf_greedy(torch_model, prompts, max_new, eos):
  """transformers' greedy generate on left-padded prompts -> new tokens [P, max_new]."""
  length = max(len(p) for p in prompts)
  ids, mask = left_pad(prompts, length)
  with torch.no_grad():
    out = torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                               max_new_tokens=max_new, min_new_tokens=0, do_sample=False,
                               eos_token_id=eos, pad_token_id=PAD)
  new = out[:, length:].numpy()
  return np.pad(new, ((0, 0), (0, max_new - new.shape[1])), constant_values=PAD)


def first_stop_length(tokens, stop_ids, max_new):
  hits = [t for t, tok in enumerate(tokens) if tok in stop_ids]
  return hits[0] + 1 if hits else max_new


@pytest.mark.parametrize("case", ["llama", "qwen2"])
def test_greedy_matches_transformers_generate(case, request):
  ref = request.getfixturevalue(case)
  prompts = random_prompts(4, 3, 14, seed=1)
  max_new = 24
  # Choose an EOS that the greedy continuation of prompt 0 emits mid-way, so the
  # comparison covers both stopped and full-length rows.
  free_run = hf_greedy(ref.torch, prompts, max_new, eos=None)
  eos = int(free_run[0, 9])
  expected = hf_greedy(ref.torch, prompts, max_new, eos=eos)
  sampler = Sampler(ref.model, SamplingParams(max_new, temperature=0.0, stop_ids=(eos,)),
                    row_buckets=(8,), prompt_buckets=(16,), decode_segment=SEGMENT)
  batch = sampler.generate(ref.model, prompts, group_size=2, seed=0)
  matches = 0
  for row in range(8):
    length = first_stop_length(expected[row // 2].tolist(), {eos}, max_new)
    assert batch.lengths[row] == length
    matches += np.array_equal(batch.response_tokens[row, :length], expected[row // 2, :length])
    assert np.all(batch.response_tokens[row, length:] == PAD)
  assert matches == 8, f"greedy_match={matches / 8}"
  assert batch.lengths[0] <= 10 and batch.lengths.max() == max_new


def test_stop_ids_and_lengths(llama):
  prompts = random_prompts(3, 4, 10, seed=2)
  max_new = 20
  free_run = hf_greedy(llama.torch, prompts, max_new, eos=None)
  stop_ids = {int(free_run[0, 4]), int(free_run[1, 12])}
  params = SamplingParams(max_new, temperature=0.0, stop_ids=tuple(stop_ids), pad_id=PAD)
  sampler = Sampler(llama.model, params, row_buckets=(4,), prompt_buckets=(16,),
                    decode_segment=SEGMENT)
  batch = sampler.generate(llama.model, prompts, group_size=1, seed=0)
  for row in range(3):
    length = first_stop_length(free_run[row].tolist(), stop_ids, max_new)
    assert batch.lengths[row] == length
    assert batch.response_tokens[row, length - 1] in stop_ids or length == max_new
    np.testing.assert_array_equal(batch.response_mask[row], np.arange(max_new) < length)
    assert np.all(batch.response_logprobs[row, length:] == 0)
    assert np.all(batch.response_logprobs[row, :length] < 0)
  assert batch.lengths[0] <= 5 and batch.lengths[1] <= 13
  assert not batch.row_valid[3] and batch.lengths[3] == 0


def test_logprobs_equal_forward_log_softmax(llama):
  prompts = random_prompts(3, 5, 12, seed=3)
  temperature, max_new = 0.8, 16
  params = SamplingParams(max_new, temperature=temperature, top_k=50, top_p=0.95,
                          stop_ids=(7,))
  sampler = Sampler(llama.model, params, row_buckets=(6,), prompt_buckets=(12,),
                    decode_segment=SEGMENT)
  batch = sampler.generate(llama.model, prompts, group_size=2, seed=4)
  ids = np.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
  mask = np.concatenate([batch.prompt_mask, batch.response_mask], axis=1)
  logits = hf.hf_logits(llama.torch, ids, mask.astype(np.int64)) / temperature
  logp = logits - scipy.special.logsumexp(logits, axis=-1, keepdims=True)
  prompt_len = batch.prompt_tokens.shape[1]
  for row in range(6):
    for t in range(batch.lengths[row]):
      expected = logp[row, prompt_len - 1 + t, batch.response_tokens[row, t]]
      assert batch.response_logprobs[row, t] == pytest.approx(expected, abs=1e-4)


def expected_distribution(logits, temperature, top_k, top_p):
  """numpy: softmax(logits / T) restricted to top-k, then to the top-p nucleus."""
  z = logits / temperature
  p = np.exp(z - z.max())
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  keep = np.ones_like(p, bool)
  if top_k:
    keep[order[top_k:]] = False
  q = np.where(keep, p, 0.0)
  q /= q.sum()
  if top_p < 1:
    mass_before = np.cumsum(q[order]) - q[order]
    drop = order[mass_before >= top_p]
    q[drop] = 0.0
    q /= q.sum()
  return q


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.3, 12, 1.0),
                                                      (1.0, 0, 0.6)])
def test_sampled_tokens_follow_the_filtered_distribution(llama, temperature, top_k, top_p):
  prompt = random_prompts(1, 6, 6, seed=5)[0]
  rows = 4096
  params = SamplingParams(1, temperature=temperature, top_k=top_k, top_p=top_p, stop_ids=(1,))
  sampler = Sampler(llama.model, params, row_buckets=(rows,), prompt_buckets=(8,))
  batch = sampler.generate(llama.model, [prompt], group_size=rows, seed=6)
  ids, mask = left_pad([prompt], 8)
  logits = hf.hf_logits(llama.torch, ids, mask)[0, -1].astype(np.float64)
  q = expected_distribution(logits, temperature, top_k, top_p)
  counts = np.bincount(batch.response_tokens[:, 0], minlength=q.size)
  assert counts[q == 0].sum() == 0, "sampled a token outside the top-k/top-p support"
  if top_k:
    assert (q > 0).sum() == top_k
  # Chi-square goodness of fit, pooling categories with expected count < 5.
  expected = q * rows
  big = expected >= 5
  f_obs = np.append(counts[big], counts[~big].sum())
  f_exp = np.append(expected[big], expected[~big].sum())
  if f_exp[-1] == 0:
    f_obs, f_exp = f_obs[:-1], f_exp[:-1]
  assert big.sum() >= 4                                  # a non-degenerate distribution
  assert scipy.stats.chisquare(f_obs, f_exp).pvalue > 1e-3


@pytest.mark.parametrize("segment", [0, SEGMENT], ids=["fused", "segmented"])
def test_callback_stats_equal_numpy_and_padding_rows_never_leak(llama, segment):
  prompts = random_prompts(3, 4, 9, seed=7)
  params = SamplingParams(24, temperature=1.5, stop_ids=tuple(range(4, 40)))
  delivered = []

  class SpySink(LengthStatsSink):            # records what the host callback delivers
    def __call__(self, *stats):
      delivered.append(stats)
      super().__call__(*stats)
  sampler = Sampler(llama.model, params, row_buckets=(16,), prompt_buckets=(12,),
                    decode_segment=segment, sink=SpySink())
  # Groups of 5: an odd size, whose median is its middle row alone.
  batch = sampler.generate(llama.model, prompts, group_size=5, seed=8)
  assert len(delivered) == 1                              # one host callback per call
  gmax, gmed = batch.group_max, batch.group_median        # what it delivered, for this call
  assert batch.row_valid.sum() == 15 and not batch.row_valid[15:].any()
  assert np.all(batch.lengths[15:] == 0) and np.all(batch.response_tokens[15:] == PAD)
  lengths = batch.lengths[:15].reshape(3, 5)
  assert len(np.unique(lengths)) > 2                     # varied lengths, a real check
  np.testing.assert_array_equal(gmax, lengths.max(axis=1))
  np.testing.assert_array_equal(gmed, np.median(lengths, axis=1))
  count = np.asarray(delivered[0][2])
  np.testing.assert_array_equal(np.asarray(delivered[0][0])[count > 0], gmax)
  assert sampler.sink.pop()[0].size == 0                  # generate drained the sink


@pytest.mark.parametrize("segment", [0, 2], ids=["fused", "segmented"])
def test_zero_compilations_after_warmup_across_random_group_sizes(llama, segment):
  candidates = (2, 4, 8)
  buckets = row_buckets_for(candidates, lambda g: 2)
  assert buckets == (4, 8, 16)
  params = SamplingParams(6, temperature=1.0, stop_ids=tuple(range(3, 256, 3)))
  # The segmented sampler compiles ~30 programs per prompt bucket: one bucket keeps
  # this test short (the fused case covers two).
  prompt_buckets = (16,) if segment else (8, 16)
  sampler = Sampler(llama.model, params, row_buckets=buckets, prompt_buckets=prompt_buckets,
                    decode_segment=segment, min_compact_rows=1, group_sizes=candidates,
                    prompts_for=lambda g: 2)
  # Two prompts per call: each row bucket serves one group size.
  assert [sampler.group_sizes_for(r) for r in buckets] == [(2,), (4,), (8,)]
  if segment:
    # Per (rows, prompt bucket): a shared prefill for the group size served, a
    # segment per (ladder rows, span), a compaction per (ladder pair, span but the
    # last), the stats program.
    seg = sampler.segmented
    assert seg.row_ladder(16) == (16, 4, 1) and seg.spans(16) == (18, 20, 22)
    expected = len(set().union(*(seg.executable_keys(r, 16, sampler.group_sizes_for(r))
                                 for r in buckets)))
    # Ladders (4, 1), (8, 2), (16, 4, 1): 5 row counts x 3 spans, 4 compactions x 2.
    assert expected == 3 + 5 * 3 + 4 * 2 + 3
  else:
    expected = 3 * 2 + 3          # generate per (rows, prompt bucket), stats per rows
  assert sampler.warmup(llama.model) == expected
  before_total = compilation.compile_count()
  rng = np.random.default_rng(9)
  slots, full = 0, 0
  for step in range(20):
    g = int(rng.choice(candidates))
    prompts = random_prompts(2, 2, 16, seed=100 + step)
    batch = sampler.generate(llama.model, prompts, group_size=g, seed=step)
    assert batch.response_tokens.shape[0] == 2 * g
    slots += batch.decode_slots
    full += 2 * g * batch.decode_steps
  assert compilation.compile_count() == before_total
  assert sampler.num_executables == expected
  assert (slots < full) if segment else (slots == full)   # compaction dropped done rows


def test_hold_rollouts_group_sizes_share_one_bucket():
  assert row_buckets_for((4, 8, 16), lambda g: 64 // g) == (64,)
  assert row_buckets_for((4, 8), {4: 3, 8: 3}.__getitem__, multiple_of=8) == (16, 24)


def test_sharded_matches_unsharded(llama, sharded_llama):
  mesh, sharded_model = sharded_llama
  params = SamplingParams(12, temperature=1.0, top_p=0.9, stop_ids=(5, 6, 7))
  prompts = random_prompts(4, 3, 10, seed=10)
  single = Sampler(llama.model, params, row_buckets=(8,), prompt_buckets=(12,))
  multi = Sampler(sharded_model, params, row_buckets=(8,), prompt_buckets=(12,), mesh=mesh)
  a = single.generate(llama.model, prompts, group_size=2, seed=11)
  b = multi.generate(sharded_model, prompts, group_size=2, seed=11)
  np.testing.assert_array_equal(a.response_tokens, b.response_tokens)
  np.testing.assert_array_equal(a.lengths, b.lengths)
  np.testing.assert_allclose(a.response_logprobs, b.response_logprobs, atol=1e-5)
  np.testing.assert_array_equal(a.group_max, b.group_max)
  kernel = sharded_model.layers[0].self_attn.q_proj.kernel[...]
  assert len(kernel.sharding.device_set) == 8


def test_bad_inputs_are_refused(llama):
  params = SamplingParams(4, temperature=0.0, stop_ids=(3,))
  sampler = Sampler(llama.model, params, row_buckets=(4,), prompt_buckets=(8,))
  with pytest.raises(ValueError, match="prompt length=9 exceeds the largest bucket 8"):
    sampler.generate(llama.model, [[5] * 9], group_size=1, seed=0)
  with pytest.raises(ValueError, match="rows .* exceeds the largest bucket 4"):
    sampler.generate(llama.model, [[5], [6]], group_size=4, seed=0)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    sampler.generate(llama.model, [[5], []], group_size=1, seed=0)
  for kwargs, match in [(dict(max_new_tokens=0), "max_new_tokens"),
                        (dict(max_new_tokens=4, temperature=-1.0), "temperature"),
                        (dict(max_new_tokens=4, top_p=0.0), "top_p"),
                        (dict(max_new_tokens=4, top_k=-2), "top_k")]:
    with pytest.raises(ValueError, match=match):
      SamplingParams(**{"stop_ids": (2,), **kwargs})
  with pytest.raises(ValueError, match="stop_ids"):
    SamplingParams(4)
