"""The segmented sampler (shared prefill, span buckets, live-row compaction) samples the
fused sampler's tokens, and its cost follows the work (XLA cost analysis, decode slots)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from sagc_jax.sampling import Sampler, SamplingParams
from test_sampler import fused_reference, random_prompts

# A third of the vocabulary stops a response: lengths spread from 1 to the cap, so
# rows finish at different segments and compaction moves the survivors several times.
STOPS = tuple(range(3, 256, 3))
N_NEW = 12


def pair(model, params, mesh=None, **kwargs):
  fused = fused_reference(model, params)
  segmented = Sampler(model, params, row_buckets=(16,), prompt_buckets=(12,), mesh=mesh,
                      decode_segment=3, min_compact_rows=1 if mesh is None else 2,
                      group_sizes=(4,), **kwargs)
  return fused, segmented


def assert_same_samples(a, b):
  np.testing.assert_array_equal(a.response_tokens, b.response_tokens)
  np.testing.assert_array_equal(a.lengths, b.lengths)
  np.testing.assert_allclose(a.response_logprobs, b.response_logprobs, atol=2e-5)
  np.testing.assert_array_equal(a.group_max, b.group_max)
  np.testing.assert_array_equal(a.group_median, b.group_median)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_segmented_samples_the_fused_tokens_across_compactions(llama, temperature, top_p):
  params = SamplingParams(N_NEW, temperature=temperature, top_p=top_p, stop_ids=STOPS)
  fused, segmented = pair(llama.model, params)
  compacted = 0
  for seed in range(4):
    prompts = random_prompts(4, 3, 12, seed=20 + seed)
    a = fused.generate(llama.model, prompts, group_size=4, seed=seed)
    b = segmented.generate(llama.model, prompts, group_size=4, seed=seed)
    assert_same_samples(a, b)
    assert b.decode_steps == a.decode_steps
    assert b.decode_slots <= a.decode_slots == 16 * a.decode_steps
    compacted += b.decode_slots < a.decode_slots
  assert compacted >= 2, "the lengths never let compaction run: the test would prove nothing"
  # The in-jit host callback delivered the same stats (assert_same_samples compares
  # group_max / group_median, which generate takes from the sink).


def test_segmented_on_8_devices_samples_the_single_device_fused_tokens(llama, sharded_llama):
  mesh, sharded = sharded_llama
  params = SamplingParams(N_NEW, temperature=1.0, top_p=0.9, stop_ids=STOPS)
  fused, _ = pair(llama.model, params)
  _, segmented = pair(sharded, params, mesh=mesh)
  prompts = random_prompts(4, 3, 12, seed=31)
  a = fused.generate(llama.model, prompts, group_size=4, seed=5)
  b = segmented.generate(sharded, prompts, group_size=4, seed=5)
  assert_same_samples(a, b)
  assert b.decode_slots < a.decode_slots


def test_compaction_off_keeps_every_row_and_the_same_tokens(llama):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  fused, _ = pair(llama.model, params)
  _, plain = pair(llama.model, params, compaction=False)
  prompts = random_prompts(4, 3, 12, seed=40)
  a = fused.generate(llama.model, prompts, group_size=4, seed=3)
  b = plain.generate(llama.model, prompts, group_size=4, seed=3)
  assert_same_samples(a, b)
  assert b.decode_slots == a.decode_slots
  assert plain.segmented.row_ladder(16) == (16,)


def cost(executable, key):
  analysis = executable.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  return float(analysis[key])


@pytest.mark.libtpu
def test_decode_cost_grows_with_the_span_and_prefill_with_the_prompts(llama):
  """Structural, on the chip it is for: the segment and prefill programs compiled for an
  abstract TPU v5e:2x2 (libtpu, no TPU needed), read through XLA's cost analysis."""
  from flax import nnx

  from sagc_jax.aot.compile_report import topology_mesh
  from sagc_jax.models.transformer import abstract_model

  mesh, _ = topology_mesh("v5e:2x2", (-1, 1), ("data", "model"))
  model = abstract_model(llama.cfg, jax.numpy.bfloat16, mesh=mesh)
  # Spans are multiples of 128: the TPU tiles a cache's slot axis in 128s.
  params = SamplingParams(512, temperature=1.0, stop_ids=STOPS)
  sampler = Sampler(model, params, row_buckets=(16,), prompt_buckets=(128,), mesh=mesh,
                    decode_segment=128, group_sizes=(1, 8))
  seg, state = sampler.segmented, nnx.state(model)
  spans = seg.spans(128)
  assert spans == (256, 384, 512, 640)
  # A segment's loop body is counted once: the bytes of one decode step, which reads
  # only the filled span of the cache, plus the one copy that grows the cache to it.
  step_bytes = [cost(seg.compile(("segment", 16, 128, s), state), "bytes accessed")
                for s in spans]
  assert all(a < b for a, b in zip(step_bytes, step_bytes[1:])), step_bytes
  # Prefill once per prompt: G = 8 prefills 4 prompt rows (2 prompts, whole over the
  # 4-way 'data' axis), G = 1 all 16 rows.
  start = lambda g: seg.compile(("start", seg.prompt_rows(16, g), 16, 128), state)
  shared, every_row = cost(start(8), "flops"), cost(start(1), "flops")
  assert seg.prompt_rows(16, 8) == 4 and every_row > 3 * shared, (every_row, shared)


