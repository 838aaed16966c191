"""Sampler throughput vs transformers ``generate``, and what a straggler costs.

Part 1 (``rows_table``). For two random Llama models, the tiny CPU default (~0.8M
parameters) and a ~25M one (so that the speedup is not only Python overhead), the
same weights are saved once with ``save_pretrained`` and loaded by both stacks;
the same prompts (G = 4 rows each), batch and ``max_new_tokens``, greedy: generated
tokens per second of ``Sampler.generate`` (default settings: segmented decoding)
vs transformers' ``generate`` on torch CPU, medians of ``runs`` timed calls after
one warm-up call each, for 4 to 64 rows. ``greedy_match`` is the fraction of rows
whose tokens and length equal transformers'. ``min_speedup`` is the worst row of
the table, not a chosen one.

What bounds the speedup: each row also reports the matmul FLOPs per generated
token (``gflop_per_token``: 2 x the weights a token multiplies, plus its attention
over the average context), the FLOP rate both stacks reach (``gflops``,
``hf_gflops``), and ``matmul_ceiling_gflops``, the rate XLA:CPU reaches on this
host for the model's projections alone at that row count (a jitted chain of the
layers' q/k/v/o, MLP and output-head matmuls on random weights, no attention,
no sampling, median of timed calls). ``speedup_bound`` = ceiling / transformers'
rate: no JAX sampler on this host decodes faster than that, whatever its
scheduling.

Part 2 (straggler). A 64-row greedy call in which one row runs to
``straggler_tokens`` and the 63 others stop within 16 tokens, built without
changing the model: greedy continuations of a pool of random prompts are
computed once; the straggler is the prompt whose continuation uses the fewest
distinct tokens, every other token id becomes a stop id, and the 63 companions
are prompts that hit one of them within 16 tokens. Timed with compaction on
(``straggler_seconds``) and, in the same run, the same segmented sampler with
compaction off (``straggler_seconds_no_compaction``); the fused sampler
(one while loop over the full cache) is reported too.

Part 3 (heavy tail, ``heavy_tail.py``): 64 rows with log-normal lengths on 16 slots,
the refill sampler vs sub-calls of 16 rows vs the fused sampler
(``heavy_tail_refill_over_subcalls``, ``heavy_tail_greedy_match``).

Needs torch + transformers (``pip install -e ".[test]"``).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from sagc_jax.bench import heavy_tail
from sagc_jax.runtime import compilation
from sagc_jax.models import init_model, save_pretrained, tiny_config
from sagc_jax.sampling import Sampler, SamplingParams

EOS = 2
ROWS = (4, 8, 16, 32, 64)
GROUP = 4


def small_config():
  """~25M parameters: hidden 512, 6 layers, 8 heads (2 KV), MLP 1408, 8192-token vocab."""
  return dataclasses.replace(tiny_config(), vocab_size=8192, hidden_size=512, num_layers=6,
                             num_heads=8, num_kv_heads=2, head_dim=64, intermediate_size=1408,
                             tie_word_embeddings=False)


def _prompts(num: int, seed: int, vocab: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [rng.integers(5, vocab, rng.integers(8, 31)).tolist() for _ in range(num)]


def hf_generate(torch_model, rows: list[list[int]], max_new: int, *, eos_id: int = EOS,
                pad_id: int = 0, temperature: float = 0.0) -> tuple[np.ndarray, float]:
  """transformers ``generate`` on left-padded ``rows`` with an explicit attention mask:
  (new tokens ``[rows, max_new]``, padded with ``pad_id``; wall seconds of the call).
  ``temperature`` 0 = greedy, else plain sampling at that temperature (top-k/top-p off)."""
  import torch

  width = max(map(len, rows))
  ids = np.full((len(rows), width), pad_id, np.int64)
  mask = np.zeros_like(ids)
  for i, row in enumerate(rows):
    ids[i, width - len(row):] = row
    mask[i, width - len(row):] = 1
  sampling = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
              if temperature > 0 else dict(do_sample=False))
  with torch.no_grad():
    start = time.perf_counter()
    out = torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                               max_new_tokens=max_new, eos_token_id=eos_id,
                               pad_token_id=pad_id, **sampling)
    seconds = time.perf_counter() - start
  new = out[:, width:].numpy()
  return np.pad(new, ((0, 0), (0, max_new - new.shape[1])), constant_values=pad_id), seconds


def _projection_shapes(cfg) -> list[tuple[int, int]]:
  """(in, out) of every matmul one token's forward pass multiplies, output head included."""
  h, q, kv, m = (cfg.hidden_size, cfg.num_heads * cfg.head_dim,
                 cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size)
  layer = [(h, q), (h, kv), (h, kv), (q, h), (h, m), (h, m), (m, h)]
  return layer * cfg.num_layers + [(h, cfg.vocab_size)]


