"""Heavy-tailed rollouts: the refill sampler vs sub-calls vs the fused sampler.

64 rows whose greedy response lengths follow a log-normal (median ``median``,
``sigma`` >= 0.8, capped at ``max_new_tokens``), forced without changing the model,
as the straggler benchmark forces its lengths: greedy continuations of a pool of
random prompts are computed once, a random subset of the vocabulary becomes the stop
ids, and each target length (the log-normal's quantiles) takes the unused pool row
whose first stop token comes closest to it. Several subset sizes are tried and the
best-matching one kept; the measured lengths (their log-standard deviation included)
are reported next to the targets, since the match is not exact. The rows are
shuffled, so no sampler sees them sorted by length.

Three samplers, same weights, same rows, each warmed up first (``compiles_after_warmup``
counts any compilation after that), medians of ``runs`` timed calls:

* ``refill``: ``slots`` decode slots over a paged cache, refilled from the queue of the
  64 rows (``sampling/refill.py``);
* ``subcalls``: today's answer when 64 rows do not fit: the default (segmented) sampler
  in sequential calls of ``slots`` rows (``max_rows_per_call``), each waiting for its
  own straggler;
* ``fused``: every row at once, one loop over a dense cache (no memory bound; the
  token reference).

``greedy_match`` is the fraction of rows whose tokens and length under ``refill``
equal the fused sampler's.

With ``peer_python`` (a Python with ``google-tunix``) Tunix's native sampler runs the
same rows on the same weights too (``tunix_worker.py``, in its own environment), on
the heavy tail and at equal lengths beside our default sampler:
``heavy_tail_refill_over_tunix``, ``equal_lengths_ours_over_tunix`` and its greedy
match with ours. Both sides use RoPE theta 1e6, the one Tunix's Llama applies.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sagc_jax.bench.peer import TUNIX_ROPE_THETA, run_worker
from sagc_jax.runtime import compilation
from sagc_jax.sampling import Sampler, SamplingParams

EOS = 2
ROWS = 64


TINY_MODEL = "tiny (random weights, std 0.1, RoPE theta 1e6)"


def tiny_model(seed: int):
  """(model, config): the tiny CPU Llama of the straggler benchmark, RoPE theta 1e6."""
  from sagc_jax.models import init_model, tiny_config

  cfg = dataclasses.replace(tiny_config(), rope_theta=TUNIX_ROPE_THETA)
  return init_model(cfg, seed=seed, init_std=0.1), cfg


def lognormal_targets(rows: int, median: float, sigma: float, cap: int) -> np.ndarray:
  """The log-normal's ``(i + 1/2) / rows`` quantiles, rounded and clipped to [1, cap]."""
  from statistics import NormalDist

  z = np.array([NormalDist().inv_cdf((i + 0.5) / rows) for i in range(rows)])
  return np.clip(np.round(median * np.exp(sigma * z)), 1, cap).astype(np.int64)


def _first_stop(tokens: np.ndarray, stop: np.ndarray, natural: np.ndarray) -> np.ndarray:
  """Length of each row's response if ``stop`` tokens end it (the stop token counted),
  else its natural length."""
  hit = np.isin(tokens, stop)
  first = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, tokens.shape[1])
  return np.minimum(first, natural)


