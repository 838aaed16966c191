"""The sampler and learner benchmarks on a real pretrained model, natural rollouts.

Why: the random-weight benchmarks (``sampler.py``, ``learner.py``) fix the lengths or
draw them from a chosen mix. A real chat model decides its own lengths: rows stop at
its EOS at natural, heavy-tailed lengths, and that is where a sampler that stops
finished rows early (and a learner that packs mixed lengths) gains or loses. This
module runs both on ``--model`` (``python -m sagc_jax.bench {sampler,learner} --model
MODEL``): a local HF folder, a ``.gguf`` file or the built-in
``smollm2-135m-instruct`` (converted once into the local cache by
``models.gguf_import.cached_import``), loaded in float32 by both stacks.

Prompts: the built-in word problems (``data.word_problems.generate_problem``, seeded),
story + instruction, through the tokenizer's chat template with the generation prompt
(``models.tokenizer.encode_prompts``; a tokenizer without a template, such as the tiny
test tokenizer, gets the plain text, reported as ``chat_template: false``). G = 4 rows
per prompt, rows / 4 prompts. Stop id: the tokenizer's EOS (SmolLM2: ``<|im_end|>``);
pad id: its pad id, else EOS. Sampling at temperature 0.7 (top-k / top-p off), as
``configs/smollm2_cpu.py`` samples.

Sampler (``run_sampler``), per row count of ``rows``: our ``Sampler`` (default
settings: segmented decoding with compaction; row bucket = rows, prompt bucket = the
smallest power of 2 >= the longest prompt) after ``warmup`` and one untimed call, and
transformers ``generate`` (``do_sample``, explicit attention mask, left padding) after
one untimed call, then ``steps`` timed calls each, call i with seed ``seed + 1 + i`` on
both sides. Both are natural rollouts with different random streams, so each side
reports its own generated tokens (up to and including EOS), wall seconds of the calls
(ours: around ``Sampler.generate``, host work included, as for ``generate``), tokens/s
and length distribution (mean, p50, p90, max, share cut at ``max_new_tokens``).
``speedup`` = ours tokens/s / transformers tokens/s; ``wall_ratio`` = transformers wall
seconds / ours for the same calls (the two differ when the lengths do).
``compiles_after_warmup`` (XLA compilations during our calls after ``warmup``) must be 0.

Learner (``run_learner``): ``1 + steps`` natural rollouts of our sampler at the largest
row count (real prompt tokens, real sampled responses and their log-probs; random
scores, which move no cost) are trained on by two learners on the same real weights,
packed and padded (``learner.compare_layouts``): GRPO preset with kl_coef 0 (no
reference model) with the minibatches, microbatches, remat, attention and logits
chunking of ``configs/smollm2_cpu.py`` (``config.smollm2_cpu_config``);
response buckets (128, 256, 512) capped at ``max_new_tokens``. Reported per layout:
padding efficiency (as in ``learner.py``), trained response tokens per second over the
timed steps (the first is not timed), and compilations after warm-up (must be 0).

Needs torch + transformers (``pip install -e ".[test]"``); GGUF sources also need the
``smollm`` extra.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sagc_jax.bench.learner import compare_layouts, layout_learners
from sagc_jax.bench.sampler import hf_generate, hf_lengths
from sagc_jax.data.word_problems import INSTRUCTION, generate_problem
from sagc_jax.models import encode_prompts, from_pretrained, load_tokenizer
from sagc_jax.models import gguf_import
from sagc_jax.models.tokenizer import has_chat_template
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.runtime import compilation, storage
from sagc_jax.sampling import Sampler, SamplingParams
from sagc_jax.training.build import rollout_batch

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DEFAULT_ROWS", "GROUP", "TEMPERATURE", "chat_prompts",
           "learner_config", "length_stats", "progress", "prompt_bucket", "report_learner",
           "report_sampler", "resolve_model", "response_buckets", "run_learner", "run_sampler"]

from sagc_jax.bench.defaults import DEFAULT_MAX_NEW_TOKENS, DEFAULT_ROWS, GROUP, TEMPERATURE
RESPONSE_BUCKETS = (128, 256, 512)


def progress(line: str) -> None:
  print(line, flush=True)


def resolve_model(source: str, cache: str = "", log: Callable[[str], None] = progress) -> Path:
  """The HF folder of ``source``: a local HF folder as is; a ``.gguf`` file or a built-in
  name converted once into ``storage.cache_root(cache)/gguf`` and reused. Raises
  ValueError (one line, without the source itself) for anything else."""
  if gguf_import.is_gguf_source(source):
    return gguf_import.cached_import(source, storage.cache_root(cache), dtype="float32",
                                     log=log)
  folder = Path(source).expanduser()
  names = ", ".join(gguf_import.BUILTIN_SOURCES)
  if not folder.is_dir():
    raise ValueError(f"no such folder; expected a local HF folder, a .gguf file or a "
                     f"built-in name ({names})")
  if not (folder / "config.json").is_file():
    raise ValueError("the folder has no config.json (not a Hugging Face checkpoint folder)")
  return folder.absolute()


def chat_prompts(tokenizer, num: int, seed: int) -> tuple[list[list[int]], bool]:
  """Token ids of ``num`` word problems (story + instruction) and whether the chat
  template was used (else the plain text, with the tokenizer's special tokens)."""
  rng = np.random.default_rng(seed)
  texts = [f"{generate_problem(rng)['question']}\n\n{INSTRUCTION}" for _ in range(num)]
  return encode_prompts(tokenizer, texts), has_chat_template(tokenizer)


def prompt_bucket(prompts: Sequence[Sequence[int]]) -> int:
  """The smallest power of 2 >= the longest prompt."""
  return 1 << (max(len(p) for p in prompts) - 1).bit_length()


def response_buckets(max_new_tokens: int) -> tuple[int, ...]:
  """(128, 256, 512) capped at ``max_new_tokens``, which is always the last bucket."""
  return tuple(b for b in RESPONSE_BUCKETS if b < max_new_tokens) + (max_new_tokens,)


def length_stats(lengths: np.ndarray, ended: np.ndarray) -> dict[str, float]:
  """Response lengths (tokens, stop token included) and the share of rows that never
  reached the stop id (cut at ``max_new_tokens``)."""
  lengths = np.asarray(lengths)
  return {"mean": float(lengths.mean()), "p50": float(np.median(lengths)),
          "p90": float(np.percentile(lengths, 90)), "max": int(lengths.max()),
          "cut_share": float(1.0 - np.mean(ended))}


def _side(calls: list[dict], lengths: np.ndarray, ended: np.ndarray) -> dict[str, Any]:
  tokens = int(sum(c["tokens"] for c in calls))
  seconds = float(sum(c["seconds"] for c in calls))
  return {"generated_tokens": tokens, "seconds": seconds,
          "median_call_seconds": float(np.median([c["seconds"] for c in calls])),
          "tokens_per_s": tokens / seconds, "length": length_stats(lengths, ended),
          "calls": calls}


def with_rope_theta(folder: str | os.PathLike, theta: float) -> Path:
  """``folder`` with RoPE theta ``theta`` (a sibling folder: config.json rewritten, every
  other file linked), for comparing with a peer whose Llama ignores the config's."""
  folder = Path(folder)
  out = folder.with_name(f"{folder.name}-rope{theta:g}")
  out.mkdir(exist_ok=True)
  for f in folder.iterdir():
    if f.name != "config.json" and not (out / f.name).exists():
      (out / f.name).symlink_to(f.resolve())
  config = storage.read_json(folder / "config.json")
  config["rope_theta"] = theta                       # transformers 4's key
  if isinstance(config.get("rope_parameters"), dict):  # transformers 5's
    config["rope_parameters"]["rope_theta"] = theta
  (out / "config.json").write_text(json.dumps(config, indent=1))
  return out


def load_model(folder: str | os.PathLike) -> "_Loaded":
  """A real model's float32 weights, tokenizer and ids (for the benchmarks)."""
  return _Loaded(Path(folder))


class _Loaded:
  """Our model, the tokenizer and the ids of one HF folder."""

  def __init__(self, folder: Path):
    self.folder = folder
    self.model, self.cfg = from_pretrained(folder, jnp.float32)
    self.tokenizer = load_tokenizer(folder)
    if self.tokenizer.eos_token_id is None:
      raise ValueError(f"the tokenizer of {folder} has no EOS token: nothing ends a response")
    self.eos_id = int(self.tokenizer.eos_token_id)
    pad = self.tokenizer.pad_token_id
    self.pad_id = self.eos_id if pad is None else int(pad)

  def sampler(self, rows: int, bucket: int, max_new_tokens: int) -> Sampler:
    params = SamplingParams(max_new_tokens, temperature=TEMPERATURE, stop_ids=(self.eos_id,),
                            pad_id=self.pad_id)
    return Sampler(self.model, params, row_buckets=(rows,), prompt_buckets=(bucket,),
                   group_sizes=(GROUP,))

  def describe(self, source: str) -> dict[str, Any]:
    cfg = self.cfg
    params = sum(x.size for x in jax.tree.leaves(nnx.state(self.model)))
    return {"source": source, "folder": str(self.folder), "family": cfg.model_type,
            "parameters": int(params), "layers": cfg.num_layers, "hidden": cfg.hidden_size,
            "vocab": cfg.vocab_size, "dtype": "float32", "eos_id": self.eos_id,
            "pad_id": self.pad_id}


def _ours(loaded: _Loaded, sampler: Sampler, prompts, runs: int, seed: int, rows: int, log
          ) -> tuple[dict[str, Any], list]:
  """Warm-up, one untimed call, ``runs`` timed calls of our sampler."""
  start = time.perf_counter()
  sampler.warmup(loaded.model)
  warmup_s = time.perf_counter() - start
  log(f"  ours rows {rows:>3}: warm-up (compile) {warmup_s:.1f} s")
  before = compilation.compile_count()
  calls, batches = [], []
  for i in range(runs + 1):
    start = time.perf_counter()
    batch = sampler.generate(loaded.model, prompts, GROUP, seed + i)
    seconds = time.perf_counter() - start
    tokens = int(batch.lengths.sum())
    label = "untimed" if i == 0 else f"{i}/{runs}"
    log(f"  ours rows {rows:>3} call {label}: {seconds:.2f} s, {tokens} tokens, longest "
        f"{int(batch.lengths.max())}")
    if i:
      calls.append({"seconds": seconds, "device_seconds": batch.seconds, "tokens": tokens})
      batches.append(batch)
  compiles = compilation.compile_count() - before
  valid = [b.row_valid for b in batches]
  lengths = np.concatenate([b.lengths[v] for b, v in zip(batches, valid)])
  last = [b.response_tokens[np.arange(len(b.lengths)), np.maximum(b.lengths - 1, 0)][v]
          for b, v in zip(batches, valid)]
  ended = np.concatenate(last) == loaded.eos_id
  out = _side(calls, lengths, ended)
  out.update(compiles_after_warmup=int(compiles), warmup_seconds=warmup_s,
             executables=sampler.num_executables)
  return out, batches


def _hf(torch_model, loaded: _Loaded, prompts, runs: int, seed: int, max_new: int, rows: int,
        log) -> dict[str, Any]:
  """One untimed and ``runs`` timed calls of transformers ``generate``."""
  import torch

  hf_rows = [p for p in prompts for _ in range(GROUP)]
  calls, lengths, ended = [], [], []
  for i in range(runs + 1):
    torch.manual_seed(seed + i)
    tokens, seconds = hf_generate(torch_model, hf_rows, max_new, eos_id=loaded.eos_id,
                                  pad_id=loaded.pad_id, temperature=TEMPERATURE)
    n = hf_lengths(tokens, loaded.eos_id)
    label = "untimed" if i == 0 else f"{i}/{runs}"
    log(f"  hf   rows {rows:>3} call {label}: {seconds:.2f} s, {int(n.sum())} tokens, longest "
        f"{int(n.max())}")
    if i:
      calls.append({"seconds": seconds, "tokens": int(n.sum())})
      lengths.append(n)
      ended.append((tokens == loaded.eos_id).any(axis=1))
  return _side(calls, np.concatenate(lengths), np.concatenate(ended))


def _torch_model(folder: Path):
  try:
    import torch
    from transformers import AutoModelForCausalLM
  except ImportError as err:
    raise SystemExit(f"the sampler benchmark needs torch and transformers "
                     f"(pip install -e '.[test]'): {err}") from None
  torch.set_num_threads(max(os.cpu_count() or 1, 1))
  return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def _check(rows: Sequence[int], max_new_tokens: int, steps: int) -> tuple[int, ...]:
  rows = tuple(int(r) for r in rows)
  if not rows or any(r <= 0 or r % GROUP for r in rows):
    raise ValueError(f"rows={rows}: every row count must be a positive multiple of G={GROUP}")
  if max_new_tokens <= 0 or steps <= 0:
    raise ValueError(f"max_new_tokens={max_new_tokens} and steps={steps} must be positive")
  return rows


def run_sampler(folder: str | os.PathLike, rows: Sequence[int] = DEFAULT_ROWS,
                max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, steps: int = 1, seed: int = 0,
                source: str | None = None, log: Callable[[str], None] = progress
                ) -> dict[str, Any]:
  """Ours vs transformers ``generate`` on natural rollouts, one entry per row count."""
  rows = _check(rows, max_new_tokens, steps)
  compilation.install()
  folder = Path(folder)
  loaded = _Loaded(folder)
  torch_model = _torch_model(folder)
  import torch

  table, templated = [], False
  for n in rows:
    prompts, templated = chat_prompts(loaded.tokenizer, n // GROUP, seed)
    bucket = prompt_bucket(prompts)
    ours, _ = _ours(loaded, loaded.sampler(n, bucket, max_new_tokens), prompts, steps, seed,
                    n, log)
    hf = _hf(torch_model, loaded, prompts, steps, seed, max_new_tokens, n, log)
    row = {"rows": n, "prompts": len(prompts), "prompt_bucket": bucket,
           "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
           "ours": ours, "hf": hf, "speedup": ours["tokens_per_s"] / hf["tokens_per_s"],
           "wall_ratio": hf["seconds"] / ours["seconds"],
           "compiles_after_warmup": ours["compiles_after_warmup"]}
    log(f"  rows {n:>3}: ours {ours['tokens_per_s']:7.1f} tok/s (mean len "
        f"{ours['length']['mean']:.0f}), transformers {hf['tokens_per_s']:7.1f} tok/s (mean "
        f"len {hf['length']['mean']:.0f}): speedup {row['speedup']:.2f}x, wall ratio "
        f"{row['wall_ratio']:.2f}x, compiles after warm-up {ours['compiles_after_warmup']}")
    table.append(row)
  return {"kind": "real_model_sampler", "model": loaded.describe(source or str(folder)),
          "chat_template": templated, "group": GROUP, "temperature": TEMPERATURE,
          "max_new_tokens": max_new_tokens, "runs": steps, "seed": seed,
          "torch_threads": torch.get_num_threads(), "rows_table": table,
          "min_speedup": min(r["speedup"] for r in table),
          "max_speedup": max(r["speedup"] for r in table),
          "compiles_after_warmup": sum(r["compiles_after_warmup"] for r in table)}


def learner_config(max_new_tokens: int, rows: int) -> LearnerConfig:
  """The learner ``configs/smollm2_cpu.py`` trains this model with on CPU (taken from
  ``config.smollm2_cpu_config``, so the two cannot drift apart), with its rows per
  microbatch kept for a batch of ``rows`` (the memory per microbatch is what that
  config sizes: ``grad_accum`` grows with the rows)."""
  from sagc_jax.config import smollm2_cpu_config

  config = smollm2_cpu_config()
  per_micro = config.rollout.rollouts_per_step // (config.learner.mini_batches
                                                   * config.learner.grad_accum)
  config.learner.grad_accum = max(1, rows // (config.learner.mini_batches * per_micro))
  # Only the learner section, resolved as a run resolves it, with this benchmark's
  # response budget (the rest of the config describes the training run, not this).
  return LearnerConfig.from_dict(config.learner.to_dict(), max_new_tokens=max_new_tokens,
                                 temperature=config.rollout.temperature,
                                 train_steps=config.train.steps)


def run_learner(folder: str | os.PathLike, rows: Sequence[int] = DEFAULT_ROWS,
                max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, steps: int = 2, seed: int = 0,
                source: str | None = None, log: Callable[[str], None] = progress
                ) -> dict[str, Any]:
  """Packed vs padded learner on ``1 + steps`` natural rollouts at the largest row count."""
  rows = max(_check(rows, max_new_tokens, steps))
  compilation.install()
  folder = Path(folder)
  loaded = _Loaded(folder)
  prompts, templated = chat_prompts(loaded.tokenizer, rows // GROUP, seed)
  bucket = prompt_bucket(prompts)
  _, samples = _ours(loaded, loaded.sampler(rows, bucket, max_new_tokens), prompts,
                     steps + 1, seed, rows, log)
  rng = np.random.default_rng(seed)
  batches = [rollout_batch(s, rng.normal(size=s.num_rows)) for s in samples]
  model = loaded.describe(source or str(folder))
  del loaded, samples                                 # the sampler's copy of the weights
  config = learner_config(max_new_tokens, rows)
  buckets = response_buckets(max_new_tokens)
  learners = layout_learners(lambda: from_pretrained(folder, jnp.float32)[0], config, (rows,),
                             (bucket,), buckets)
  result = compare_layouts("real", learners, batches, 1, log)
  return {"kind": "real_model_learner", "model": model, "chat_template": templated,
          "group": GROUP, "temperature": TEMPERATURE, "max_new_tokens": max_new_tokens,
          "rows": rows, "prompt_bucket": bucket, "response_buckets": list(buckets),
          "learner": {"algorithm": config.algorithm, "kl_coef": config.kl_coef,
                      "mini_batches": config.mini_batches, "grad_accum": config.grad_accum,
                      "remat": config.remat, "attention": config.attention},
          **result}


def report_sampler(results: dict[str, Any]) -> str:
  m = results["model"]
  lines = [f"sampler vs transformers generate on {m['source']} ({m['parameters'] / 1e6:.0f}M "
           f"parameters, float32): natural rollouts at T={results['temperature']}, "
           f"G={results['group']}, max_new_tokens={results['max_new_tokens']}, "
           f"{results['runs']} timed call(s), chat template {results['chat_template']}",
           f"{'rows':>5} {'ours tok/s':>11} {'hf tok/s':>9} {'speedup':>8} {'wall x':>7} "
           f"{'ours s':>8} {'hf s':>8}  {'ours len mean/p50/p90/max cut':>31}  "
           f"{'hf len mean/p50/p90/max cut':>29} {'compiles':>8}"]

  def dist(d):
    return (f"{d['mean']:.0f}/{d['p50']:.0f}/{d['p90']:.0f}/{d['max']} "
            f"{100 * d['cut_share']:.0f}%")
  for r in results["rows_table"]:
    o, h = r["ours"], r["hf"]
    lines.append(f"{r['rows']:>5} {o['tokens_per_s']:>11.1f} {h['tokens_per_s']:>9.1f} "
                 f"{r['speedup']:>8.2f} {r['wall_ratio']:>7.2f} {o['seconds']:>8.2f} "
                 f"{h['seconds']:>8.2f}  {dist(o['length']):>31}  {dist(h['length']):>29} "
                 f"{r['compiles_after_warmup']:>8}")
  lines.append(f"speedup min {results['min_speedup']:.2f}x / max {results['max_speedup']:.2f}x"
               f", compiles after warm-up {results['compiles_after_warmup']}")
  return "\n".join(lines)


def report_learner(results: dict[str, Any]) -> str:
  m, r = results["model"], results
  lines = [f"learner, packed vs padded, on {m['source']} ({m['parameters'] / 1e6:.0f}M "
           f"parameters, float32, GRPO kl_coef={r['learner']['kl_coef']}, remat "
           f"{r['learner']['remat']}): {r['rows']} rows of natural rollouts, prompt bucket "
           f"{r['prompt_bucket']}, response buckets {r['response_buckets']}",
           f"  response length mean {r['response_length']['mean']:.0f}, p50 "
           f"{r['response_length']['p50']:.0f}, p90 {r['response_length']['p90']:.0f}, max "
           f"{r['response_length']['max']} over {r['steps']} steps ({r['timed_steps']} timed)",
           f"  {'layout':>7} {'pad_eff':>8} {'tok/s':>8} {'execs':>6}",
           f"  {'packed':>7} {r['padding_efficiency']:>8.3f} {r['real_tokens_per_s']:>8.1f} "
           f"{r['executables']:>6}",
           f"  {'padded':>7} {r['unpacked_padding_efficiency']:>8.3f} "
           f"{r['unpacked_real_tokens_per_s']:>8.1f} {r['unpacked_executables']:>6}",
           f"  speedup (padded s / packed s) {r['speedup']:.2f}x, compiles after warm-up "
           f"{r['compiles_after_warmup']}"]
  return "\n".join(lines)
