"""Small GGUF files written with the ``gguf`` package's own writer, from a random
transformers Llama whose logits are the reference (llama.cpp's layout: q/k rows
permuted for its RoPE, byte-level GPT-2 tokenizer metadata)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 258              # 256 byte tokens + <s> + </s>
PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]   # <s>Hello, world


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable-character table (the byte-level BPE alphabet)."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  chars, extra = printable[:], 0
  for b in range(256):
    if b not in printable:
      printable.append(b)
      chars.append(256 + extra)
      extra += 1
  return dict(zip(printable, map(chr, chars)))


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's q/k row order (transformers' GGUF reader undoes it)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def write_tiny_gguf(path: Path, *, architecture: str = "llama", truncate_to: int | None = None
                    ) -> np.ndarray:
  """Writes a 2-layer Llama as GGUF (float32) to ``path``; returns its reference logits
  for ``PROMPT`` from transformers. ``architecture`` other than llama only relabels
  the file (for refusal tests); ``truncate_to`` cuts the file to that many bytes."""
  import gguf
  import torch
  from transformers import LlamaConfig, LlamaForCausalLM

  heads, kv_heads, layers = 4, 2, 2
  cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=layers, num_attention_heads=heads,
                    num_key_value_heads=kv_heads, max_position_embeddings=128,
                    rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    bos_token_id=256, eos_token_id=257)
  torch.manual_seed(0)
  model = LlamaForCausalLM(cfg).eval()
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  writer = gguf.GGUFWriter(str(path), architecture)
  writer.add_block_count(layers)
  writer.add_context_length(128)
  writer.add_embedding_length(64)
  writer.add_feed_forward_length(128)
  writer.add_head_count(heads)
  writer.add_head_count_kv(kv_heads)
  writer.add_rope_freq_base(10000.0)
  writer.add_layer_norm_rms_eps(1e-6)
  writer.add_rope_dimension_count(64 // heads)
  writer.add_vocab_size(VOCAB)
  alphabet = _bytes_to_unicode()
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("default")
  writer.add_token_list([alphabet[b] for b in range(256)] + ["<s>", "</s>"])
  writer.add_token_types([1] * 256 + [3, 3])
  writer.add_token_scores([0.0] * VOCAB)
  writer.add_token_merges([])
  writer.add_bos_token_id(256)
  writer.add_eos_token_id(257)
  names = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
  for i in range(layers):
    hf, g = f"model.layers.{i}.", f"blk.{i}."
    names.update({
        hf + "input_layernorm.weight": g + "attn_norm.weight",
        hf + "self_attn.q_proj.weight": g + "attn_q.weight",
        hf + "self_attn.k_proj.weight": g + "attn_k.weight",
        hf + "self_attn.v_proj.weight": g + "attn_v.weight",
        hf + "self_attn.o_proj.weight": g + "attn_output.weight",
        hf + "post_attention_layernorm.weight": g + "ffn_norm.weight",
        hf + "mlp.gate_proj.weight": g + "ffn_gate.weight",
        hf + "mlp.up_proj.weight": g + "ffn_up.weight",
        hf + "mlp.down_proj.weight": g + "ffn_down.weight"})
  for hf_name, gguf_name in names.items():
    tensor = state[hf_name]
    if "q_proj" in hf_name:
      tensor = _permute(tensor, heads)
    elif "k_proj" in hf_name:
      tensor = _permute(tensor, kv_heads)
    writer.add_tensor(gguf_name, np.ascontiguousarray(tensor, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  if truncate_to is not None:
    with open(path, "r+b") as f:
      f.truncate(truncate_to)
  with torch.no_grad():
    return model(torch.tensor([PROMPT])).logits[0].numpy()