def _gflop_per_token(cfg, context: float) -> float:
  """Matmul FLOPs of one decoded token: projections plus attention over ``context``."""
  weights = sum(a * b for a, b in _projection_shapes(cfg))
  attention = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
  return (2 * weights + attention) / 1e9


def _matmul_ceiling_gflops(cfg, rows: int, runs: int = 20) -> float:
  """The FLOP rate XLA:CPU reaches for one decode step's projections at ``rows`` rows."""
  import jax.numpy as jnp

  shapes = _projection_shapes(cfg)
  rng = np.random.default_rng(0)
  weights = [jnp.asarray(rng.standard_normal(s, np.float32) * 0.02) for s in shapes]
  inputs = {a: jnp.asarray(rng.standard_normal((rows, a), np.float32)) for a, _ in shapes}

  @jax.jit
  def projections(inputs, weights):      # every product is an output: none is elided
    return [inputs[w.shape[0]] @ w for w in weights]

  jax.block_until_ready(projections(inputs, weights))
  times = []
  for _ in range(runs):
    start = time.perf_counter()
    jax.block_until_ready(projections(inputs, weights))
    times.append(time.perf_counter() - start)
  gflop = rows * _gflop_per_token(cfg, context=0)        # the projections only
  return gflop / float(np.median(times))


def hf_lengths(tokens: np.ndarray, eos_id: int = EOS) -> np.ndarray:
  """Generated tokens per row of ``hf_generate``'s output: up to and including the first
  ``eos_id``, else the full width (cut at ``max_new``)."""
  hit = tokens == eos_id
  return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, tokens.shape[1])


def _timed(sampler, model, prompts, group_size, runs, seed):
  sampler.generate(model, prompts, group_size, seed)                 # first call
  batches = [sampler.generate(model, prompts, group_size, seed) for _ in range(runs)]
  return batches, float(np.median([b.seconds for b in batches]))


