"""Reference checkpoints for the model tests, built with transformers + torch.

Tiny random HF models (torch.manual_seed) saved with ``save_pretrained``: the logits
transformers computes for them are the independent reference our nnx decoder must
match. Every parameter is re-drawn with a large scale (biases and norm weights
included: HF initialises those to 0 and 1, which would hide a mis-mapped bias or norm),
so that logits are far from trivial.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
              rms_norm_eps=1e-5)

# llama3 scaling with original context 64: for head_dim 16 and theta 1e4 the wavelengths
# are 6.3, 19.9, 62.8, 199, ... so one frequency stays, two are smoothed and the rest are
# divided by 8; sequences of 100+ tokens then see very different rotations.
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10_000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64)


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  family: str
  tied: bool
  extra: tuple = ()  # (key, value) pairs for the HF config

  def config_kwargs(self) -> dict[str, Any]:
    return {**COMMON, "tie_word_embeddings": self.tied, **dict(self.extra)}


CASES = {
    "llama_untied": Case("llama_untied", "llama", False, (("max_position_embeddings", 256),)),
    "llama_tied": Case("llama_tied", "llama", True, (("max_position_embeddings", 256),)),
    "llama3_untied": Case("llama3_untied", "llama", False,
                          (("max_position_embeddings", 512), ("rope_parameters", LLAMA3_ROPE))),
    "llama3_tied": Case("llama3_tied", "llama", True,
                        (("max_position_embeddings", 512), ("rope_parameters", LLAMA3_ROPE))),
    "qwen2_tied": Case("qwen2_tied", "qwen2", True,
                       (("rope_parameters", {"rope_type": "default", "rope_theta": 1e6}),)),
    "qwen2_untied": Case("qwen2_untied", "qwen2", False,
                         (("rope_parameters", {"rope_type": "default", "rope_theta": 1e6}),)),
    # head_dim 32 != hidden / heads = 16, as in real Qwen3 configs.
    "qwen3": Case("qwen3", "qwen3", False,
                  (("head_dim", 32), ("rope_parameters", {"rope_type": "default",
                                                          "rope_theta": 1e6}))),
    "qwen3_tied": Case("qwen3_tied", "qwen3", True, (("head_dim", 32),)),
}


def _classes(family: str):
  import transformers as tf
  return {
      "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
      "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
      "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
  }[family]


def build_hf_model(case: Case, seed: int = 0):
  """A random torch model for ``case`` in eval mode, every parameter drawn at scale."""
  import torch

  config_cls, model_cls = _classes(case.family)
  torch.manual_seed(seed)
  model = model_cls(config_cls(**case.config_kwargs())).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.2 * torch.randn_like(p))
  return model


def save_hf_model(model, out_dir: Path, **kwargs) -> Path:
  out_dir.mkdir(parents=True, exist_ok=True)
  model.save_pretrained(str(out_dir), **kwargs)
  return out_dir


def hf_logits(model, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
  """float32 numpy logits of a transformers model."""
  import torch

  with torch.no_grad():
    kwargs = {} if mask is None else {"attention_mask": torch.tensor(mask, dtype=torch.long)}
    return model(torch.tensor(ids, dtype=torch.long), **kwargs).logits.float().numpy()
