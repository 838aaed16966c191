"""Learner train-step throughput, padding efficiency per response bucket, compiles.

Rollouts come from the real sampler on the built-in tiny model (temperature 1,
~5% of the vocabulary are stop tokens, so response lengths vary like a real
run's), with G cycling through the candidate set on hold-prompts row buckets.
Each ``Learner.update`` (GRPO preset: reference forward + 2 minibatch updates)
is timed after warm-up. Reported: real response tokens/s, padded tokens/s
(prompt + response bucket, every row of the row bucket), padding efficiency
(real response tokens / rows x response bucket) per response bucket, and XLA
compilations after warm-up (must be 0).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from sagc_jax import compile_count
from sagc_jax.models import init_model, tiny_config
from sagc_jax.rl.learner import Learner, LearnerConfig
from sagc_jax.components import rollout_batch
from sagc_jax.sampling import Sampler, SamplingParams, row_buckets_for


def run(steps: int = 24, prompts: int = 4, candidates: tuple[int, ...] = (4, 8, 16),
        max_new_tokens: int = 128, response_buckets: tuple[int, ...] = (32, 64, 128),
        seed: int = 0) -> dict[str, Any]:
  compile_count.install()
  cfg = tiny_config()
  model = init_model(cfg, seed=seed, init_std=0.05)
  row_buckets = row_buckets_for(candidates, lambda g: prompts)
  sampler = Sampler(model, SamplingParams(max_new_tokens, temperature=1.0,
                                          stop_ids=tuple(range(5, 10))),
                    row_buckets=row_buckets, prompt_buckets=(32,))
  learner = Learner(model, LearnerConfig.grpo(lr=1e-4, mini_batches=2,
                                              max_response_len=max_new_tokens),
                    row_buckets, (32,), response_buckets)
  start = time.perf_counter()
  sampler.warmup(model)
  executables = learner.warmup()
  warmup_s = time.perf_counter() - start
  rng = np.random.default_rng(seed)
  prompt_ids = [rng.integers(10, cfg.vocab_size, rng.integers(8, 31)).tolist()
                for _ in range(prompts)]
  before = compile_count.compile_count()
  records = []
  for step in range(steps):
    g = candidates[step % len(candidates)]
    samples = sampler.generate(model, prompt_ids, g, seed=step)
    scores = rng.normal(size=samples.num_rows)
    batch = rollout_batch(samples, scores)
    metrics = learner.update(batch, seed=step)
    records.append({"g": g, "rows": batch.num_rows, "bucket": int(metrics["response_bucket"]),
                    "real": metrics["response_tokens"], "padded": metrics["padded_tokens"],
                    "seconds": metrics["learner_seconds"]})
  sampler.sink.pop()
  compiles = compile_count.compile_count() - before
  timed = records[len(candidates):]            # the first pass over G touches caches
  seconds = sum(r["seconds"] for r in timed)
  per_bucket = []
  for bucket in response_buckets:
    rows = [r for r in records if r["bucket"] == bucket]
    if rows:
      per_bucket.append({
          "response_bucket": bucket, "updates": len(rows),
          "padding_efficiency": sum(r["real"] for r in rows)
          / sum(r["rows"] * bucket for r in rows),
          "tokens_per_s": sum(r["real"] for r in rows) / sum(r["seconds"] for r in rows)})
  return {
      "model": {"family": cfg.model_type, "hidden": cfg.hidden_size, "layers": cfg.num_layers},
      "row_buckets": list(row_buckets), "response_buckets": list(response_buckets),
      "steps": steps, "warmup_seconds": warmup_s, "executables": executables,
      "real_tokens_per_s": sum(r["real"] for r in timed) / seconds,
      "padded_tokens_per_s": sum(r["padded"] for r in timed) / seconds,
      "padding_efficiency": sum(r["real"] for r in records)
      / sum(r["rows"] * r["bucket"] for r in records),
      "per_bucket": per_bucket,
      "compiles_after_warmup": int(compiles),
  }


def report(results: dict[str, Any]) -> str:
  lines = [
      f"learner (GRPO preset, tiny {results['model']['family']}): row buckets "
      f"{results['row_buckets']}, response buckets {results['response_buckets']}, "
      f"{results['steps']} updates after {results['executables']} AOT compiles "
      f"({results['warmup_seconds']:.1f} s)",
      f"  real response tokens/s {results['real_tokens_per_s']:.0f}   padded tokens/s "
      f"{results['padded_tokens_per_s']:.0f}   padding efficiency "
      f"{results['padding_efficiency']:.3f}   compiles_after_warmup "
      f"{results['compiles_after_warmup']}",
      f"  {'bucket':>6} {'updates':>7} {'pad_eff':>8} {'real tok/s':>10}"]
  for row in results["per_bucket"]:
    lines.append(f"  {row['response_bucket']:>6} {row['updates']:>7} "
                 f"{row['padding_efficiency']:>8.3f} {row['tokens_per_s']:>10.0f}")
  return "\n".join(lines)