def _throughput(name, model, cfg, torch_model, rows: int, max_new_tokens: int, runs: int,
                seed: int) -> dict[str, Any]:
  """One batch shape: ours vs transformers, greedy, medians of ``runs`` calls."""
  prompt_ids = _prompts(rows // GROUP, seed, cfg.vocab_size)
  params = SamplingParams(max_new_tokens, temperature=0.0, stop_ids=(EOS,))
  sampler = Sampler(model, params, row_buckets=(rows,), prompt_buckets=(32,),
                    group_sizes=(GROUP,))
  start = time.perf_counter()
  sampler.warmup(model)
  warmup_s = time.perf_counter() - start
  before = compilation.compile_count()
  ours, ours_s = _timed(sampler, model, prompt_ids, GROUP, runs, seed)
  compiles = compilation.compile_count() - before
  batch = ours[0]
  hf_rows = [p for p in prompt_ids for _ in range(GROUP)]
  hf_generate(torch_model, hf_rows, max_new_tokens)                   # warm-up
  hf_runs = [hf_generate(torch_model, hf_rows, max_new_tokens) for _ in range(runs)]
  hf_tokens, hf_s = hf_runs[0][0], float(np.median([s for _, s in hf_runs]))
  hf_len = hf_lengths(hf_tokens)
  match = [bool(batch.lengths[r] == hf_len[r]
                and np.array_equal(batch.response_tokens[r, :hf_len[r]], hf_tokens[r, :hf_len[r]]))
           for r in range(rows)]
  tokens_per_s = int(batch.lengths.sum()) / ours_s
  hf_tokens_per_s = int(hf_len.sum()) / hf_s
  # Average context of a decoded token: its prompt plus half its response so far.
  context = float(np.mean([len(p) for p in prompt_ids])) + float(batch.lengths.mean()) / 2
  per_token = _gflop_per_token(cfg, context)
  ceiling = _matmul_ceiling_gflops(cfg, rows)
  return {"model": name, "rows": rows, "generated_tokens": int(batch.lengths.sum()),
          "seconds": ours_s, "hf_seconds": hf_s, "tokens_per_s": tokens_per_s,
          "hf_tokens_per_s": hf_tokens_per_s, "speedup": tokens_per_s / hf_tokens_per_s,
          "greedy_match": float(np.mean(match)), "compiles_after_warmup": int(compiles),
          "executables": sampler.num_executables, "warmup_seconds": warmup_s,
          "gflop_per_token": per_token, "gflops": tokens_per_s * per_token,
          "hf_gflops": hf_tokens_per_s * per_token, "matmul_ceiling_gflops": ceiling,
          "speedup_bound": ceiling / (hf_tokens_per_s * per_token)}


def _straggler_batch(model, cfg, tokens: int, seed: int, pool: int = 256
                     ) -> tuple[list[list[int]], tuple[int, ...]]:
  """64 prompts and stop ids: row 63 runs ``tokens`` tokens, the others <= 16 (greedy)."""
  free = Sampler(model, SamplingParams(tokens, temperature=0.0, stop_ids=(EOS,)),
                 row_buckets=(pool,), prompt_buckets=(32,), decode_segment=0)
  prompts = _prompts(pool, seed + 1, cfg.vocab_size)
  run = free.generate(model, prompts, 1, seed)
  full = [r for r in range(pool) if run.lengths[r] == tokens]
  if not full:
    raise RuntimeError("no greedy continuation reached the straggler length")
  used = {r: set(run.response_tokens[r].tolist()) for r in full}
  straggler = min(full, key=lambda r: len(used[r]))
  stop_ids = tuple(sorted(set(range(cfg.vocab_size)) - used[straggler]))
  stop = np.isin(run.response_tokens[:, :16], stop_ids).any(axis=1)
  companions = [r for r in range(pool) if r != straggler and stop[r]][:63]
  if len(companions) < 63:
    raise RuntimeError(f"only {len(companions)} prompts stop within 16 tokens")
  return [prompts[r] for r in companions] + [prompts[straggler]], stop_ids


def _straggler(model, cfg, tokens: int, runs: int, seed: int, segment: int) -> dict[str, Any]:
  prompts, stop_ids = _straggler_batch(model, cfg, tokens, seed)
  params = SamplingParams(tokens, temperature=0.0, stop_ids=stop_ids)
  out = {}
  for label, kwargs in (("compaction", {}), ("no_compaction", dict(compaction=False)),
                        ("fused", dict(decode_segment=0))):
    kwargs = {"decode_segment": segment, **kwargs}
    sampler = Sampler(model, params, row_buckets=(64,), prompt_buckets=(32,), **kwargs)
    sampler.warmup(model)
    batches, seconds = _timed(sampler, model, prompts, 1, runs, seed)
    lengths = batches[0].lengths
    out[label] = {"seconds": seconds, "decode_slots": batches[0].decode_slots,
                  "longest": int(lengths.max()), "second_longest": int(np.sort(lengths)[-2])}
  return {"rows": 64, "straggler_tokens": tokens, "decode_segment": segment,
          "straggler_seconds": out["compaction"]["seconds"],
          "straggler_seconds_no_compaction": out["no_compaction"]["seconds"],
          "straggler_seconds_fused": out["fused"]["seconds"],
          "straggler_speedup": out["no_compaction"]["seconds"] / out["compaction"]["seconds"],
          "detail": out}


def run(steps: int = 3, max_new_tokens: int = 128, straggler_tokens: int = 256,
        straggler_segment: int = 32, seed: int = 0) -> dict[str, Any]:
  try:
    import torch
    from transformers import AutoModelForCausalLM
  except ImportError as err:
    raise SystemExit(f"the sampler benchmark needs torch and transformers "
                     f"(pip install -e '.[test]'): {err}") from None
  torch.set_num_threads(max(os.cpu_count() or 1, 1))
  compilation.install()
  table, models = [], {}
  for name, cfg in (("tiny", tiny_config()), ("small_25m", small_config())):
    model = init_model(cfg, seed=seed, init_std=0.1 if name == "tiny" else 0.05)
    with tempfile.TemporaryDirectory() as folder:
      save_pretrained(model, cfg, folder)
      torch_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model)))
    models[name] = {"parameters": int(params), "hidden": cfg.hidden_size,
                    "layers": cfg.num_layers, "vocab": cfg.vocab_size}
    for rows in ROWS:
      row = _throughput(name, model, cfg, torch_model, rows, max_new_tokens, steps, seed)
      print(f"  {name:>9} rows {rows:>3}: ours {row['tokens_per_s']:7.0f} tok/s  transformers "
            f"{row['hf_tokens_per_s']:7.0f} tok/s  speedup {row['speedup']:5.2f}x  "
            f"greedy_match {row['greedy_match']:.3f}  GFLOP/s ours {row['gflops']:.0f} "
            f"hf {row['hf_gflops']:.0f} matmul ceiling {row['matmul_ceiling_gflops']:.0f} "
            f"(bound {row['speedup_bound']:.2f}x)", flush=True)
      table.append(row)
    if name == "tiny":
      straggler = _straggler(model, cfg, straggler_tokens, steps, seed, straggler_segment)
      print(f"  straggler: {straggler['straggler_seconds']:.3f} s with compaction, "
            f"{straggler['straggler_seconds_no_compaction']:.3f} s without", flush=True)
      tail = heavy_tail.run(steps, model=model, cfg=cfg, seed=seed)
  return {"models": models, "max_new_tokens": max_new_tokens, "runs": steps,
          "torch_threads": torch.get_num_threads(), "rows_table": table,
          "min_speedup": min(r["speedup"] for r in table),
          "max_speedup": max(r["speedup"] for r in table),
          "min_speedup_bound": min(r["speedup_bound"] for r in table),
          "greedy_match": min(r["greedy_match"] for r in table),
          "compiles_after_warmup": (sum(r["compiles_after_warmup"] for r in table)
                                    + tail["heavy_tail_compiles_after_warmup"]),
          "executables": max(r["executables"] for r in table), **straggler,
          "heavy_tail": tail,
          **{k: v for k, v in tail.items() if k.startswith("heavy_tail_")}}