def forced_rows(model, cfg, targets: np.ndarray, max_new: int, seed: int, pool: int = 512
                ) -> tuple[list[list[int]], tuple[int, ...], np.ndarray]:
  """(prompts, stop ids, their greedy lengths): one pool row per target length."""
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(4, cfg.vocab_size, rng.integers(8, 33)).tolist() for _ in range(pool)]
  free = Sampler(model, SamplingParams(max_new, temperature=0.0, stop_ids=(EOS,)),
                 row_buckets=(pool,), prompt_buckets=(32,), decode_segment=0)
  run = free.generate(model, prompts, 1, seed)
  best = None
  for fraction in (0.005, 0.01, 0.02, 0.04):
    candidates = np.setdiff1d(np.arange(3, cfg.vocab_size), [EOS])
    stop = rng.choice(candidates, max(1, int(fraction * cfg.vocab_size)), replace=False)
    lengths = _first_stop(run.response_tokens, stop, run.lengths)
    free_rows, chosen = set(range(pool)), []
    for target in sorted(targets, reverse=True):          # the rare long ones first
      row = min(free_rows, key=lambda r: (abs(np.log(lengths[r] / target)), r))
      free_rows.remove(row)
      chosen.append(row)
    error = float(np.mean([abs(np.log(lengths[r] / t))
                           for r, t in zip(chosen, sorted(targets, reverse=True))]))
    if best is None or error < best[0]:
      best = (error, stop, chosen, lengths)
  _, stop, chosen, lengths = best
  order = rng.permutation(len(chosen))
  chosen = [chosen[i] for i in order]
  stop_ids = tuple(sorted({int(t) for t in stop} | {EOS}))
  return [prompts[r] for r in chosen], stop_ids, lengths[chosen]


def run(steps: int = 3, *, model=None, cfg=None, slots: int = 16, max_new_tokens: int = 512,
        median: float = 32.0, sigma: float = 1.0, page_size: int = 16, seed: int = 0,
        pool: int = 512, model_info: dict | None = None, peer_python: str | None = None,
        peer_folder: str | None = None, equal_tokens: int = 128, log=print
        ) -> dict[str, Any]:
  """The scenario on ``model`` (default: the tiny CPU Llama, random weights of std 0.1,
  RoPE theta 1e6, the straggler benchmark's; ``model_info`` describes another in the
  JSON); ``steps`` timed calls per sampler; ``pool`` prompts whose greedy
  continuations the forced lengths are picked from.

  ``peer_python``: a Python with ``google-tunix``; Tunix's sampler then runs the same
  rows on the same weights (``peer_folder``, an HF folder of ``model`` whose RoPE
  theta is 1e6, the one Tunix's Llama applies; written here for the tiny model), on
  the heavy tail and on ``equal_tokens`` tokens for every row (no stop), where our
  default sampler runs beside it."""
  described = model_info or {"source": TINY_MODEL}
  if model is None:
    model, cfg = tiny_model(seed)
  if peer_python is not None and cfg.rope_theta != TUNIX_ROPE_THETA:
    raise ValueError(f"peer_python: Tunix's Llama applies RoPE theta {TUNIX_ROPE_THETA:g} "
                     f"whatever its config says; this model has {cfg.rope_theta:g}")
  compilation.install()
  runs = steps
  targets = lognormal_targets(ROWS, median, sigma, max_new_tokens)
  prompts, stop_ids, forced = forced_rows(model, cfg, targets, max_new_tokens, seed, pool)
  params = SamplingParams(max_new_tokens, temperature=0.0, stop_ids=stop_ids)
  common = dict(row_buckets=(ROWS,), prompt_buckets=(32,), group_sizes=(1,))
  samplers = {"refill": dict(refill_slots=slots, page_size=page_size, decode_segment=0),
              "subcalls": dict(max_rows_per_call=slots),
              "fused": dict(decode_segment=0)}
  out, batches, compiles = {}, {}, 0
  for name, kwargs in samplers.items():
    sampler = Sampler(model, params, **common, **kwargs)
    sampler.warmup(model)
    before = compilation.compile_count()
    sampler.generate(model, prompts, 1, seed)                      # first call
    timed = [sampler.generate(model, prompts, 1, seed) for _ in range(runs)]
    compiles += compilation.compile_count() - before
    seconds = [b.seconds for b in timed]
    batches[name] = timed[0]
    out[name] = {"seconds": float(np.median(seconds)), "seconds_min": float(min(seconds)),
                 "seconds_max": float(max(seconds)), "decode_steps": timed[0].decode_steps,
                 "decode_slots": timed[0].decode_slots,
                 "tokens_per_s": float(timed[0].lengths.sum() / np.median(seconds))}
    log(f"  heavy tail, {name:>8}: {out[name]['seconds']:.3f} s "
        f"({out[name]['tokens_per_s']:.0f} tok/s, {timed[0].decode_slots} slot-steps)")
  peer = None
  if peer_python is not None:
    peer = _peer_columns(peer_python, peer_folder, model, cfg, prompts, stop_ids, params,
                         equal_tokens, runs, seed, log)
  ref, got = batches["fused"], batches["refill"]
  match = [bool(ref.lengths[r] == got.lengths[r] and np.array_equal(
      ref.response_tokens[r, :ref.lengths[r]], got.response_tokens[r, :got.lengths[r]]))
      for r in range(ROWS)]
  lengths = ref.lengths[:ROWS]
  return {"model": described, "rows": ROWS, "slots": slots, "page_size": page_size, "pool": pool,
          "max_new_tokens": max_new_tokens, "runs": runs,
          "target_median": median, "target_sigma": sigma,
          "target_lengths": targets.tolist(), "lengths": lengths.tolist(),
          "length_p50": float(np.median(lengths)), "length_p90": float(np.percentile(lengths, 90)),
          "length_max": int(lengths.max()), "length_sigma": float(np.std(np.log(lengths))),
          "forced_lengths_equal_measured": bool(np.array_equal(forced, lengths)),
          "samplers": out,
          "heavy_tail_refill_over_subcalls": out["subcalls"]["seconds"] / out["refill"]["seconds"],
          "heavy_tail_refill_over_fused": out["fused"]["seconds"] / out["refill"]["seconds"],
          "heavy_tail_greedy_match": float(np.mean(match)),
          "heavy_tail_compiles_after_warmup": int(compiles),
          "compiles_after_warmup": int(compiles),
          **({} if peer is None else _peer_summary(peer, out, ref))}


