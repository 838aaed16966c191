"""The paged KV cache and the refill sampler.

Paged decode attention must equal dense attention over the same keys (a numpy
re-derivation), and the refill sampler (fewer slots than rows, a queue refilled from,
a pool small enough to evict) must sample the fused sampler's tokens: same tokens,
lengths and group stats, log-probs to float rounding. Pages never leak, and the
programs warm-up compiles serve every group size with zero compilations after it.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

from sagc_jax.models.paged_cache import SCRATCH_PAGE, PagedKVCache, paged_decode_attend
from sagc_jax.runtime import compilation
from sagc_jax.sampling import Sampler, SamplingParams
from sagc_jax.sampling.refill_schedule import PagePool
from test_sampler import fused_reference, random_prompts
from test_segmented import assert_same_samples

STOPS = tuple(range(3, 256, 3))     # a third of the vocabulary: lengths 1 .. the cap
N_NEW = 12


def numpy_attention(q, keys, values):
  """softmax(q k^T / sqrt(D)) v for one slot, grouped heads: q [H, D], keys [T, KV, D]."""
  h, d = q.shape
  kv = keys.shape[1]
  out = np.zeros((h, d))
  for head in range(h):
    k, v = keys[:, head // (h // kv)], values[:, head // (h // kv)]
    scores = k @ q[head] / np.sqrt(d)
    p = np.exp(scores - scores.max())
    out[head] = (p / p.sum()) @ v
  return out


def test_paged_decode_attention_equals_attention_over_the_slot_s_own_keys():
  rng = np.random.default_rng(0)
  kv_heads, heads, d, page, pages, slots = 2, 4, 8, 4, 12, 3
  k_pool = rng.normal(size=(kv_heads, pages, page, d)).astype(np.float32)
  v_pool = rng.normal(size=(kv_heads, pages, page, d)).astype(np.float32)
  # Slot 0: 5 prompt keys in pages 3, 7 then own keys in page 2; slot 1: an empty
  # prompt and own page 5; slot 2 is not running.
  table = np.array([[3, 7, 2, 0], [5, 0, 0, 0], [0, 0, 0, 0]], np.int32)
  prompt_len = np.array([5, 0, 0], np.int32)
  own_len = np.array([3, 2, 0], np.int32)
  alive = np.array([True, True, False])
  q = rng.normal(size=(slots, 1, heads, d)).astype(np.float32)
  k_new = rng.normal(size=(slots, 1, kv_heads, d)).astype(np.float32)
  v_new = rng.normal(size=(slots, 1, kv_heads, d)).astype(np.float32)
  lanes = (jnp.asarray(k_pool)[None], jnp.asarray(v_pool)[None])     # one lane
  cache = PagedKVCache(lanes[:1], lanes[1:], table, prompt_len, own_len)
  out, (k_out, v_out) = paged_decode_attend(
      jnp.asarray(q), jnp.asarray(k_new), jnp.asarray(v_new), lanes, cache,
      jnp.asarray(alive), heads // kv_heads)
  k_out, v_out = np.asarray(k_out)[0], np.asarray(v_out)[0]
  for s in range(2):
    logical = prompt_len[s] + own_len[s]
    page_of = lambda j, s=s: table[s, j // page]
    # The write landed at the slot's next logical index ...
    np.testing.assert_array_equal(k_out[:, page_of(logical), logical % page], k_new[s, 0])
    keys = np.stack([k_out[:, page_of(j), j % page] for j in range(logical + 1)])
    values = np.stack([v_out[:, page_of(j), j % page] for j in range(logical + 1)])
    # ... and the output is attention over keys 0 .. logical, nothing else.
    np.testing.assert_allclose(np.asarray(out)[s, 0], numpy_attention(q[s, 0], keys, values),
                               atol=1e-5)
  # The stopped slot wrote only to the scratch page; every other page is as it was.
  untouched = [p for p in range(pages) if p not in (SCRATCH_PAGE, 2, 5)]
  np.testing.assert_array_equal(k_out[:, untouched], k_pool[:, untouched])


def test_slot_views_attend_and_write_like_the_pages_they_were_gathered_from():
  """The XLA path decodes a segment on contiguous slot views (gathered once, scattered
  back after): same outputs and, after the scatter, the same pools as attending to the
  pages themselves."""
  from sagc_jax.models.paged_cache import (SlotKVCache, gather_slots, scatter_slots,
                                           slot_decode_attend)

  rng = np.random.default_rng(1)
  kv_heads, heads, d, page, pages = 2, 4, 8, 4, 12
  pools = tuple(jnp.asarray(rng.normal(size=(kv_heads, pages, page, d)), jnp.float32)
                for _ in range(2))
  table = jnp.asarray([[3, 7, 2], [5, 9, 0], [0, 0, 0]], jnp.int32)
  prompt_len, own_len = jnp.asarray([5, 0, 0]), jnp.asarray([3, 6, 0])
  alive = jnp.asarray([True, True, False])
  q = jnp.asarray(rng.normal(size=(3, 1, heads, d)), jnp.float32)
  k_new, v_new = (jnp.asarray(rng.normal(size=(3, 1, kv_heads, d)), jnp.float32)
                  for _ in range(2))
  lanes = tuple(p[None] for p in pools)                    # one lane
  paged_out, paged_pools = paged_decode_attend(
      q, k_new, v_new, lanes, PagedKVCache(lanes, lanes, table, prompt_len, own_len), alive,
      heads // kv_heads)
  paged_pools = tuple(p[0] for p in paged_pools)
  views = tuple(gather_slots(p, table) for p in pools)
  slot_out, views = slot_decode_attend(q, k_new, v_new, views,
                                       SlotKVCache(views, views, prompt_len, own_len), alive,
                                       heads // kv_heads)
  np.testing.assert_allclose(np.asarray(slot_out)[:2], np.asarray(paged_out)[:2], atol=1e-6)
  for pool, paged, view in zip(pools, paged_pools, views):
    back = np.asarray(scatter_slots(pool, table, view))
    used = [3, 7, 2, 5, 9]                          # every page but the scratch one
    np.testing.assert_array_equal(back[:, used], np.asarray(paged)[:, used])


def test_page_pool_refuses_double_frees_and_overdrafts():
  pool = PagePool(5)
  pages = pool.take(4)
  assert sorted(pages) == [1, 2, 3, 4] and pool.free == 0 and SCRATCH_PAGE not in pages
  with pytest.raises(RuntimeError, match="1 pages asked, 0 free"):
    pool.take(1)
  pool.give(pages[:2])
  with pytest.raises(RuntimeError, match="given back but not held"):
    pool.give(pages[:1])
  assert pool.held == 2 and pool.free == 2


def refill_sampler(model, params, **kwargs):
  kwargs = dict(dict(refill_slots=4, page_size=4, refill_segment=3), **kwargs)
  return Sampler(model, params, row_buckets=(16,), prompt_buckets=(12,), decode_segment=0,
                 group_sizes=(2, 4, 8), **kwargs)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_refill_samples_the_fused_tokens_with_4_slots_for_16_rows(llama, temperature, top_p):
  params = SamplingParams(N_NEW, temperature=temperature, top_p=top_p, stop_ids=STOPS)
  fused = fused_reference(llama.model, params)
  refill = refill_sampler(llama.model, params)
  for seed in range(3):
    prompts = random_prompts(4, 1, 12, seed=50 + seed)
    a = fused.generate(llama.model, prompts, group_size=4, seed=seed)
    b = refill.generate(llama.model, prompts, group_size=4, seed=seed)
    assert_same_samples(a, b)
    # 16 rows through 4 slots: the call ran longer than its longest row (rows waited
    # in the queue), and did less padded work than 16 rows x its longest row.
    assert b.decode_steps > a.decode_steps
    assert b.decode_slots < 16 * a.decode_steps


def test_a_pool_too_small_for_every_slot_evicts_and_still_samples_the_same_tokens(llama):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=(7, 11))   # long responses
  fused = fused_reference(llama.model, params)
  refill = refill_sampler(llama.model, params, kv_pages=8)   # 7 pages for 4 slots
  assert refill.refill.pages_per_row == 6
  prompts = random_prompts(4, 6, 12, seed=61)
  a = fused.generate(llama.model, prompts, group_size=4, seed=2)
  b = refill.generate(llama.model, prompts, group_size=4, seed=2)
  assert_same_samples(a, b)
  assert refill.refill.evictions > 0, "the pool never ran short: the test proves nothing"


def test_a_pool_that_cannot_hold_one_row_is_refused_naming_the_minimum(llama):
  params = SamplingParams(N_NEW, stop_ids=STOPS)
  with pytest.raises(ValueError, match=r"kv_pages=6: .* >= 7"):
    refill_sampler(llama.model, params, kv_pages=6)
  with pytest.raises(ValueError, match=r"refill_slots=-1"):
    refill_sampler(llama.model, params, refill_slots=-1)


def test_refill_compiles_nothing_after_warm_up_whatever_g(llama):
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=STOPS)
  refill = refill_sampler(llama.model, params)
  refill.warmup(llama.model)
  before = compilation.compile_count()
  for seed, g in enumerate((2, 8, 4, 2, 8)):
    prompts = random_prompts(16 // g, 1, 12, seed=70 + seed)
    batch = refill.generate(llama.model, prompts, group_size=g, seed=seed)
    assert batch.group_max.shape == (16 // g,)
  assert compilation.compile_count() == before


@pytest.fixture(scope="module", params=[(4, 2), (2, 4)], ids=["4x2", "2x4"])
def lanes_llama(llama, request):
  """(mesh, model): the llama weights on a (data, model) mesh of fake devices; at
  (2, 4) its 2 KV heads do not divide 'model' (the pools hold 2 copies of each)."""
  import jax

  from sagc_jax.models import from_pretrained
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  mesh = jax.make_mesh(request.param, ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  return mesh, from_pretrained(llama.folder, mesh=mesh)[0]


@pytest.mark.parametrize("kernel", ["xla", "reference"])
def test_refill_on_a_mesh_samples_the_single_device_fused_tokens(llama, lanes_llama, kernel):
  """4 lanes of 2 slots (one per 'data' shard, KV heads on 'model'), a pool small
  enough to evict: the tokens of one device's fused sampler, and the pools stay
  sharded as laid out (each lane on its own device row). ``"reference"`` runs the
  Pallas kernel's path (pools read in place, per device under ``shard_map``) with the
  kernel's contract in XLA."""
  import dataclasses

  mesh, sharded = lanes_llama
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=(7, 11, 13, 17))
  fused = fused_reference(llama.model, params)
  options = dataclasses.replace(fused.options, paged_kernel=kernel)
  refill = Sampler(sharded, params, row_buckets=(16,), prompt_buckets=(12,), decode_segment=0,
                   group_sizes=(4,), mesh=mesh, refill_slots=8, page_size=4,
                   refill_segment=3, kv_pages=10, options=options)
  lanes = mesh.shape["data"]
  assert refill.refill.lanes == lanes and refill.refill.slots_per_lane == 8 // lanes
  assert refill.refill.kv_repeats == max(mesh.shape["model"] // llama.cfg.num_kv_heads, 1)
  for seed in range(2):
    prompts = random_prompts(4, 4, 12, seed=80 + seed)
    a = fused.generate(llama.model, prompts, group_size=4, seed=seed)
    b = refill.generate(sharded, prompts, group_size=4, seed=seed)
    assert_same_samples(a, b)
  assert refill.refill.evictions > 0, "no lane's pool ran short: the test proves less"
  pool = refill.refill._pools[0][0]
  assert pool.shape[0] == lanes and pool.sharding.spec[:2] == ("data", "model")
  # Every gather and scatter of the pages is local: the segment program's collectives
  # move only per-slot activations, never a pool ([.., pages, page, D]) or a slot view
  # ([.., W * page, D]).
  from flax import nnx
  keys = sorted(k for k in refill.refill.executable_keys(16)
                if k[0] == "segment" and k in refill.refill.programs)
  text = refill.refill.programs.get(keys[-1], nnx.state(sharded)).as_text()
  collectives = re.findall(r"= \w+\[([\d,]*)\][^ ]* (?:all-gather|all-reduce|all-to-all|"
                           r"collective-permute|reduce-scatter)\(", text)
  assert collectives, "no collective at all: the model is not split over 'model'"
  d, pages = llama.cfg.head_dim, refill.refill.num_pages
  views = {(w * 4, d) for w in refill.refill.page_buckets()}
  shapes = [tuple(int(x) for x in c.split(",")) for c in collectives if c]
  cache_like = [x for x in shapes if (len(x) == 5 and x[-3:] == (pages, 4, d))
                or (len(x) == 4 and x[-2:] in views)]
  assert not cache_like, cache_like


def test_refill_slots_must_split_over_the_data_axis(llama, lanes_llama):
  mesh, sharded = lanes_llama
  data = mesh.shape["data"]
  with pytest.raises(ValueError, match=rf"refill_slots={data + 1} must be a multiple of the "
                     rf"mesh's 'data' axis \({data}\)"):
    Sampler(sharded, SamplingParams(N_NEW, stop_ids=STOPS), row_buckets=(16,),
            prompt_buckets=(12,), mesh=mesh, refill_slots=data + 1)


def test_the_schedule_simulated_on_the_real_lengths_runs_the_real_call_s_steps(llama):
  """``simulate_refill`` (the AOT tool's rollout projection) runs the decoder's own
  host policy on drawn lengths: given a real call's lengths it must reproduce that
  call's decode steps and evictions exactly."""
  from sagc_jax.sampling.refill_schedule import simulate_refill

  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=(7, 11, 13))
  refill = refill_sampler(llama.model, params, kv_pages=9)
  prompts = random_prompts(4, 3, 12, seed=91)
  before = refill.refill.evictions
  batch = refill.generate(llama.model, prompts, group_size=4, seed=5)
  decoder = refill.refill
  sim = simulate_refill([len(p) for p in prompts], batch.lengths[:16].reshape(4, 4),
                        lanes=1, slots_per_lane=4, num_pages=decoder.num_pages,
                        page_size=4, segment=3, max_new_tokens=N_NEW)
  assert sim["decode_steps"] == batch.decode_steps
  assert sim["evictions"] == decoder.evictions - before > 0