def report(results: dict[str, Any]) -> str:
  lines = [f"sampler vs transformers generate (greedy, G={GROUP}, max_new_tokens="
           f"{results['max_new_tokens']}, median of {results['runs']} calls)",
           f"{'model':>10} {'rows':>5} {'ours tok/s':>11} {'hf tok/s':>9} {'speedup':>8} "
           f"{'greedy_match':>13} {'GFLOP/s':>8} {'hf GFLOP/s':>11} {'ceiling':>8} "
           f"{'bound':>6}"]
  for row in results["rows_table"]:
    lines.append(f"{row['model']:>10} {row['rows']:>5} {row['tokens_per_s']:>11.0f} "
                 f"{row['hf_tokens_per_s']:>9.0f} {row['speedup']:>8.2f} "
                 f"{row['greedy_match']:>13.3f} {row['gflops']:>8.1f} "
                 f"{row['hf_gflops']:>11.1f} {row['matmul_ceiling_gflops']:>8.1f} "
                 f"{row['speedup_bound']:>6.2f}")
  lines.append(f"speedup min {results['min_speedup']:.2f}x / max {results['max_speedup']:.2f}x, "
               f"greedy_match (worst row) {results['greedy_match']:.3f}, compiles after "
               f"warm-up {results['compiles_after_warmup']}, executables (largest sampler) "
               f"{results['executables']}")
  lines.append(f"straggler ({results['rows']} rows, one runs {results['straggler_tokens']} "
               f"tokens, 63 stop within 16; segment {results['decode_segment']}): "
               f"{results['straggler_seconds']:.3f} s with compaction, "
               f"{results['straggler_seconds_no_compaction']:.3f} s without "
               f"({results['straggler_speedup']:.2f}x), fused sampler "
               f"{results['straggler_seconds_fused']:.3f} s")
  lines.append(heavy_tail.report(results["heavy_tail"]))
  return "\n".join(lines)
