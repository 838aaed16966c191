"""Supervised warm start: next-token cross-entropy on reference solutions.

A randomly initialised policy never produces a correct answer, so its rewards
are all zero and GRPO/DAPO get no signal (every group has zero variance). The
CPU default therefore first fine-tunes the tiny model on the synthetic task's
written solutions for a few hundred steps, then hands over to RL. The loss
covers the solution tokens and the EOS that ends them (the prompt is context
only). One fixed shape ``[batch_size, seq_bucket]`` compiles once.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sagc_jax.models.transformer import Transformer
from sagc_jax.rl.losses import token_logprobs
from sagc_jax.runtime.compilation import PROGRESS_EVERY_S


def tokenize_examples(tokenizer: Any, examples: Sequence[dict], seq_len: int, eos_id: int,
                      pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
  """Right-padded ``prompt + solution + EOS`` ids, attention mask, loss mask.

  Examples longer than ``seq_len`` are dropped (their count is returned) rather
  than truncated: a truncated solution would teach the model to stop early.
  """
  rows, dropped = [], 0
  for ex in examples:
    prompt = tokenizer(ex["prompt"], add_special_tokens=True)["input_ids"]
    solution = tokenizer(ex["solution"], add_special_tokens=False)["input_ids"] + [eos_id]
    if len(prompt) + len(solution) > seq_len:
      dropped += 1
      continue
    rows.append((prompt, solution))
  ids = np.full((len(rows), seq_len), pad_id, np.int32)
  attn = np.zeros((len(rows), seq_len), bool)
  loss = np.zeros((len(rows), seq_len), bool)
  for i, (prompt, solution) in enumerate(rows):
    n_p, n_s = len(prompt), len(solution)
    ids[i, :n_p + n_s] = prompt + solution
    attn[i, :n_p + n_s] = True
    loss[i, n_p:n_p + n_s] = True
  return ids, attn, loss, dropped


def supervised_finetune(model: Transformer, ids: np.ndarray, attn: np.ndarray,
                        loss_mask: np.ndarray, *, steps: int, batch_size: int, lr: float,
                        warmup_steps: int, seed: int,
                        log: Callable[[str], None] = print) -> list[float]:
  """Trains ``model`` in place with AdamW (warm-up + cosine); returns per-step losses."""
  if len(ids) < batch_size:
    raise ValueError(f"sft: only {len(ids)} usable examples for batch_size={batch_size} "
                     "(raise sft.seq_bucket or lower sft.batch_size)")
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup_steps, 1), max(steps, 2),
                                                end_value=lr * 0.1)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
  opt_state = tx.init(params)

  @jax.jit
  def sft_step(params, opt_state, ids, attn, loss_mask):
    def loss_fn(p):
      logits = nnx.merge(graphdef, p, rest)(ids, attention_mask=attn)
      logp = token_logprobs(logits[:, :-1], ids[:, 1:])
      target = loss_mask[:, 1:].astype(jnp.float32)
      return -jnp.sum(logp * target) / jnp.maximum(jnp.sum(target), 1.0)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(seed)
  order = rng.permutation(len(ids))
  cursor, losses = 0, []
  start = last_line = time.perf_counter()
  for step in range(steps):
    if cursor + batch_size > len(order):
      order, cursor = rng.permutation(len(ids)), 0
    idx = order[cursor:cursor + batch_size]
    cursor += batch_size
    params, opt_state, loss = sft_step(params, opt_state, ids[idx], attn[idx], loss_mask[idx])
    now = time.perf_counter()
    if step == 0 or step == steps - 1 or now - last_line >= PROGRESS_EVERY_S:
      losses_so_far = float(loss)           # waits for the step: the rate is real
      now = last_line = time.perf_counter()
      rate = (step + 1) / max(now - start, 1e-9)
      log(f"sft step {step + 1}/{steps}  loss {losses_so_far:.4f}  ({rate:.1f} steps/s, "
          f"eta {(steps - step - 1) / max(rate, 1e-9):.0f} s)")
    losses.append(loss)
  nnx.update(model, params)
  return [float(x) for x in jax.device_get(losses)]