@pytest.mark.parametrize("mesh_shape", [(2, 4), (4, 2)])
def test_the_kernel_path_on_a_mesh_attends_like_the_gather_path_on_one_device(mesh_shape):
  """``kernel="reference"`` (the Pallas kernel's contract in XLA) under the kernel's
  ``shard_map``: lanes on 'data', heads on 'model'; at (2, 4) the 2 KV heads do not
  divide the 4-way axis, so the pools hold 2 copies of each (``kv_repeats``) and each
  device the one copy its query head reads."""
  import jax

  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  mesh = jax.make_mesh(mesh_shape, ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rng = np.random.default_rng(2)
  lanes, per_lane, kv_heads, heads, d, page, pages, width = mesh_shape[0], 2, 2, 4, 8, 4, 9, 3
  slots = lanes * per_lane
  pools = tuple(jnp.asarray(rng.normal(size=(lanes, kv_heads, pages, page, d)), jnp.float32)
                for _ in range(2))
  table = jnp.asarray(rng.integers(1, pages, (slots, width)), jnp.int32)   # lane-local ids
  prompt_len = jnp.asarray(rng.integers(0, 5, slots), jnp.int32)
  own_len = jnp.asarray(rng.integers(0, 6, slots), jnp.int32)
  alive = jnp.asarray(rng.random(slots) < 0.8)
  q = jnp.asarray(rng.normal(size=(slots, 1, heads, d)), jnp.float32)
  k_new, v_new = (jnp.asarray(rng.normal(size=(slots, 1, kv_heads, d)), jnp.float32)
                  for _ in range(2))
  cache = PagedKVCache(pools, pools, table, prompt_len, own_len)
  want, want_pools = paged_decode_attend(q, k_new, v_new, pools, cache, alive,
                                         heads // kv_heads, kernel="xla")
  repeats = mesh_shape[1] // kv_heads if mesh_shape[1] > kv_heads else 1
  copies = tuple(jnp.repeat(p, repeats, axis=1) for p in pools)
  got, got_pools = jax.jit(lambda *a: paged_decode_attend(
      *a, heads // kv_heads, kernel="reference", mesh=mesh))(
          q, k_new, v_new, copies, PagedKVCache(copies, copies, table, prompt_len, own_len),
          alive)
  live = np.asarray(alive)
  np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live], atol=1e-5)
  for a, b in zip(got_pools, want_pools):
    np.testing.assert_array_equal(np.asarray(a), np.repeat(np.asarray(b), repeats, axis=1))
