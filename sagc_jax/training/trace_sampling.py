"""Records a rollout trace of a run's policy (``replay.trace``): what calibrate samples.

K responses for each of N prompts of the held-out split, drawn with the run's own
sampling settings (temperature, top-p/k, response cap, stop tokens) through the
sampled evaluation sampler, in calls of the sampler's row bucket; per response its
token length, reward (the task reward mix: the run's user reward functions are left
out, as in evaluation, so DAPO's keep rule replayed from them may differ for a run
that uses some), correctness and whether it hit the cap without a stop token. A call's
seed is fixed by its first prompt and its repetition, so a rerun with the same
settings (``rollout.eval_batch`` included) draws the same responses.

Then a training step is timed at every candidate G (``time_step``): the run's own
sampler draws P(G) prompts x G responses and the run's learner trains on them, each
after a warm-up call. The decode cost ``seconds = step_s x decode_steps + slot_s x
decode_slots`` is fitted over those sampler calls (``fit_decode_cost``: rows differ
between them, so the per-row term is seen; the trace's own calls all have the
evaluation sampler's rows and are kept beside it), and ``seconds = step_s + token_s x
tokens`` over the learner's updates (``fit_learner_cost``, tokens the batch's prompt
and response tokens). Together they are the replay's ``cpu`` cost.

Resumable: each finished batch of prompts is appended to ``trace.partial.jsonl``; a
run with the same settings continues from it, and the finished trace replaces it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sagc_jax.config import config_digest
from sagc_jax.replay.trace import trace_record, write_trace
from sagc_jax.runtime import compilation
from sagc_jax.runtime.seeding import seed_for
from sagc_jax.training.build import build_eval_samplers
from sagc_jax.training.evaluation import open_policy, reader_config

__all__ = ["fit_decode_cost", "fit_learner_cost", "record_trace", "time_step",
           "PROGRESS_SECONDS"]
STEP_REPEATS = 3              # timed sampler calls and updates per G, after a warm-up one

PROGRESS_SECONDS = 10.0


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """Non-negative least squares of ``y ~ a x[:, 0] + b x[:, 1]`` (two columns: the
  solution lies on one of three supports); all on the second column if none fits."""
  best = None
  for cols in ((0, 1), (0,), (1,)):
    coef = np.zeros(2)
    coef[list(cols)] = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
    if (coef >= 0).all():
      error = float(np.sum((x @ coef - y) ** 2))
      best = min(best or (error, coef), (error, coef), key=lambda t: t[0])
  a, b = best[1] if best else (0.0, float(y.sum() / max(x[:, 1].sum(), 1.0)))
  return float(a), float(b)


def _machine() -> str:
  return " ".join(filter(None, (platform.machine(), platform.processor(),
                                f"{os.cpu_count()} cores")))


def _call_cost(samples) -> dict[str, Any]:
  """What the decode-cost fit reads of one sampler call."""
  return {"rows": int(samples.num_rows), "decode_steps": int(samples.decode_steps),
          "decode_slots": int(samples.decode_slots), "seconds": float(samples.seconds)}


def fit_decode_cost(calls: list[dict[str, Any]]) -> dict[str, Any]:
  """Non-negative least squares ``seconds = step_s x decode_steps + slot_s x
  decode_slots`` over the sampler calls: a decode step costs a fixed part (the loop, the
  weights read) and a part per row it still decodes (compaction drops finished rows, so
  a call's slots are about the sum of its rows' lengths). The calls are kept with it."""
  x = np.asarray([[c["decode_steps"], c["decode_slots"]] for c in calls], np.float64)
  y = np.asarray([c["seconds"] for c in calls], np.float64)
  step_s, slot_s = _nonnegative_fit(x, y)
  return {"model": "seconds = step_s * decode_steps + slot_s * decode_slots",
          "step_s": step_s, "slot_s": slot_s, "seconds": float(y.sum()),
          "calls": calls, "machine": _machine()}


def fit_learner_cost(updates: list[dict[str, Any]]) -> dict[str, Any]:
  """Non-negative least squares ``seconds = step_s + token_s x tokens`` over the timed
  learner updates: an update costs a fixed part (the optimizer, the host) and a part
  per token it trains. The updates are kept with it."""
  x = np.asarray([[1.0, u["tokens"]] for u in updates], np.float64)
  y = np.asarray([u["seconds"] for u in updates], np.float64)
  step_s, token_s = _nonnegative_fit(x, y)
  return {"model": "seconds = step_s + token_s * tokens", "step_s": step_s,
          "token_s": token_s, "updates": updates, "machine": _machine()}


def time_step(config: Any, inputs: Any, log: Callable[[str], None] = print
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
  """A training step timed at every candidate G: the run's sampler on P(G) held-out
  prompts x G responses and the run's learner on them, ``STEP_REPEATS`` times each
  after a warm-up call (the weights move: calibrate keeps no policy). Returns the
  sampler calls and the learner updates."""
  from sagc_jax.training.build import build_components, rollout_batch

  parts = build_components(config, inputs.model, inputs.mesh, stop_ids=inputs.stop_ids,
                           pad_id=inputs.pad_id)
  compilation.warm(parts.sampler.warmup_jobs(inputs.model) + parts.learner.warmup_jobs(),
                   log=log)
  calls, updates = [], []
  for g in config.group_sizes():
    examples = [inputs.eval_source[i % len(inputs.eval_source)]
                for i in range(config.rollout.prompts_for(g))]
    encoded = inputs.encode(examples)
    for repeat in range(STEP_REPEATS + 1):
      samples = parts.sampler.generate(inputs.model, encoded, g,
                                       seed=seed_for(config.seed, 7927, g, repeat))
      if repeat:
        calls.append({"g": int(g), **_call_cost(samples)})
    answers = [ex["answer"] for ex in examples for _ in range(g)]
    batch = rollout_batch(samples, inputs.reward_fn(inputs.decode(samples), answers).scores)
    rows = samples.num_rows
    tokens = int(samples.prompt_mask[:rows].sum() + samples.lengths[:rows].sum())
    for repeat in range(STEP_REPEATS + 1):
      start = time.perf_counter()
      parts.learner.update(batch, seed=config.seed)
      if repeat:
        updates.append({"g": int(g), "rows": int(rows), "tokens": tokens,
                        "seconds": time.perf_counter() - start})
    mean = lambda items: np.mean([c["seconds"] for c in items[-STEP_REPEATS:]])
    log(f"calibrate: a training step at G={g}: {rows} rows, sampler {mean(calls):.3f} s, "
        f"learner {mean(updates):.3f} s ({tokens} tokens)")
  return calls, updates


def _header(config, workdir: Any, prompts: int, responses: int, chunk: int,
            split: str) -> dict[str, Any]:
  r, c = config.rollout, config.controller
  return {
      "model": config.model.path or f"tiny {config.model.tiny_family} (built in)",
      "config_digest": config_digest(config),
      "workdir": None if workdir is None else str(workdir),
      "split": split, "prompts": prompts, "responses": responses, "responses_per_call": chunk,
      "seed": config.seed,
      "sampling": {"max_new_tokens": r.max_new_tokens, "temperature": r.temperature,
                   "top_p": r.top_p, "top_k": r.top_k},
      "rollout": {"mode": r.mode, "rollouts_per_step": r.rollouts_per_step,
                  "prompts_per_step": r.prompts_per_step},
      "controller": c.to_dict(),
      "learner": {"dynamic_sampling": config.learner.dynamic_sampling,
                  "dynamic_max_rounds": config.learner.dynamic_max_rounds},
  }


def _resume(partial: Path, header: dict[str, Any], log) -> list[dict[str, Any]]:
  """The finished batches of an earlier run with the same settings (none otherwise); a
  different prompt count keeps the batches that fit within it."""
  if not partial.exists():
    return []
  lines = partial.read_text().splitlines()
  # Compared as JSON reads them back (tuples are lists there).
  settings = lambda h: {k: v for k, v in json.loads(json.dumps(h)).items() if k != "prompts"}
  try:
    same = settings(json.loads(lines[0])) == settings(header)
  except (ValueError, IndexError):
    same = False
  if not same:
    log(f"calibrate: {partial} was written with other settings; starting again")
    partial.unlink()
    return []
  batches = []
  for line in lines[1:]:
    try:
      batches.append(json.loads(line))
    except ValueError:       # the line a kill cut short: that batch is sampled again
      break
  batches = [b for b in batches if b["records"][-1]["id"] < header["prompts"]]
  partial.write_text("\n".join(json.dumps(x) for x in [header, *batches]) + "\n")
  log(f"calibrate: resuming after {sum(len(b['records']) for b in batches)} prompts "
      f"from {partial}")
  return batches


def record_trace(config: Any, out: Path, *, workdir: Any = None, prompts: int = 64,
                 responses: int = 32, log: Callable[[str], None] = print) -> Path:
  """Samples the trace of ``config``'s policy (``workdir``'s newest checkpoint when
  given) into ``out/trace.jsonl`` and returns its path (module docstring)."""
  values = config.to_dict()
  # Responses per prompt in one call: the largest divisor of ``responses`` the batch holds.
  chunk = max(d for d in range(1, min(responses, values["rollout"]["eval_batch"]) + 1)
              if responses % d == 0)
  values["train"]["eval_k"] = max(chunk, 2)       # the sampled sampler's group size
  config = reader_config(values)
  out.mkdir(parents=True, exist_ok=True)
  partial = out / "trace.partial.jsonl"
  with open_policy(config, workdir, restore=workdir is not None,
                   local_dir=None if workdir is not None else out / "policy",
                   log=log) as (inputs, step):
    n = min(prompts, len(inputs.eval_source))
    if n < prompts:
      log(f"warning: the {config.data.eval_split!r} split holds {n} examples; tracing "
          f"all {n} instead of {prompts}")
    header = dict(_header(config, workdir, n, responses, chunk, config.data.eval_split),
                  checkpoint_step=step, stop_ids=list(inputs.stop_ids))
    batches = _resume(partial, header, log)
    if not partial.exists():
      partial.write_text(json.dumps(header) + "\n")
    sampler = build_eval_samplers(config, inputs.model, inputs.mesh, stop_ids=inputs.stop_ids,
                                  pad_id=inputs.pad_id)[1]
    compilation.warm(sampler.warmup_jobs(inputs.model), log=log)
    compiles_before = compilation.compile_count()
    per_call = max(sampler.row_buckets[-1] // chunk, 1)
    done = sum(len(b["records"]) for b in batches)
    start = last = time.perf_counter()
    for lo in range(done, n, per_call):
      batches.append(_sample_batch(inputs, sampler, config, lo, min(lo + per_call, n),
                                   responses, chunk))
      with partial.open("a") as f:
        f.write(json.dumps(batches[-1]) + "\n")
      now = time.perf_counter()
      if now - last >= PROGRESS_SECONDS or lo + per_call >= n:
        finished = min(lo + per_call, n)
        rate = (now - start) / (finished - done)
        log(f"calibrate: {finished}/{n} prompts x {responses} responses in "
            f"{now - start:.0f} s (about {rate * (n - finished):.0f} s left)")
        last = now
    compiled = compilation.compile_count() - compiles_before
    step_calls, updates = time_step(config, inputs, log)
  decode_cost = dict(fit_decode_cost(step_calls),
                     trace_calls=[c for b in batches for c in b["calls"]])
  header.update(decode_cost=decode_cost, learner_cost=fit_learner_cost(updates),
                compiles_after_warmup=compiled,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
  path = out / "trace.jsonl"
  write_trace(path, header, [r for b in batches for r in b["records"]])
  partial.unlink()
  return path


def _sample_batch(inputs, sampler, config, lo: int, hi: int, responses: int,
                  chunk: int) -> dict[str, Any]:
  """Prompts ``lo..hi-1`` of the split, ``responses`` each in calls of ``chunk`` per
  prompt: their trace records and the calls' costs."""
  examples = [inputs.eval_source[i] for i in range(lo, hi)]
  encoded = inputs.encode(examples)
  cap, stops = config.rollout.max_new_tokens, np.asarray(inputs.stop_ids)
  keys = ("lengths", "rewards", "correct", "truncated")
  columns = {key: [] for key in keys}       # per call: [prompts, chunk]
  calls = []
  for rep in range(responses // chunk):
    samples = sampler.generate(inputs.model, encoded, chunk,
                               seed=seed_for(config.seed, 7919, lo, rep))
    rows = samples.num_rows
    lengths = samples.lengths[:rows].astype(np.int64)
    last = samples.response_tokens[np.arange(rows), np.maximum(lengths - 1, 0)]
    truncated = (lengths >= cap) & ~np.isin(last, stops)
    texts = inputs.decode(samples)
    answers = [ex["answer"] for ex in examples for _ in range(chunk)]
    reward = inputs.reward_fn(texts, answers)
    for key, value in zip(keys, (lengths, reward.scores, reward.correct, truncated)):
      columns[key].append(np.asarray(value).reshape(len(examples), chunk))
    calls.append(_call_cost(samples))
  per_prompt = [np.concatenate(columns[key], axis=1) for key in keys]
  records = [trace_record(lo + i, len(encoded[i]), *(column[i] for column in per_prompt))
             for i in range(len(examples))]
  return {"records": records, "calls": calls}
