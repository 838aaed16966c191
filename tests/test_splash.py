"""The splash attention kernel (``sagc_jax/models/splash.py``) computes dense attention.

On CPU the Pallas kernel runs in its interpreter: the same kernel code and block
masks as on TPU, so these tests check our wrapper (scaling, grouped-query heads, KV
head repetition on a 'model' axis they do not divide, left padding as segments,
padding to whole tiles, shard_map layout) and the gradients of the kernel's custom
VJP against the dense reference (``attention._dense`` with a mask built in numpy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sagc_jax.models.attention import _dense
from sagc_jax.models.splash import _kernel, kernel_cost, kv_repeats, splash_attend, splash_block


def _inputs(rows=4, t=40, heads=8, kv_heads=2, dim=16, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
             for s in [(rows, t, heads, dim), (rows, t, kv_heads, dim), (rows, t, kv_heads, dim)])
  return q, k, v


def _segment_mask(segments: np.ndarray) -> np.ndarray:
  """[B, T, T]: query t sees key s iff s <= t and both are in the same segment."""
  t = segments.shape[1]
  causal = np.arange(t)[None, :] <= np.arange(t)[:, None]
  return causal[None] & (segments[:, :, None] == segments[:, None, :])


def _loss(out, real):
  return jnp.sum(jnp.where(real[:, :, None, None], out, 0.0) ** 2)


def _check(q, k, v, segments, real, mesh, block=128):
  groups = q.shape[2] // k.shape[2]
  seg = jnp.asarray(segments, jnp.int32)

  def splash(q, k, v):
    return splash_attend(q, k, v, seg, groups, mesh=mesh, block=block)

  def dense(q, k, v):
    return _dense(q, k, v, jnp.asarray(_segment_mask(segments)), groups)

  out, ref = jax.jit(splash)(q, k, v), jax.jit(dense)(q, k, v)
  np.testing.assert_allclose(np.where(real[:, :, None, None], out, 0),
                             np.where(real[:, :, None, None], ref, 0), atol=2e-6)
  grads = jax.jit(jax.grad(lambda *a: _loss(splash(*a), real), argnums=(0, 1, 2)))(q, k, v)
  ref_grads = jax.jit(jax.grad(lambda *a: _loss(dense(*a), real), argnums=(0, 1, 2)))(q, k, v)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=1e-5 * float(jnp.abs(r).max()))


def test_left_padded_rows_match_dense_attention_on_one_device():
  """T = 40 is padded to one 128-slot tile; a row with a single real token and rows
  with none-but-real are included."""
  q, k, v = _inputs()
  lengths = np.array([40, 29, 5, 1])
  real = np.arange(40)[None] >= 40 - lengths[:, None]
  _check(q, k, v, real.astype(np.int32), real, mesh=None)


def test_packed_segments_on_a_mesh_whose_model_axis_splits_the_kv_heads_unevenly():
  """Several sequences per row (segment ids 1, 2, 3 ...) on a (2, 4) mesh: 2 KV heads
  are repeated to 4 so that 'model' splits them; T = 200 spans two 128-slot tiles."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  q, k, v = _inputs(t=200)
  rng = np.random.default_rng(1)
  segments = np.zeros((4, 200), np.int32)
  for r in range(4):
    cuts = np.sort(rng.choice(np.arange(1, 200), 3, replace=False))
    for i, lo in enumerate(cuts):
      segments[r, lo:] = i + 1       # segment 0 is the row's leading padding
  _check(q, k, v, segments, segments > 0, mesh=mesh)


def test_kv_repeats_and_bad_head_layouts():
  assert kv_repeats(16, 2, 4) == 2          # Qwen2.5-3B on a 4-way 'model' axis
  assert kv_repeats(24, 8, 4) == 1          # Llama-3.2-3B: 8 KV heads already divide
  assert kv_repeats(8, 8, 1) == 1
  with pytest.raises(ValueError, match="6 query heads and 3 KV heads"):
    kv_repeats(6, 3, 4)


def test_kernel_cost_counts_the_tiles_the_kernel_visits():
  """The analytic tile count equals the kernel's own block mask (tiles it does not skip)."""
  for seq_len, block in [(2560, 512), (1000, 256), (96, 512)]:
    tile = splash_block(seq_len, block)
    padded = -(-seq_len // tile) * tile
    _, kernel = _kernel(padded, 1, tile, True)
    visited = int(np.count_nonzero(np.asarray(kernel.fwd_mask_info.block_mask)))
    cost = kernel_cost(rows=1, seq_len=seq_len, num_heads=1, num_kv_heads=1, head_dim=1,
                       block=block, itemsize=2, backward=False, recompute_forward=False,
                       devices=1)
    assert cost["flops"] == visited * 4 * tile * tile


def test_a_run_off_tpu_refuses_splash_and_names_the_alternative():
  from sagc_jax.training.build import build_components
  from sagc_jax.config import tiny_cpu_config, validate
  from sagc_jax.runtime.mesh import make_mesh
  from sagc_jax.models import init_model, tiny_config

  config = tiny_cpu_config()
  config.mesh.shape = (1, 1)
  config.learner.attention = "splash"
  model = init_model(tiny_config(), seed=0)
  with pytest.raises(ValueError, match="splash' is a TPU kernel and this run's devices are cpu;"
                                       " use learner.attention='blocked'"):
    build_components(validate(config), model, make_mesh((1, 1), ("data", "model")), stop_ids=(2,),
                     pad_id=0)
