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

With ``peer_python`` (a Python with ``google-tunix``) Tunix's GRPO train step runs the
same batches on the same initial weights too (``tunix_worker.py``, in its own
environment): per step the reference pass and one update per minibatch, every
completion padded to the response cap as Tunix's ``GRPOLearner`` pads it. Reported:
its trained response tokens per second and ``packed_over_tunix`` /
``padded_over_tunix`` (Tunix's seconds over ours, totals over the timed steps, per-step
minimum and maximum next to them). RoPE theta does not change a step's cost; Tunix's
Llama applies 1e6.

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
from sagc_jax.rl.losses import group_advantages
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
      "packed_step_seconds": [r["packed_seconds"] for r in records],
      "padded_step_seconds": [r["padded_seconds"] for r in records],
      "speedup_per_step_min": min(per_step), "speedup_per_step_max": max(per_step),
      "executables": executables[True], "unpacked_executables": executables[False],
      "pack_lengths": list(learners[True].pack_lengths),
      "row_ladder": list(learners[True].row_ladder),
      "compiles_after_warmup": int(compiles),
  }


def tunix_advantages(batch: RolloutBatch, config: LearnerConfig) -> np.ndarray:
  """The advantages our learner trains ``batch`` on (``losses.group_advantages`` with the
  config's normalisation), handed to Tunix so that both sides train on the same ones."""
  return np.asarray(group_advantages(batch.scores, batch.group_ids,
                                     normalize_std=config.normalize_std, eps=config.adv_eps,
                                     mask=batch.row_valid))


def tunix_column(peer_python: str, seed: int, config: LearnerConfig,
                 batches: Sequence[RolloutBatch], untimed: int,
                 ours: dict[str, Any], log=print) -> dict[str, Any]:
  """Tunix's GRPO train step on ``batches`` from the tiny model's ``seed`` weights."""
  import tempfile
  from pathlib import Path

  from sagc_jax.bench.peer import run_worker
  from sagc_jax.models.hf_io import save_pretrained

  import jax

  if jax.default_backend() != "cpu":     # the worker runs Tunix on CPU (peer.run_worker)
    raise ValueError(f"peer_python: Tunix runs on CPU, but this learner runs on "
                     f"{jax.default_backend()!r}; run with JAX_PLATFORMS=cpu to compare")
  from sagc_jax.models.tiny import EOS_ID

  cfg = tiny_config()
  jobs = [dict(prompt_ids=b.prompt_tokens.tolist(), completion_ids=b.response_tokens.tolist(),
               completion_mask=b.response_mask.astype(int).tolist(),
               advantages=tunix_advantages(b, config).tolist())
          for b in batches]
  with tempfile.TemporaryDirectory() as tmp:
    folder = save_pretrained(init_model(cfg, seed=seed, init_std=0.05), cfg,
                             Path(tmp) / "model")
    log(f"  tunix: {len(jobs)} steps under {peer_python}")
    out = run_worker(peer_python, dict(
        kind="learner", folder=str(folder), pad_id=0, eos_id=EOS_ID,
        beta=config.kl_coef, epsilon=config.clip_low, temperature=config.temperature,
        lr=config.lr, weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        mini_batches=config.mini_batches, batches=jobs))
  seconds = out["seconds"][untimed:]
  tokens = sum(int(b.lengths[b.row_valid].sum()) for b in batches[untimed:])
  result = {"tunix_seconds": out["seconds"], "tunix_losses": out["losses"],
            "tunix_real_tokens_per_s": tokens / sum(seconds)}
  for tag in ("packed", "padded"):
    per_step = [t / o for t, o in zip(seconds, ours[f"{tag}_step_seconds"][untimed:])]
    result.update({f"{tag}_over_tunix": sum(seconds) / sum(ours[f"{tag}_step_seconds"][untimed:]),
                   f"{tag}_over_tunix_per_step_min": min(per_step),
                   f"{tag}_over_tunix_per_step_max": max(per_step)})
  log(f"  tunix: {result['tunix_real_tokens_per_s']:.0f} tok/s; Tunix's seconds over ours: "
      f"packed {result['packed_over_tunix']:.2f}x, padded {result['padded_over_tunix']:.2f}x")
  return result


def run_mix(mix: str, steps: int, seed: int, log=print,
            peer_python: str | None = None) -> dict[str, Any]:
  vocab = tiny_config().vocab_size
  rng = np.random.default_rng(seed)
  batches = [rollout(mix, CANDIDATES[step % len(CANDIDATES)], vocab, rng)
             for step in range(steps)]
  learners = _learners(seed)
  out = {"mix": mix, **compare_layouts(mix, learners, batches, len(CANDIDATES), log)}
  if peer_python is not None:
    out.update(tunix_column(peer_python, seed, learners[True].config, batches,
                            len(CANDIDATES), out, log))
  return out


def run(steps: int = 15, seed: int = 0, log=print,
        peer_python: str | None = None) -> dict[str, Any]:
  compilation.install()
  heavy = run_mix("heavy", steps, seed, log, peer_python)
  main = run_mix("main_job", steps, seed, log, peer_python)
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
  for r in (results, results["main_job_mix"]):
    if "tunix_real_tokens_per_s" in r:
      lines.append(f"  {r['mix']:>9} Tunix GRPO step: {r['tunix_real_tokens_per_s']:.0f} tok/s; "
                   f"Tunix's seconds / ours: packed {r['packed_over_tunix']:.2f}x "
                   f"({r['packed_over_tunix_per_step_min']:.2f}-"
                   f"{r['packed_over_tunix_per_step_max']:.2f} per step), padded "
                   f"{r['padded_over_tunix']:.2f}x ({r['padded_over_tunix_per_step_min']:.2f}-"
                   f"{r['padded_over_tunix_per_step_max']:.2f})")
  return "\n".join(lines)
