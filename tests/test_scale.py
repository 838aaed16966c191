"""The memory / compile machinery computes exactly what the plain code computes.

Remat, scan over layers, query-blocked and splash attention, chunked log-probs, FSDP and float32
master weights each change how the learner runs, never its result: losses, gradients
and updates must equal the plain path to 1e-5 in float32. The sampler's bf16-friendly
decode attention, blocked prefill and row-sharded cache layout must give identical
tokens. References are the plain dense forward with full logits and
``losses.token_logprobs`` (an independent path: no chunking, no blocks, no scan).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sagc_jax.runtime import compilation
from sagc_jax.models import init_model, tiny_config
from sagc_jax.models.transformer import ForwardOptions
from sagc_jax.rl import losses
from sagc_jax.rl.chunked_logprobs import chunked_logprobs_entropy
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.learner import Learner
from sagc_jax.training.build import rollout_batch
from sagc_jax.sampling import Sampler, SamplingParams

PROMPT, N_NEW = 8, 12


def small_config(family="llama"):
  return dataclasses.replace(tiny_config(family), hidden_size=64, intermediate_size=128,
                             num_layers=3, head_dim=16)


def _batch(seed=0, rows=4, t=24):
  """Left-padded token rows (pads at the start of each row)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, 60, (rows, t)).astype(np.int32)
  mask = np.ones((rows, t), bool)
  for r in range(rows):
    mask[r, :rng.integers(0, 6)] = False
  return jnp.asarray(ids), jnp.asarray(mask)


def _reference_logprob_sum(params, graphdef, ids, mask):
  """Sum of next-token log-probs over real targets: dense, unchunked, unrolled."""
  model = nnx.merge(graphdef, params)
  logits = model(ids, attention_mask=mask)
  logp = losses.token_logprobs(logits[:, :-1], ids[:, 1:])
  return jnp.sum(jnp.where(mask[:, 1:] & mask[:, :-1], logp, 0.0))


def _options_logprob_sum(params, graphdef, ids, mask, options, chunk):
  model = nnx.merge(graphdef, params)
  hidden, _ = model.hidden_states(ids, attention_mask=mask, options=options)
  weight, transposed = model.head_weight()
  logp, _ = chunked_logprobs_entropy(hidden[:, :-1], weight, transposed, ids[:, 1:],
                                     chunk=chunk)
  # Only real positions predicting real tokens: a pad position's output is meaningless.
  return jnp.sum(jnp.where(mask[:, 1:] & mask[:, :-1], logp, 0.0))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("options, chunk", [
    (ForwardOptions(remat="full"), 512),
    (ForwardOptions(remat="dots_saveable", scan_layers=True), 512),
    (ForwardOptions(attention="blocked", attention_block=8), 512),
    (ForwardOptions(), 5),                       # 23 positions in chunks of 5 (padded)
    (ForwardOptions(attention="blocked", attention_block=7, remat="full", scan_layers=True), 4),
])
def test_forward_options_give_the_plain_loss_and_gradients(family, options, chunk):
  model = init_model(small_config(family), seed=1, init_std=0.1)
  graphdef, params = nnx.split(model)
  ids, mask = _batch()
  ref_val, ref_grad = jax.jit(jax.value_and_grad(_reference_logprob_sum), static_argnums=(1,))(
      params, graphdef, ids, mask)
  val, grad = jax.jit(jax.value_and_grad(_options_logprob_sum), static_argnums=(1, 4, 5))(
      params, graphdef, ids, mask, options, chunk)
  np.testing.assert_allclose(val, ref_val, rtol=1e-5)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(ref_grad))
  for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad)):
    np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=1e-4)


