"""Sampler throughput vs transformers ``generate``, and the straggler cost curve.

Part 1 (throughput). The same tiny random Llama weights (saved once with
``save_pretrained`` and loaded by both stacks), the same prompts, batch and
``max_new_tokens``, greedy decoding: generated tokens per second of
``Sampler.generate`` vs transformers' ``generate`` on torch CPU, medians of
``runs`` timed calls after one warm-up call each. ``greedy_match`` is the
fraction of rows whose tokens and length equal transformers' exactly.
``compiles_after_warmup`` counts XLA compilations during the timed calls.

Part 2 (straggler cost). Sampling with temperature 1 and a set of stop tokens
gives geometric-ish response lengths; over many seeds the wall-clock of one
``generate`` call is regressed on the longest response of its batch (the
while-loop runs until that row is done). Reported as a fit
``seconds = fixed + per_step * longest`` and a table by longest-response bins.

Needs torch + transformers (``pip install -e ".[test]"``).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import numpy as np

from sagc_jax import compile_count
from sagc_jax.models import init_model, save_pretrained, tiny_config
from sagc_jax.sampling import Sampler, SamplingParams

EOS = 2


def _prompts(num: int, seed: int, vocab: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(5, vocab, rng.integers(8, 31)).tolist() for _ in range(num)]


def _hf_generate(torch_model, rows: list[list[int]], max_new: int) -> tuple[np.ndarray, float]:
  import torch

  width = max(map(len, rows))
  ids = np.zeros((len(rows), width), np.int64)
  mask = np.zeros_like(ids)
  for i, row in enumerate(rows):
    ids[i, width - len(row):] = row
    mask[i, width - len(row):] = 1
  with torch.no_grad():
    start = time.perf_counter()
    out = torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                               max_new_tokens=max_new, do_sample=False, eos_token_id=EOS,
                               pad_token_id=0)
    seconds = time.perf_counter() - start
  new = out[:, width:].numpy()
  return np.pad(new, ((0, 0), (0, max_new - new.shape[1]))), seconds


def _hf_lengths(tokens: np.ndarray) -> np.ndarray:
  hit = tokens == EOS
  return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, tokens.shape[1])


def _throughput(model, cfg, torch_model, prompts: int, group_size: int, max_new_tokens: int,
                runs: int, seed: int) -> dict[str, Any]:
  """One batch shape: ours vs transformers, greedy, medians of ``runs`` calls."""
  rows_per_call = prompts * group_size
  prompt_ids = _prompts(prompts, seed, cfg.vocab_size)
  params = SamplingParams(max_new_tokens, temperature=0.0, stop_ids=(EOS,))
  sampler = Sampler(model, params, row_buckets=(rows_per_call,), prompt_buckets=(32,))
  warm_start = time.perf_counter()
  sampler.warmup(model)
  warmup_s = time.perf_counter() - warm_start
  sampler.generate(model, prompt_ids, group_size, seed)             # first call
  before = compile_count.compile_count()
  ours = [sampler.generate(model, prompt_ids, group_size, seed) for _ in range(runs)]
  compiles = compile_count.compile_count() - before
  sampler.sink.pop()
  ours_s = float(np.median([b.seconds for b in ours]))
  batch = ours[0]
  rows = [p for p in prompt_ids for _ in range(group_size)]
  _hf_generate(torch_model, rows, max_new_tokens)                    # warm-up
  hf_runs = [_hf_generate(torch_model, rows, max_new_tokens) for _ in range(runs)]
  hf_tokens = hf_runs[0][0]
  hf_s = float(np.median([s for _, s in hf_runs]))
  hf_len = _hf_lengths(hf_tokens)
  match = [bool(batch.lengths[r] == hf_len[r]
                and np.array_equal(batch.response_tokens[r, :hf_len[r]], hf_tokens[r, :hf_len[r]]))
           for r in range(rows_per_call)]
  return {"rows": rows_per_call, "prompts": prompts, "group_size": group_size,
          "generated_tokens": int(batch.lengths.sum()), "decode_steps": batch.decode_steps,
          "seconds": ours_s, "hf_seconds": hf_s,
          "tokens_per_s": int(batch.lengths.sum()) / ours_s,
          "hf_tokens_per_s": int(hf_len.sum()) / hf_s,
          "speedup": (int(batch.lengths.sum()) / ours_s) / (int(hf_len.sum()) / hf_s),
          "greedy_match": float(np.mean(match)), "compiles_after_warmup": int(compiles),
          "warmup_seconds": warmup_s}


def _straggler_cost(model, cfg, prompts: int, group_size: int, max_new_tokens: int,
                    calls: int, seed: int) -> dict[str, Any]:
  """Wall-clock of one call vs the longest response of its batch (sampled lengths)."""
  prompt_ids = _prompts(prompts, seed, cfg.vocab_size)
  # ~10% of the vocabulary ends a response: geometric lengths, a wide spread of maxima.
  stop_ids = tuple(range(5, 15))
  sampler = Sampler(model, SamplingParams(max_new_tokens, temperature=1.0, stop_ids=stop_ids),
                    row_buckets=(prompts * group_size,), prompt_buckets=(32,))
  sampler.warmup(model)
  sampler.generate(model, prompt_ids, group_size, seed)
  points = []
  for call in range(calls):
    b = sampler.generate(model, prompt_ids, group_size, seed=1000 + call)
    points.append((int(b.lengths.max()), float(np.median(b.lengths[b.row_valid])), b.seconds))
  sampler.sink.pop()
  longest = np.array([p[0] for p in points], float)
  medians = np.array([p[1] for p in points])
  seconds = np.array([p[2] for p in points])
  per_step, fixed = np.polyfit(longest, seconds, 1)
  edges = np.unique(np.quantile(longest, [0, 0.25, 0.5, 0.75, 1.0]).round())
  table = []
  for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
    last = i == len(edges) - 2
    sel = (longest >= lo) & ((longest <= hi) if last else (longest < hi))
    if sel.any():
      table.append({"longest_from": int(lo), "longest_to": int(hi), "calls": int(sel.sum()),
                    "mean_longest": float(longest[sel].mean()),
                    "mean_median_len": float(medians[sel].mean()),
                    "mean_seconds": float(seconds[sel].mean())})
  return {"rows": prompts * group_size, "calls": calls, "fit_fixed_s": float(fixed),
          "fit_per_decode_step_s": float(per_step),
          "corr": float(np.corrcoef(longest, seconds)[0, 1]), "table": table}


def run(steps: int = 5, shapes: tuple[tuple[int, int], ...] = ((1, 4), (2, 4), (4, 4), (8, 4)),
        headline_rows: int = 8, max_new_tokens: int = 128, straggler_calls: int = 40,
        seed: int = 0) -> dict[str, Any]:
  """Throughput for each (prompts, group_size) shape, headline at ``headline_rows``."""
  try:
    import torch
    from transformers import AutoModelForCausalLM
  except ImportError as err:
    raise SystemExit(f"the sampler benchmark needs torch and transformers "
                     f"(pip install -e '.[test]'): {err}") from None
  torch.set_num_threads(max(os.cpu_count() or 1, 1))
  compile_count.install()
  cfg = tiny_config()
  model = init_model(cfg, seed=seed, init_std=0.1)
  with tempfile.TemporaryDirectory() as folder:
    save_pretrained(model, cfg, folder)
    torch_model = AutoModelForCausalLM.from_pretrained(folder).eval()
  sweep = []
  for prompts, group_size in shapes:
    row = _throughput(model, cfg, torch_model, prompts, group_size, max_new_tokens, steps, seed)
    print(f"  rows {row['rows']:>3}: ours {row['tokens_per_s']:7.0f} tok/s  transformers "
          f"{row['hf_tokens_per_s']:7.0f} tok/s  speedup {row['speedup']:5.2f}x  "
          f"greedy_match {row['greedy_match']:.3f}", flush=True)
    sweep.append(row)
  headline = next((r for r in sweep if r["rows"] == headline_rows), sweep[0])
  results = dict(headline)
  results.update({
      "model": {"family": cfg.model_type, "hidden": cfg.hidden_size, "layers": cfg.num_layers,
                "vocab": cfg.vocab_size},
      "max_new_tokens": max_new_tokens, "runs": steps,
      "torch_threads": torch.get_num_threads(),
      "greedy_match": min(r["greedy_match"] for r in sweep),
      "compiles_after_warmup": sum(r["compiles_after_warmup"] for r in sweep),
      "sweep": sweep,
      "straggler_cost": _straggler_cost(model, cfg, 8, 4, max_new_tokens * 2, straggler_calls,
                                        seed),
  })
  return results


def report(results: dict[str, Any]) -> str:
  lines = [
      f"sampler vs transformers generate (tiny {results['model']['family']}, greedy, "
      f"max_new_tokens={results['max_new_tokens']}, median of {results['runs']} calls)",
      f"{'rows':>6} {'ours tok/s':>11} {'hf tok/s':>9} {'speedup':>8} {'greedy_match':>13}"]
  for row in results["sweep"]:
    lines.append(f"{row['rows']:>6} {row['tokens_per_s']:>11.0f} {row['hf_tokens_per_s']:>9.0f} "
                 f"{row['speedup']:>8.2f} {row['greedy_match']:>13.3f}")
  lines.append(f"headline ({results['rows']} rows): speedup {results['speedup']:.2f}x, "
               f"greedy_match (all shapes) {results['greedy_match']:.3f}, "
               f"compiles_after_warmup {results['compiles_after_warmup']}")
  cost = results["straggler_cost"]
  lines.append(f"straggler cost ({cost['rows']} rows, {cost['calls']} sampled calls): seconds = "
               f"{cost['fit_fixed_s']:.4f} + {cost['fit_per_decode_step_s'] * 1e3:.3f} ms x "
               f"longest response (corr {cost['corr']:.3f})")
  lines.append(f"  {'longest':>11} {'calls':>5} {'median_len':>10} {'seconds':>8}")
  for row in cost["table"]:
    lines.append(f"  {row['longest_from']:>5}-{row['longest_to']:<5} {row['calls']:>5} "
                 f"{row['mean_median_len']:>10.1f} {row['mean_seconds']:>8.3f}")
  return "\n".join(lines)