def test_decode_loops_update_the_cache_in_place_on_cpu(llama):
  """XLA:CPU keeps the one-slot cache write in place only when the step attends to the
  written cache (``decode_cache_read="after_write"``, which the sampler picks on CPU).
  Attending to the cache before the write (TPU's choice) made it copy every layer's
  cache twice per step: 16 whole-cache copies in the tiny model's loop body, 29% of a
  64-row decode's time. The compiled programs must hold no copy of a cache leaf."""
  import re

  from flax import nnx

  from sagc_jax.models.transformer import ForwardOptions

  def cache_copies(compiled, shape):
    text = compiled.as_text()
    dims = ",".join(map(str, shape))
    return len(re.findall(rf"= \w+\[{dims}\]\{{[0-9,]*\}} copy\(", text))

  cfg, state = llama.cfg, nnx.state(llama.model)
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  leaf = lambda rows, slots: (rows, cfg.num_kv_heads, slots, cfg.head_dim)
  fused, segmented = pair(llama.model, params)
  assert segmented.options.decode_cache_read == "after_write"
  seg = segmented.segmented
  span = seg.spans(12)[1]
  assert cache_copies(seg.compile(("segment", 16, 12, span), state), leaf(16, span)) == 0
  assert cache_copies(fused.compile(llama.model, 16, 12), leaf(16, 12 + N_NEW)) == 0
  # The other read order does copy on this backend (what the choice is about).
  before = Sampler(llama.model, params, row_buckets=(16,), prompt_buckets=(12,),
                   decode_segment=0, options=ForwardOptions(
                       attention="blocked", decode_attention="einsum",
                       decode_cache_read="before_write"))
  assert cache_copies(before.compile(llama.model, 16, 12), leaf(16, 12 + N_NEW)) > 0


def test_groups_of_different_sizes_in_one_call(llama):
  """``generate(group_sizes=...)`` (controller.kind="per_prompt"): prompt i gets its own
  number of consecutive rows. The segmented sampler (shared prefill from group ids)
  samples the fused sampler's tokens; (greedy) rows equal the uniform call's rows of
  the same prompt; the per-group stats are numpy's max / median over each group's rows;
  nothing compiles beyond the uniform calls' programs."""
  from sagc_jax.runtime import compilation

  params = SamplingParams(N_NEW, temperature=0.0, stop_ids=STOPS)
  fused, segmented = pair(llama.model, params)
  prompts = random_prompts(4, 3, 12, seed=50)
  uniform = fused.generate(llama.model, prompts, group_size=4, seed=7)
  segmented.warmup(llama.model)          # every program of the uniform G = 4 calls
  compilation.install()
  before = compilation.compile_count()
  sizes = [2, 6, 1, 5]
  a = fused.generate(llama.model, prompts, group_size=4, seed=7, group_sizes=sizes)
  b = segmented.generate(llama.model, prompts, group_size=4, seed=7, group_sizes=sizes)
  assert compilation.compile_count() == before
  assert_same_samples(a, b)
  assert a.num_rows == 14 and a.row_valid.sum() == 14
  owner = np.repeat(np.arange(4), sizes)
  np.testing.assert_array_equal(a.group_ids[:14], owner)
  for g in range(4):
    lengths = a.lengths[:14][owner == g]
    assert a.group_max[g] == lengths.max() and a.group_median[g] == np.median(lengths)
  for row, g in enumerate(owner):
    np.testing.assert_array_equal(a.response_tokens[row], uniform.response_tokens[4 * g])


def test_group_sizes_are_refused_where_one_size_per_call_is_needed(llama):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  fused, _ = pair(llama.model, params)
  prompts = random_prompts(4, 3, 12, seed=51)
  with pytest.raises(ValueError, match="group_sizes must be 4 positive ints"):
    fused.generate(llama.model, prompts, group_size=4, seed=0, group_sizes=[2, 2, 0, 4])
  split = Sampler(llama.model, params, row_buckets=(16,), prompt_buckets=(12,),
                  decode_segment=0, max_rows_per_call=8)
  with pytest.raises(ValueError, match="needs one fused or segmented sampler call"):
    split.generate(llama.model, prompts, group_size=4, seed=0, group_sizes=[2, 6, 4, 4])