def test_chunked_entropy_equals_full_entropy():
  rng = np.random.default_rng(3)
  hidden = jnp.asarray(rng.normal(size=(3, 11, 16)), jnp.float32)
  weight = jnp.asarray(rng.normal(size=(16, 40)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 40, (3, 11)))
  logp, ent = chunked_logprobs_entropy(hidden, weight, False, targets, temperature=0.7, chunk=4)
  full = hidden @ weight / 0.7
  logsm = full - jax.scipy.special.logsumexp(full, axis=-1, keepdims=True)
  np.testing.assert_allclose(logp, np.take_along_axis(logsm, targets[..., None], -1)[..., 0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ent, -(np.exp(logsm) * logsm).sum(-1), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- learner
@pytest.fixture(scope="module")
def rollouts():
  model = init_model(small_config(), seed=0, init_std=0.1)
  sampler = Sampler(model, SamplingParams(N_NEW, temperature=1.0, stop_ids=(2,)),
                    row_buckets=(16,), prompt_buckets=(PROMPT,))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(5, 60, rng.integers(3, 9)).tolist() for _ in range(4)]
  batch = sampler.generate(model, prompts, 4, seed=0)
  scores = (batch.response_tokens[:16] % 3 == 0).sum(1) + rng.normal(0, 0.5, 16)
  return rollout_batch(batch, scores)


def _mesh(shape=(2, 4)):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  return jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _params(model):
  return jax.tree.map(np.asarray, nnx.state(model, nnx.Param))


@pytest.mark.parametrize("attention", ["blocked", "splash"])
def test_memory_knobs_and_fsdp_give_the_plain_update(rollouts, attention):
  """Same rollouts, same seed: plain single-device learner vs remat + scan + blocked
  (or splash: the Pallas kernel, interpreted on CPU, inside shard_map) attention +
  chunked log-probs + FSDP on a (2, 4) mesh with 2 microbatches."""
  mesh = _mesh()
  base = dict(lr=1.0, eps=1.0, mini_batches=2, grad_accum=2, max_grad_norm=1e6)
  plain_model = init_model(small_config(), seed=0, init_std=0.1)
  plain = Learner(plain_model, LearnerConfig.grpo(**base), (16,), (PROMPT,), (N_NEW,))
  plain_metrics = plain.update(rollouts, seed=3)
  knobs = LearnerConfig.grpo(**base, remat="full", scan_layers=True, attention=attention,
                             attention_block=8, logits_chunk=5, fsdp=True)
  model = init_model(small_config(), seed=0, init_std=0.1, mesh=mesh)
  learner = Learner(model, knobs, (16,), (PROMPT,), (N_NEW,), mesh=mesh)
  # FSDP: the master weights (and both Adam moments, exactly like them) are split
  # over 'data' as well as 'model'; the model keeps its tensor-parallel layout.
  up = learner.params["layers"][0]["mlp"]["up_proj"]["kernel"]
  assert up.sharding.spec == jax.sharding.PartitionSpec("data", "model")
  assert model.layers[0].mlp.up_proj.kernel[...].sharding.spec == \
      jax.sharding.PartitionSpec(None, "model")
  adam = learner.opt_state[1][0]
  for moments in (adam.mu, adam.nu):
    for m, p in zip(jax.tree.leaves(moments), jax.tree.leaves(learner.params)):
      assert m.sharding == p.sharding
  metrics = learner.update(rollouts, seed=3)
  np.testing.assert_allclose(metrics["loss"], plain_metrics["loss"], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["grad_norm"], plain_metrics["grad_norm"], rtol=1e-5)
  delta = max(float(np.abs(a - b).max()) for a, b in zip(
      jax.tree.leaves(_params(plain_model)),
      jax.tree.leaves(_params(init_model(small_config(), seed=0, init_std=0.1)))))
  assert delta > 1e-3
  diff = max(float(np.abs(a - b).max()) for a, b in zip(
      jax.tree.leaves(_params(plain_model)), jax.tree.leaves(_params(model))))
  assert diff < 1e-5 * max(delta, 1.0)


def test_float32_master_weights_keep_small_updates_of_a_bf16_model(rollouts):
  """lr = 1e-6 on bf16 weights: the float32 master copy moves (>= 99% of the
  non-embedding weights change), while the same update applied in bf16 would be
  rounded away for most of them; the model holds the master cast to bf16."""
  model = init_model(small_config(), seed=0, init_std=0.1, dtype=jnp.bfloat16)
  before = jax.tree.map(lambda x: np.asarray(x, np.float32), nnx.state(model, nnx.Param))
  learner = Learner(model, LearnerConfig.grpo(lr=1e-6, kl_coef=0.0), (16,), (PROMPT,),
                    (N_NEW,))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(learner.params))
  learner.update(rollouts)
  after = jax.tree.map(np.asarray, learner.params)
  flat_before = nnx.to_flat_state(before)
  changed = total = bf16_kept = 0
  for (path, b), (_, a) in zip(flat_before, nnx.to_flat_state(after)):
    if "embed_tokens" in path:
      continue             # rows of tokens absent from the batch get no gradient
    b, a = np.asarray(b[...]), np.asarray(a[...])
    changed += int((a != b).sum())
    total += b.size
    bf16_kept += int((jnp.asarray(a, jnp.bfloat16).astype(jnp.float32) != b).sum())
  assert changed / total >= 0.99
  assert bf16_kept / total < 0.5          # what a bf16-only optimizer would have kept
  for m, p in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(learner.params)):
    assert m.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(m), np.asarray(p.astype(jnp.bfloat16)))


def test_no_compilation_after_warmup_with_every_knob_on_a_mesh(rollouts):
  mesh = _mesh()
  cfg = LearnerConfig.grpo(mini_batches=2, grad_accum=2, remat="full", scan_layers=True,
                           attention="blocked", attention_block=8, logits_chunk=8, fsdp=True)
  model = init_model(small_config(), seed=0, init_std=0.1, mesh=mesh, dtype=jnp.bfloat16)
  learner = Learner(model, cfg, (16,), (PROMPT,), (N_NEW,), mesh=mesh)
  compilation.install()
  learner.warmup()
  before = compilation.compile_count()
  for seed in range(2):
    learner.update(rollouts, seed=seed)
  assert compilation.compile_count() == before


