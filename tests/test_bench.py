"""The sampler benchmark's FLOP accounting counts the matmuls the model really has."""

import jax
import pytest
from flax import nnx

from sagc_jax.bench.sampler import _gflop_per_token, _projection_shapes, small_config
from sagc_jax.models import init_model, tiny_config


@pytest.mark.parametrize("make_config", [tiny_config, small_config])
def test_projection_shapes_are_the_models_matrices(make_config):
  """Every 2-D parameter is multiplied once per token, except an untied input
  embedding (a lookup); a tied one is the output head and is counted once."""
  cfg = make_config()
  state = nnx.state(init_model(cfg, seed=0))
  matrices = sum(x.size for x in jax.tree.leaves(state) if x.ndim == 2)
  lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
  weights = sum(a * b for a, b in _projection_shapes(cfg))
  assert weights == matrices - lookup
  assert _gflop_per_token(cfg, context=0) == pytest.approx(2 * weights / 1e9)
  # Attention adds q.k and p.v over the context: 4 FLOPs per head dim per slot.
  extra = _gflop_per_token(cfg, context=100) - _gflop_per_token(cfg, context=0)
  assert extra == pytest.approx(4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 100 / 1e9)