def report(result: dict[str, Any]) -> str:
  s = result["samplers"]
  peer = "" if "tunix" not in result else (
      f"; Tunix {np.median(result['tunix']['heavy_tail']['seconds']):.3f} s: refill "
      f"{result['heavy_tail_refill_over_tunix']:.2f}x faster (greedy match "
      f"{result['tunix_heavy_tail_greedy_match']:.3f}); equal lengths: ours "
      f"{result['equal_lengths_ours_over_tunix']:.2f}x faster than Tunix (greedy match "
      f"{result['tunix_equal_lengths_greedy_match']:.3f})")
  return (f"heavy tail ({result['rows']} rows, lengths p50 {result['length_p50']:.0f} / p90 "
          f"{result['length_p90']:.0f} / max {result['length_max']}, log-sd "
          f"{result['length_sigma']:.2f}; {result['slots']} slots): refill "
          f"{s['refill']['seconds']:.3f} s, sub-calls of {result['slots']} "
          f"{s['subcalls']['seconds']:.3f} s ({result['heavy_tail_refill_over_subcalls']:.2f}x), "
          f"fused {s['fused']['seconds']:.3f} s ({result['heavy_tail_refill_over_fused']:.2f}x); "
          f"greedy match {result['heavy_tail_greedy_match']:.3f}, compiles after warm-up "
          f"{result['heavy_tail_compiles_after_warmup']}") + peer


def tunix_call(peer_python: str, folder: str, prompts, stop_ids, max_new_tokens: int,
               runs: int, pad_id: int) -> dict[str, Any]:
  """Tunix's sampler on ``prompts`` (``tunix_worker.py``): its seconds and outputs."""
  return run_worker(peer_python, dict(
      folder=str(folder), prompts=[list(map(int, p)) for p in prompts],
      stop_ids=list(map(int, stop_ids)), runs=runs, max_new_tokens=max_new_tokens,
      pad_id=pad_id))