# ------------------------------------------------------------------- sampler
def _generate(model, mesh=None, options=None, prompts=None, temperature=0.0):
  sampler = Sampler(model, SamplingParams(N_NEW, temperature=temperature, stop_ids=(2,)),
                    row_buckets=(16,), prompt_buckets=(PROMPT,), mesh=mesh, options=options)
  return sampler, sampler.generate(model, prompts, 4, seed=5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_decode_kinds_blocked_prefill_and_row_sharded_cache_agree(temperature):
  """einsum vs reduce decode, blocked vs dense prefill, and a (2, 4) mesh whose 2 KV
  heads cannot split 4 ways (cache rows over both axes): the same tokens."""
  cfg = small_config("qwen2")
  assert cfg.num_kv_heads == 2
  rng = np.random.default_rng(1)
  prompts = [rng.integers(5, 60, rng.integers(3, 9)).tolist() for _ in range(4)]
  model = init_model(cfg, seed=2, init_std=0.1)
  _, ref = _generate(model, options=ForwardOptions(decode_attention="reduce"), prompts=prompts,
                     temperature=temperature)
  _, einsum = _generate(model, options=ForwardOptions(attention="blocked", attention_block=3,
                                                      decode_attention="einsum"),
                        prompts=prompts, temperature=temperature)
  np.testing.assert_array_equal(einsum.response_tokens, ref.response_tokens)
  np.testing.assert_allclose(einsum.response_logprobs, ref.response_logprobs, atol=1e-5)
  mesh = _mesh()
  sharded_model = init_model(cfg, seed=2, init_std=0.1, mesh=mesh)
  sampler, sharded = _generate(sharded_model, mesh=mesh, prompts=prompts,
                               temperature=temperature)
  np.testing.assert_array_equal(sharded.response_tokens, ref.response_tokens)
  rows_layout = sampler._options_for(16).kv_sharding.spec
  assert rows_layout[0] == ("data", "model") and rows_layout[1] is None


def test_rollout_split_into_sub_calls_samples_the_same_tokens():
  """16 rows in sub-calls of 8 (2 groups of 4 each): identical tokens, log-probs and
  group stats (every row keeps its random stream; 2 host callbacks deliver them)."""
  model = init_model(small_config(), seed=2, init_std=0.1)
  rng = np.random.default_rng(4)
  prompts = [rng.integers(5, 60, rng.integers(3, 9)).tolist() for _ in range(3)]
  params = SamplingParams(N_NEW, temperature=1.0, stop_ids=(2,))
  whole = Sampler(model, params, row_buckets=(16,), prompt_buckets=(PROMPT,))
  split = Sampler(model, params, row_buckets=(16,), prompt_buckets=(PROMPT,),
                  max_rows_per_call=8)
  # One call size (8 rows): the segmented sampler's executables for it, nothing for 16.
  keys = split.segmented.executable_keys(8, PROMPT, split.group_sizes)
  assert split.warmup(model) == len(keys) and split.call_rows(16) == 8
  assert all(16 not in key[1:3] for key in keys)
  a = whole.generate(model, prompts, 4, seed=9)
  b = split.generate(model, prompts, 4, seed=9)
  for field in ("response_tokens", "lengths", "group_ids", "row_valid", "group_max",
                "group_median"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
  # Batch size changes XLA:CPU's float summation order: log-probs agree to rounding.
  np.testing.assert_allclose(a.response_logprobs, b.response_logprobs, atol=1e-5)
  # Two sub-calls, two host-callback deliveries, concatenated in group order.
  np.testing.assert_array_equal(b.group_max, a.group_max)
  assert b.group_max.size == 3 and split.sink.pending_rounds() == 0
  with pytest.raises(ValueError, match="max_rows_per_call=8 is smaller than group_size=16"):
    split.generate(model, prompts[:1], 16, seed=0)


def test_sampler_on_a_mesh_without_a_model_axis():
  """mesh.axes=('data',) is a valid config: the cache layout drops the missing axis."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  cfg = small_config()
  rng = np.random.default_rng(2)
  prompts = [rng.integers(5, 60, rng.integers(3, 9)).tolist() for _ in range(4)]
  _, ref = _generate(init_model(cfg, seed=3, init_std=0.1), prompts=prompts)
  _, out = _generate(init_model(cfg, seed=3, init_std=0.1, mesh=mesh), mesh=mesh,
                     prompts=prompts)
  np.testing.assert_array_equal(out.response_tokens, ref.response_tokens)
