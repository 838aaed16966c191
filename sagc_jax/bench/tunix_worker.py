"""Tunix's native sampler on given token ids: the peer column of ``bench heavy_tail``.

Runs as a script in a Python environment that has ``google-tunix`` (the ``.[peers]``
extra, or a separate venv: it imports nothing of sagc_jax, so it works where our own
pins and Tunix's disagree):

  PEER_PYTHON sagc_jax/bench/tunix_worker.py JOB.json OUT.json

JOB: ``folder`` (an HF Llama folder: config.json + safetensors), ``prompts`` (lists of
token ids), ``stop_ids``, ``max_new_tokens``, ``runs`` (timed calls after one untimed)
and ``pad_id``. OUT: per timed call its seconds, and the first call's response tokens
and lengths (the stop token counted, as ours count it).

Tunix's Llama applies RoPE with theta 1e6 whatever ``config.json`` says (its
``model.py`` calls ``apply_rope`` without the config's ``rope_theta``), so the caller
passes a folder whose config says 1e6 and loads the same folder itself.
"""

from __future__ import annotations

import json
import os
import sys
import time


class _IdTokenizer:
  """Text = space-separated token ids: the prompts reach the sampler as given."""

  def __init__(self, pad_id: int):
    self._pad = pad_id

  def encode(self, text: str, **_) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self) -> int:
    return 0                       # falsy: Tunix then prepends no BOS

  def eos_id(self) -> int:
    return self._pad

  def pad_id(self) -> int:
    return self._pad


def main(job_path: str, out_path: str) -> None:
  with open(job_path) as f:
    job = json.load(f)
  import jax.numpy as jnp
  import numpy as np
  from tunix.generate import sampler as sampler_lib
  from tunix.models.llama3 import model as model_lib, params as params_lib

  with open(os.path.join(job["folder"], "config.json")) as f:
    hf = json.load(f)
  heads = hf["num_attention_heads"]
  theta = (hf.get("rope_parameters") or {}).get("rope_theta") or hf.get("rope_theta", 1e6)
  cfg = model_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"], num_heads=heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(theta),
      norm_eps=hf["rms_norm_eps"], weight_tying=bool(hf.get("tie_word_embeddings", False)))
  model = params_lib.create_model_from_safe_tensors(job["folder"], cfg, dtype=jnp.float32)
  prompts = job["prompts"]
  longest = max(len(p) for p in prompts)
  prompt_len = 1 << (longest - 1).bit_length()          # Tunix pads to a power of two
  sampler = sampler_lib.Sampler(
      transformer=model, tokenizer=_IdTokenizer(job["pad_id"]),
      cache_config=sampler_lib.CacheConfig(
          cache_size=prompt_len + job["max_new_tokens"], num_layers=cfg.num_layers,
          num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
  text = [" ".join(map(str, p)) for p in prompts]
  stop_ids = [int(t) for t in job["stop_ids"]]

  def call():
    start = time.perf_counter()
    out = sampler(text, max_generation_steps=job["max_new_tokens"], temperature=0.0,
                  eos_tokens=stop_ids, max_prompt_length=prompt_len)
    return out, time.perf_counter() - start

  first, warm_s = call()                     # compiles
  timed = [call()[1] for _ in range(job["runs"])]
  tokens = [[int(t) for t in np.asarray(row)] for row in first.tokens]
  # Tunix cuts a response before its stop token; ours count it.
  lengths = [len(row) + (1 if len(row) < job["max_new_tokens"] else 0) for row in tokens]
  with open(out_path, "w") as f:
    json.dump({"warmup_seconds": warm_s, "seconds": timed, "tokens": tokens,
               "lengths": lengths, "prompt_len": prompt_len}, f)


if __name__ == "__main__":
  main(*sys.argv[1:3])
