"""A built-in tiny model and character tokenizer for CPU runs, built fully offline.

The CPU default trains from scratch on a synthetic multi-step arithmetic task with a
written scratchpad, so it needs no pretrained weights, only a tokenizer that covers the
task's text and a model small enough to train on two CPU cores. A character-level
tokenizer is the natural fit: every digit is its own token (arithmetic stays learnable)
and nothing has to be trained. Its vocabulary is the 4 specials, newline and the 95
printable ASCII characters: 100 tokens, which divides evenly on 2- and 4-way ``model``
mesh axes.

The folder written by ``build_tiny_checkpoint`` is an ordinary HF checkpoint folder
(``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``):
``from_pretrained``/``load_tokenizer`` and transformers' ``AutoModelForCausalLM`` /
``AutoTokenizer`` all read it. Building it needs neither torch nor transformers: the
tokenizer is written with the ``tokenizers`` library, the weights by ``save_pretrained``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp

from sagc_jax.models.config import SUPPORTED_MODEL_TYPES, ModelConfig
from sagc_jax.models.hf_io import save_pretrained
from sagc_jax.models.transformer import init_model

__all__ = [
    "TINY_SPECIALS",
    "build_tiny_checkpoint",
    "build_tiny_tokenizer",
    "tiny_config",
    "tiny_vocab",
]

TINY_SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
TINY_MAX_POSITIONS = 2048


def tiny_vocab() -> list[str]:
  """Token strings by id: specials, newline, printable ASCII (space .. '~')."""
  return list(TINY_SPECIALS) + ["\n"] + [chr(c) for c in range(32, 127)]


def tiny_config(family: str = "llama", vocab_size: int | None = None) -> ModelConfig:
  """About 0.8M parameters: hidden 128, 4 layers, 4 heads (2 KV), MLP 384, tied head."""
  if family not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"family={family!r}: expected one of {SUPPORTED_MODEL_TYPES}")
  return ModelConfig(
      model_type=family,
      vocab_size=vocab_size or len(tiny_vocab()),
      hidden_size=128,
      intermediate_size=384,
      num_layers=4,
      num_heads=4,
      num_kv_heads=2,
      head_dim=32,
      rms_norm_eps=1e-6,
      rope_theta=10_000.0,
      max_position_embeddings=TINY_MAX_POSITIONS,
      tie_word_embeddings=True,
      bos_token_id=BOS_ID,
      eos_token_ids=(EOS_ID,),
      pad_token_id=PAD_ID,
  )


def build_tiny_tokenizer(out_dir: str | os.PathLike) -> Path:
  """Writes the character-level tokenizer as an HF tokenizer folder.

  Text is split into single characters (WordLevel over the fixed vocabulary; unknown
  characters map to ``<unk>``); encoding prepends ``<s>``; decoding fuses characters.
  """
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  vocab = {t: i for i, t in enumerate(tiny_vocab())}
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens(list(TINY_SPECIALS))
  tok.post_processor = processors.TemplateProcessing(
      single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", BOS_ID)])
  tok.save(str(out / "tokenizer.json"))
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": "<s>",
      "eos_token": "</s>",
      "pad_token": "<pad>",
      "unk_token": "<unk>",
      "model_max_length": TINY_MAX_POSITIONS,
      "clean_up_tokenization_spaces": False,
      "padding_side": "left",
  }
  (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
  specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
  (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n",
                                               encoding="utf-8")
  return out


def build_tiny_checkpoint(out_dir: str | os.PathLike, seed: int = 0, family: str = "llama",
                          dtype: jnp.dtype = jnp.float32) -> Path:
  """Writes a random-init tiny model folder (weights + config + tokenizer), offline."""
  cfg = tiny_config(family)
  out = build_tiny_tokenizer(out_dir)
  model = init_model(cfg, seed=seed, dtype=dtype)
  save_pretrained(model, cfg, out)
  generation = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
  (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n",
                                              encoding="utf-8")
  return out
