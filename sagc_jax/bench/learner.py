"""Learner throughput, packed vs padded, on the same rollout batches; padding; compiles.

Two learners (GRPO preset: reference pass + 2 minibatch updates per step) start from
the same weights of the main job's model (the built-in tiny Llama) and train on the same
rollout batches, one step each in turn: ``learner.packing=True`` (sequences packed into
rows) and ``False`` (today's reference layout, one left-padded row per sequence, cut to
the response bucket of the longest response).

The batches are drawn for their lengths, which is all the learner's cost depends on:
G cycles through (4, 8, 16) with 8 prompts per step (the main job's row buckets 32, 64,
128), prompts of 6-24 tokens, and responses from one of two mixes:

* ``heavy`` (the top-level keys): 85% short (log-normal, median 12 tokens), 15% near
  the 128-token cap (96-128), the shape of reasoning rollouts where a few chains run long;
* ``main_job`` (``main_job_mix``): log-normal with median 20 tokens capped at 64, like
  the tiny main job's responses.

Reported per mix: padding efficiency (real prompt + response tokens of the trained
sequences / token slots the train steps computed) of both layouts, trained response
tokens per second of both and their ratio ``speedup`` (total over the timed steps; the
per-step minimum and maximum next to it), executables and XLA compilations after
warm-up (must be 0). The first pass over the three G values is not timed.

``layout_learners`` and ``compare_layouts`` (the two learners, and the loop that trains
and measures them) are what ``bench learner --model`` runs too, on a real model's
natural rollouts (``real_model.py``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from sagc_jax.runtime import compilation
from sagc_jax.models import init_model, tiny_config
from sagc_jax.runtime.compilation import warm
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.rl.learner import Learner
from sagc_jax.rl.rollout import RolloutBatch

CANDIDATES = (4, 8, 16)
PROMPTS = 8
PROMPT_BUCKET = 32
RESPONSE_BUCKETS = (32, 64, 128)
MIXES = ("heavy", "main_job")


def response_lengths(mix: str, n: int, rng: np.random.Generator) -> np.ndarray:
  if mix == "heavy":
    short = np.clip(np.round(rng.lognormal(np.log(12), 0.5, n)), 1, 95)
    long = rng.integers(96, RESPONSE_BUCKETS[-1] + 1, n)
    return np.where(rng.random(n) < 0.85, short, long).astype(np.int32)
  if mix == "main_job":
    return np.clip(np.round(rng.lognormal(np.log(20), 0.45, n)), 1, 64).astype(np.int32)
  raise ValueError(f"mix={mix!r} is not one of {MIXES}")


def rollout(mix: str, g: int, vocab: int, rng: np.random.Generator) -> RolloutBatch:
  """One step's batch: 8 prompts x G rows (a row bucket exactly), random tokens."""
  rows = PROMPTS * g
  n_max = RESPONSE_BUCKETS[-1]
  prompt_len = rng.integers(6, 25, PROMPTS).repeat(g)
  resp = response_lengths(mix, rows, rng)
  prompt_mask = np.arange(PROMPT_BUCKET)[None, :] >= (PROMPT_BUCKET - prompt_len)[:, None]
  response_mask = np.arange(n_max)[None, :] < resp[:, None]
  return RolloutBatch(
      prompt_tokens=np.where(prompt_mask, rng.integers(10, vocab, prompt_mask.shape), 0
                             ).astype(np.int32),
      prompt_mask=prompt_mask,
      response_tokens=np.where(response_mask, rng.integers(10, vocab, response_mask.shape),
                               0).astype(np.int32),
      response_mask=response_mask,
      old_logprobs=np.where(response_mask, -np.log(vocab), 0).astype(np.float32),
      lengths=resp, group_ids=np.arange(rows, dtype=np.int32) // g,
      row_valid=np.ones(rows, bool), scores=rng.normal(size=rows).astype(np.float32),
      group_size=g)


def layout_learners(make_model, config: LearnerConfig, row_buckets, prompt_buckets,
                    response_buckets) -> dict[bool, Learner]:
  """Two learners on equal weights (``make_model()`` is called once per learner), one per
  layout: ``{True: packed, False: padded}``, otherwise the same ``config``."""
  return {packing: Learner(make_model(), dataclasses.replace(config, packing=packing),
                           row_buckets, prompt_buckets, response_buckets)
          for packing in (True, False)}


def _learners(seed: int) -> dict[bool, Learner]:
  config = LearnerConfig.grpo(lr=1e-4, mini_batches=2, max_response_len=RESPONSE_BUCKETS[-1])
  return layout_learners(lambda: init_model(tiny_config(), seed=seed, init_std=0.05), config,
                         tuple(PROMPTS * g for g in CANDIDATES), (PROMPT_BUCKET,),
                         RESPONSE_BUCKETS)