def _peer_columns(peer_python, peer_folder, model, cfg, prompts, stop_ids, params,
                  equal_tokens: int, runs: int, seed: int, log) -> dict[str, Any]:
  """Tunix on the heavy tail, and Tunix vs our default sampler at equal lengths."""
  with tempfile.TemporaryDirectory() as tmp:
    if peer_folder is None:
      from sagc_jax.models.hf_io import save_pretrained

      peer_folder = str(save_pretrained(model, cfg, Path(tmp) / "model"))
    heavy = tunix_call(peer_python, peer_folder, prompts, stop_ids, params.max_new_tokens,
                       runs, params.pad_id)
    # A stop id past the vocabulary: every row runs to equal_tokens on both sides.
    never = (cfg.vocab_size,)
    equal = tunix_call(peer_python, peer_folder, prompts, never, equal_tokens, runs,
                       params.pad_id)
  ours = Sampler(model, SamplingParams(equal_tokens, temperature=0.0, stop_ids=never),
                 row_buckets=(ROWS,), prompt_buckets=(32,), group_sizes=(1,))
  ours.warmup(model)
  ours.generate(model, prompts, 1, seed)
  timed = [ours.generate(model, prompts, 1, seed) for _ in range(runs)]
  ours_s = [b.seconds for b in timed]
  for name, r in (("heavy tail", heavy), ("equal lengths", equal)):
    log(f"  {name}, tunix: {np.median(r['seconds']):.3f} s "
        f"({sum(r['lengths']) / np.median(r['seconds']):.0f} tok/s)")
  log(f"  equal lengths, ours (default sampler): {np.median(ours_s):.3f} s")
  return dict(heavy=heavy, equal=equal, equal_ours_seconds=ours_s,
              equal_ours_lengths=timed[0].lengths[:ROWS].tolist(),
              equal_ours_tokens=[timed[0].response_tokens[r, :timed[0].lengths[r]].tolist()
                                 for r in range(ROWS)])


def _match(tunix: dict[str, Any], tokens: list[list[int]], lengths) -> float:
  """Share of rows whose Tunix length equals ours and whose tokens equal ours before
  the stop token (Tunix's response ends before it)."""
  same = [int(n) == int(m) and list(t[:n - 1]) == list(ours[:n - 1])
          for t, n, ours, m in zip(tunix["tokens"], tunix["lengths"], tokens, lengths)]
  return float(np.mean(same))


def _first_mismatch(tunix: dict[str, Any], tokens: list[list[int]]) -> list[int]:
  """Per row that differs, the index of the first token where Tunix's and ours part
  (late partings point at rounding that flips a near-tie, early ones at the model)."""
  out = []
  for t, ours in zip(tunix["tokens"], tokens):
    n = min(len(t), len(ours))
    diff = [i for i in range(n) if int(t[i]) != int(ours[i])]
    if diff:
      out.append(diff[0])
  return sorted(out)


def _peer_summary(peer: dict[str, Any], out: dict[str, Any], ref) -> dict[str, Any]:
  heavy_s, equal_s = np.median(peer["heavy"]["seconds"]), np.median(peer["equal"]["seconds"])
  ours_equal = float(np.median(peer["equal_ours_seconds"]))
  fused_tokens = [ref.response_tokens[r].tolist() for r in range(ROWS)]
  return {"tunix": {"heavy_tail": {"seconds": peer["heavy"]["seconds"],
                                   "warmup_seconds": peer["heavy"]["warmup_seconds"],
                                   "lengths": peer["heavy"]["lengths"]},
                    "equal_lengths": {"seconds": peer["equal"]["seconds"],
                                      "lengths": peer["equal"]["lengths"],
                                      "ours_seconds": peer["equal_ours_seconds"]}},
          "heavy_tail_refill_over_tunix": float(heavy_s / out["refill"]["seconds"]),
          "heavy_tail_fused_over_tunix": float(heavy_s / out["fused"]["seconds"]),
          "equal_lengths_ours_over_tunix": float(equal_s / ours_equal),
          "tunix_heavy_tail_greedy_match": _match(peer["heavy"], fused_tokens,
                                                  ref.lengths[:ROWS]),
          "tunix_equal_lengths_greedy_match": _match(
              peer["equal"], peer["equal_ours_tokens"], peer["equal_ours_lengths"]),
          "tunix_heavy_tail_first_mismatch": _first_mismatch(peer["heavy"], fused_tokens),
          "tunix_equal_lengths_first_mismatch": _first_mismatch(
              peer["equal"], peer["equal_ours_tokens"])}
