"""Scoring finished rows while the rest decode: the seconds a round saves.

Scenario: the heavy-tail benchmark's 64 rows (``heavy_tail.py``: greedy responses of
the tiny model forced to log-normal lengths, median 32, sigma 1.0, cap 512) through the
two samplers that finish rows before their call ends: ``refill`` (16 slots) and
``subcalls`` (sequential calls of 16 rows). A round is what ``RLStep.sample_round``
times as rollout + reward: ``Sampler.generate`` then ``StreamingScorer.finish``, with
the trainer's reward class (``RewardMix``) on the decoded texts (token ids written
out as numbers; the reference answer is "7"). Two rewards:

* ``math_verify``: math-verify in process (``reward.workers=0``), so scored on the
  sampler's own thread between programs (its timeouts need the main thread). CPU
  work on the host.
* ``external``: exact match plus a user term (``external_verifier`` below) that
  waits ``external_ms`` per completion in the reward worker process, as a sandbox or
  a judge server would; scored on the scorer's worker thread.

Per (sampler, reward): one untimed round per mode, then ``steps`` pairs of rounds with
``rollout.overlap_rewards`` off and on (the order alternates between pairs). Reported:
median, min and max of the round seconds per mode, the reward seconds the round waits
for after decoding (``tail``) and the scoring that overlapped it, ``saved_s`` =
median(off) - median(on), the per-pair savings (worst and best), whether both modes
gave the same rewards, and compilations after warm-up (must be 0).

On this CPU host the device *is* the host: XLA:CPU decodes on the same cores the
reward uses, so host-side scoring competes with decoding. On an accelerator the host
is idle while a segment runs, and the overlap is free.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

EXTERNAL_SPEC = "sagc_jax.bench.overlap:external_verifier"
EXTERNAL_MS = 10.0


def external_verifier(completions, **kwargs) -> list[float]:
  """A reward that waits ``EXTERNAL_MS`` per completion (a stand-in for a call to a
  sandbox or a judge): 1.0 for an even number of characters, else 0.0."""
  time.sleep(EXTERNAL_MS / 1000 * len(completions))
  return [float(len(c) % 2 == 0) for c in completions]


def _text(tokens: np.ndarray) -> str:
  return " ".join(str(int(t)) for t in tokens)


def _round(sampler, model, prompts, seed: int, mix, overlap: bool) -> dict[str, Any]:
  from sagc_jax.rewards.streaming import StreamingScorer

  rows = len(prompts)
  scorer = StreamingScorer(range(rows), _text,
                           lambda local, texts: mix(texts, ["7"] * len(texts)),
                           background=not mix.needs_main_thread)
  start = time.perf_counter()
  try:
    batch = sampler.generate(model, prompts, 1, seed, listener=scorer if overlap else None)
    decoded = time.perf_counter()
    _, result = scorer.finish(batch.response_tokens, batch.lengths)
  finally:
    scorer.close()
  end = time.perf_counter()
  return {"round_s": end - start, "rollout_s": decoded - start, "tail_s": end - decoded,
          "overlapped_s": scorer.overlapped_s, "overlapped_rows": scorer.overlapped_rows,
          "scores": result.scores}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
  out = {}
  for key in ("round_s", "rollout_s", "tail_s", "overlapped_s"):
    values = [r[key] for r in rounds]
    out[key] = float(np.median(values))
    out[key + "_min"], out[key + "_max"] = float(min(values)), float(max(values))
  out["overlapped_rows"] = float(np.median([r["overlapped_rows"] for r in rounds]))
  return out


def run(steps: int = 5, *, slots: int = 16, max_new_tokens: int = 512, median: float = 32.0,
        sigma: float = 1.0, seed: int = 0, pool: int = 512, log=print) -> dict[str, Any]:
  from sagc_jax.bench import heavy_tail
  from sagc_jax.rewards.mix import RewardMix, RewardTerm
  from sagc_jax.runtime import compilation
  from sagc_jax.sampling import Sampler, SamplingParams

  compilation.install()
  model, cfg = heavy_tail.tiny_model(seed)
  targets = heavy_tail.lognormal_targets(heavy_tail.ROWS, median, sigma, max_new_tokens)
  prompts, stop_ids, _ = heavy_tail.forced_rows(model, cfg, targets, max_new_tokens, seed, pool)
  params = SamplingParams(max_new_tokens, temperature=0.0, stop_ids=stop_ids)
  common = dict(row_buckets=(heavy_tail.ROWS,), prompt_buckets=(32,), group_sizes=(1,))
  samplers = {"refill": dict(refill_slots=slots, page_size=16, decode_segment=0),
              "subcalls": dict(max_rows_per_call=slots)}
  quiet = lambda message: None
  rewards = {"math_verify": RewardMix("math_verify", [], workers=0, log=quiet),
             "external": RewardMix("exact_match", [
                 RewardTerm("exact_match", "exact_match", 1.0),
                 RewardTerm("external_verifier", EXTERNAL_SPEC, 1.0)], log=quiet)}
  results: dict[str, Any] = {}
  compiles = 0
  try:
    for name, kwargs in samplers.items():
      sampler = Sampler(model, params, **common, **kwargs)
      sampler.warmup(model)
      for reward_name, mix in rewards.items():
        before = compilation.compile_count()
        for overlap in (False, True):                               # untimed
          _round(sampler, model, prompts, seed, mix, overlap)
        by_mode: dict[bool, list] = {False: [], True: []}
        for i in range(steps):
          for overlap in ((False, True) if i % 2 == 0 else (True, False)):
            by_mode[overlap].append(_round(sampler, model, prompts, seed, mix, overlap))
        compiles += compilation.compile_count() - before
        off, on = _summary(by_mode[False]), _summary(by_mode[True])
        pairs = [a["round_s"] - b["round_s"] for a, b in zip(by_mode[False], by_mode[True])]
        same = all(np.array_equal(a["scores"], by_mode[False][0]["scores"])
                   for a in by_mode[False] + by_mode[True])
        entry = {"off": off, "on": on, "saved_s": off["round_s"] - on["round_s"],
                 "saved_s_worst_pair": float(min(pairs)), "saved_s_best_pair": float(max(pairs)),
                 "saved_fraction": (off["round_s"] - on["round_s"]) / off["round_s"],
                 "same_rewards": bool(same)}
        results[f"{name}/{reward_name}"] = entry
        log(f"  {name:>8} + {reward_name:<11}: round {off['round_s']:.3f} s -> "
            f"{on['round_s']:.3f} s (saved {entry['saved_s']:+.3f} s; pairs "
            f"{entry['saved_s_worst_pair']:+.3f} .. {entry['saved_s_best_pair']:+.3f}); reward "
            f"tail {off['tail_s']:.3f} -> {on['tail_s']:.3f} s")
  finally:
    for mix in rewards.values():
      mix.close()
  return {"model": {"source": heavy_tail.TINY_MODEL}, "rows": heavy_tail.ROWS, "slots": slots,
          "max_new_tokens": max_new_tokens, "target_median": median, "target_sigma": sigma,
          "steps": steps, "external_ms_per_completion": EXTERNAL_MS, "results": results,
          "compiles_after_warmup": int(compiles)}


def report(result: dict[str, Any]) -> str:
  lines = [f"overlap of scoring and decoding ({result['rows']} heavy-tailed rows, "
           f"{result['slots']} slots, medians of {result['steps']} pairs):"]
  for key, r in result["results"].items():
    lines.append(f"  {key}: round {r['off']['round_s']:.3f} s off, {r['on']['round_s']:.3f} s "
                 f"on: saved {r['saved_s']:+.3f} s ({100 * r['saved_fraction']:+.1f}%; pairs "
                 f"{r['saved_s_worst_pair']:+.3f} .. {r['saved_s_best_pair']:+.3f}); same "
                 f"rewards {r['same_rewards']}")
  lines.append(f"  compiles after warm-up: {result['compiles_after_warmup']}")
  return "\n".join(lines)
