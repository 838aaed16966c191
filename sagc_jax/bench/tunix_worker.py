"""Tunix's native sampler and GRPO train step on given token ids: the peer columns of
``bench heavy_tail`` and ``bench learner``.

Runs as a script in a Python environment that has ``google-tunix`` (a separate venv: it
imports nothing of sagc_jax, so it works where our own pins and Tunix's disagree):

  PEER_PYTHON sagc_jax/bench/tunix_worker.py JOB.json OUT.json

Sampler JOB: ``folder`` (an HF Llama folder: config.json + safetensors), ``prompts``
(lists of token ids), ``stop_ids``, ``max_new_tokens``, ``runs`` (timed calls after one
untimed) and ``pad_id``. OUT: per timed call its seconds, and the first call's response
tokens and lengths (the stop token counted, as ours count it).

Learner JOB (``"kind": "learner"``): ``folder``, ``pad_id``, ``eos_id``, ``beta``,
``epsilon``, ``temperature``, ``lr``, ``weight_decay``, ``max_grad_norm`` (AdamW after
global-norm clipping, as ours), ``mini_batches`` and ``batches``: per step ``prompt_ids`` (rows x
prompt, left-padded with ``pad_id``), ``completion_ids`` and ``completion_mask`` (rows x
the response cap: Tunix's GRPO learner pads every completion to
``max_tokens_to_generate``) and ``advantages`` (rows). A step is what Tunix's
``GRPOLearner`` runs on one batch with ``num_iterations=1``: the reference model's
per-token log-probabilities (``common.compute_per_token_logps``), then one optimizer
update per minibatch, each the body of ``PeftTrainer._train_step`` (``nnx.value_and_grad``
of ``algo_core.grpo_loss_fn``, then ``optimizer.update``) under ``nnx.jit`` with the graphs
cached (``nnx.cached_partial``), as ``PeftTrainer.train`` runs it. The timer starts with
the batch on the device; ours also times the host work of a step (advantages, packing,
transfers). OUT: per step its seconds (blocked on the result) and the loss of its first
minibatch.

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


def load_llama(folder: str, dtype):
  """Tunix's Llama from an HF folder (its config read from ``config.json``)."""
  from tunix.models.llama3 import model as model_lib, params as params_lib

  with open(os.path.join(folder, "config.json")) as f:
    hf = json.load(f)
  heads = hf["num_attention_heads"]
  theta = (hf.get("rope_parameters") or {}).get("rope_theta") or hf.get("rope_theta", 1e6)
  cfg = model_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"], hidden_dim=hf["intermediate_size"], num_heads=heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      num_kv_heads=hf["num_key_value_heads"], rope_theta=int(theta),
      norm_eps=hf["rms_norm_eps"], weight_tying=bool(hf.get("tie_word_embeddings", False)))
  return params_lib.create_model_from_safe_tensors(folder, cfg, dtype=dtype), cfg


def sample(job: dict) -> dict:
  import jax.numpy as jnp
  import numpy as np
  from tunix.generate import sampler as sampler_lib

  model, cfg = load_llama(job["folder"], jnp.float32)
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
  return {"warmup_seconds": warm_s, "seconds": timed, "tokens": tokens, "lengths": lengths,
          "prompt_len": prompt_len}


def learn(job: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx
  from tunix.rl import algo_core, common
  from tunix.rl.grpo import grpo_learner

  policy, _ = load_llama(job["folder"], jnp.float32)
  reference, _ = load_llama(job["folder"], jnp.float32)
  pad_id, eos_id = int(job["pad_id"]), int(job["eos_id"])
  algo = grpo_learner.GRPOConfig(num_generations=2, num_iterations=1, beta=job["beta"],
                                 epsilon=job["epsilon"])
  algo.temperature = job["temperature"]     # as GRPOLearner sets it from the rollout config
  tx = optax.chain(optax.clip_by_global_norm(job["max_grad_norm"]),
                   optax.adamw(job["lr"], weight_decay=job["weight_decay"]))
  optimizer = nnx.Optimizer(policy, tx, wrt=nnx.Param)
  ref_graph, ref_state = nnx.split(reference)
  ref_logps = jax.jit(common.compute_per_token_logps,
                      static_argnames=("pad_id", "eos_id", "stop_gradient", "temperature"))

  def loss_fn(model, example):
    return algo_core.grpo_loss_fn(model, example, algo, pad_id, eos_id)

  @nnx.jit(donate_argnames=("optimizer",))
  def train_step(model, optimizer, example):
    (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, example)
    optimizer.update(model, grads)
    return loss

  # As PeftTrainer.train runs its step (cache_nnx_graph=True): the model and optimizer
  # graphs are cached once, not traversed on every call.
  step_fn = nnx.cached_partial(train_step, policy, optimizer)
  seconds, losses = [], []
  for batch in job["batches"]:
    prompt = jnp.asarray(batch["prompt_ids"], jnp.int32)
    completion = jnp.asarray(batch["completion_ids"], jnp.int32)
    mask = jnp.asarray(batch["completion_mask"], jnp.int32)
    adv = jnp.asarray(batch["advantages"], jnp.float32)
    start = time.perf_counter()
    ref = ref_logps(ref_graph, ref_state, prompt, completion, pad_id=pad_id, eos_id=eos_id,
                    temperature=algo.temperature)
    rows = prompt.shape[0]
    per = rows // job["mini_batches"]
    first = None
    for m in range(job["mini_batches"]):
      part = slice(m * per, (m + 1) * per)
      example = grpo_learner.TrainExample(
          prompt_ids=prompt[part], prompt_mask=prompt[part] != pad_id,
          completion_ids=completion[part], completion_mask=mask[part], advantages=adv[part],
          ref_per_token_logps=ref[part], old_per_token_logps=None)
      loss = step_fn(example)
      first = loss if first is None else first
    jax.block_until_ready(nnx.state(policy))
    seconds.append(time.perf_counter() - start)
    losses.append(float(first))
  return {"seconds": seconds, "losses": losses}


def main(job_path: str, out_path: str) -> None:
  with open(job_path) as f:
    job = json.load(f)
  out = learn(job) if job.get("kind") == "learner" else sample(job)
  with open(out_path, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  main(*sys.argv[1:3])