def compare_layouts(label: str, learners: dict[bool, Learner], batches: Sequence[RolloutBatch],
                    untimed: int, log=print) -> dict[str, Any]:
  """Warms both learners up, then trains each on every batch in turn (one update call
  per batch and layout). Padding efficiency counts every step; tokens/s and speedup
  only the steps after the first ``untimed``; compilations are counted after warm-up."""
  start = time.perf_counter()
  executables = {k: 0 for k in learners}
  for packing, learner in learners.items():
    executables[packing] = warm(learner.warmup_jobs())
  warmup_s = time.perf_counter() - start
  before = compilation.compile_count()
  records = []
  batches = list(batches)
  for step, batch in enumerate(batches):
    row = {"g": batch.group_size, "rows": batch.num_rows,
           "lengths": batch.lengths[batch.row_valid]}
    for packing, learner in learners.items():
      m = learner.update(dataclasses.replace(batch), seed=step)
      tag = "packed" if packing else "padded"
      row.update({f"{tag}_seconds": m["learner_seconds"], f"{tag}_slots": m["padded_tokens"],
                  f"{tag}_sequence_tokens": m["sequence_tokens"],
                  "response_tokens": m["response_tokens"]})
    records.append(row)
    log(f"  [{label}] step {step + 1}/{len(batches)}: G={row['g']} rows {row['rows']} packed "
        f"{row['packed_seconds']:.2f} s, padded {row['padded_seconds']:.2f} s")
  compiles = compilation.compile_count() - before
  timed = records[untimed:]
  if not timed:
    raise ValueError(f"{len(records)} steps leave none timed after {untimed} untimed ones")
  lengths = np.concatenate([r.pop("lengths") for r in records])

  def total(key, rows=records):
    return float(sum(r[key] for r in rows))
  per_step = [r["padded_seconds"] / r["packed_seconds"] for r in timed]
  return {
      "steps": len(records), "timed_steps": len(timed), "warmup_seconds": warmup_s,
      "response_length": {"mean": float(lengths.mean()), "p50": float(np.median(lengths)),
                          "p90": float(np.percentile(lengths, 90)), "max": int(lengths.max())},
      "padding_efficiency": total("packed_sequence_tokens") / total("packed_slots"),
      "unpacked_padding_efficiency": total("padded_sequence_tokens") / total("padded_slots"),
      "real_tokens_per_s": total("response_tokens", timed) / total("packed_seconds", timed),
      "unpacked_real_tokens_per_s": (total("response_tokens", timed)
                                     / total("padded_seconds", timed)),
      "speedup": total("padded_seconds", timed) / total("packed_seconds", timed),
      "speedup_per_step_min": min(per_step), "speedup_per_step_max": max(per_step),
      "executables": executables[True], "unpacked_executables": executables[False],
      "pack_lengths": list(learners[True].pack_lengths),
      "row_ladder": list(learners[True].row_ladder),
      "compiles_after_warmup": int(compiles),
  }


def run_mix(mix: str, steps: int, seed: int, log=print) -> dict[str, Any]:
  vocab = tiny_config().vocab_size
  rng = np.random.default_rng(seed)
  batches = [rollout(mix, CANDIDATES[step % len(CANDIDATES)], vocab, rng)
             for step in range(steps)]
  return {"mix": mix, **compare_layouts(mix, _learners(seed), batches, len(CANDIDATES), log)}


def run(steps: int = 15, seed: int = 0, log=print) -> dict[str, Any]:
  compilation.install()
  heavy = run_mix("heavy", steps, seed, log)
  main = run_mix("main_job", steps, seed, log)
  cfg = tiny_config()
  return {"model": {"family": cfg.model_type, "hidden": cfg.hidden_size,
                    "layers": cfg.num_layers},
          "row_buckets": [PROMPTS * g for g in CANDIDATES], "prompt_bucket": PROMPT_BUCKET,
          "response_buckets": list(RESPONSE_BUCKETS), **heavy, "main_job_mix": main,
          "compiles_after_warmup": heavy["compiles_after_warmup"]
          + main["compiles_after_warmup"]}


def report(results: dict[str, Any]) -> str:
  lines = [f"learner, packed vs padded (GRPO preset, tiny {results['model']['family']}, row "
           f"buckets {results['row_buckets']}, prompt bucket {results['prompt_bucket']}, "
           f"response buckets {results['response_buckets']})",
           f"  {'mix':>9} {'pad_eff':>8} {'unpacked':>8} {'tok/s':>8} {'unpacked':>8} "
           f"{'speedup':>8} {'min':>6} {'max':>6} {'execs':>6} {'compiles':>8}"]
  for r in (results, results["main_job_mix"]):
    lines.append(f"  {r['mix']:>9} {r['padding_efficiency']:>8.3f} "
                 f"{r['unpacked_padding_efficiency']:>8.3f} {r['real_tokens_per_s']:>8.0f} "
                 f"{r['unpacked_real_tokens_per_s']:>8.0f} {r['speedup']:>8.2f} "
                 f"{r['speedup_per_step_min']:>6.2f} {r['speedup_per_step_max']:>6.2f} "
                 f"{r['executables']:>6} {r['compiles_after_warmup']:>8}")
  return "\n".join(lines)
