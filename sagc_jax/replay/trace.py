"""A rollout trace: K sampled responses per prompt of a real policy, and its statistics.

``python -m sagc_jax.calibrate`` writes one (``trace.jsonl``); ``python -m
sagc_jax.simulate --trace`` replays it. The file is JSON lines: a header object
first (``"schema": "sagc_jax.trace/1"`` and the provenance: model, config digest,
sampling settings, date, the run's controller and rollout settings, the measured
decode cost), then one object per prompt::

    {"id": 17, "prompt_tokens": 92, "lengths": [...K ints], "rewards": [...K floats],
     "correct": [...K 0/1], "truncated": [...K 0/1]}

Every prompt holds the same K responses. The schema is documented in
docs/calibrate.md. Reading checks every line and names the first bad one.

The straggler statistics are ``control.stragglers``': a group of G straggles when its
max length exceeds ``tau`` times its median, and a prompt's ``K // G`` disjoint chunks
of G are that many groups of size G. Intervals are
bootstrap percentiles over prompts (a cluster bootstrap: the responses of one
prompt are not independent of each other, the prompts are).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from sagc_jax.control.stragglers import chunk_groups, random_step_rate, straggler_flags

__all__ = ["SCHEMA", "Trace", "read_trace", "write_trace", "trace_record", "straggler_rates",
           "length_summary", "pass_rate_histogram", "tau_curve", "bootstrap_interval"]

SCHEMA = "sagc_jax.trace/1"
_RESPONSE_FIELDS = ("lengths", "rewards", "correct", "truncated")


@dataclasses.dataclass(frozen=True)
class Trace:
  """A trace in memory: per prompt ``ids`` and ``prompt_tokens`` [N], per response
  ``lengths``, ``rewards``, ``correct`` and ``truncated`` [N, K]."""

  header: dict[str, Any]
  ids: np.ndarray
  prompt_tokens: np.ndarray
  lengths: np.ndarray
  rewards: np.ndarray
  correct: np.ndarray
  truncated: np.ndarray

  @property
  def prompts(self) -> int:
    return int(self.lengths.shape[0])

  @property
  def responses(self) -> int:
    return int(self.lengths.shape[1])

  @property
  def max_new_tokens(self) -> int:
    return int(self.header["sampling"]["max_new_tokens"])

  def take(self, prompts: np.ndarray | None = None,
           responses: np.ndarray | None = None) -> "Trace":
    """The trace restricted to some prompts (rows, repeats allowed: a bootstrap) and
    some response columns (a held-out half)."""
    rows = np.arange(self.prompts) if prompts is None else np.asarray(prompts)
    cols = np.arange(self.responses) if responses is None else np.asarray(responses)
    pick = lambda a: a[rows][:, cols]
    return Trace(self.header, self.ids[rows], self.prompt_tokens[rows], pick(self.lengths),
                 pick(self.rewards), pick(self.correct), pick(self.truncated))


def trace_record(prompt_id: int, prompt_tokens: int, lengths: Sequence[int],
                 rewards: Sequence[float], correct: Sequence[bool],
                 truncated: Sequence[bool]) -> dict[str, Any]:
  """One prompt's line of a trace file."""
  return {"id": int(prompt_id), "prompt_tokens": int(prompt_tokens),
          "lengths": [int(x) for x in lengths], "rewards": [float(x) for x in rewards],
          "correct": [int(bool(x)) for x in correct],
          "truncated": [int(bool(x)) for x in truncated]}


def write_trace(path: Path, header: dict[str, Any], records: Iterable[dict[str, Any]]) -> None:
  """Writes a trace file: the header line, then one line per prompt."""
  lines = [json.dumps({"schema": SCHEMA, **header}, sort_keys=True)]
  lines += [json.dumps(r) for r in records]
  path.write_text("\n".join(lines) + "\n")


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _checked_record(record: Any, where: str, k: int | None) -> dict[str, Any]:
  if not isinstance(record, dict):
    raise ValueError(f"{where}: a prompt line must be a JSON object, got {type(record).__name__}")
  missing = [key for key in ("id", "prompt_tokens", *_RESPONSE_FIELDS) if key not in record]
  if missing:
    raise ValueError(f"{where}: missing {', '.join(missing)}")
  if not _is_int(record["id"]) or not _is_int(record["prompt_tokens"]) \
      or record["prompt_tokens"] < 0:
    raise ValueError(f"{where}: id and prompt_tokens must be integers (prompt_tokens >= 0), "
                     f"got {record['id']!r} and {record['prompt_tokens']!r}")
  sizes = {key: len(record[key]) if isinstance(record[key], list) else -1
           for key in _RESPONSE_FIELDS}
  if len(set(sizes.values())) != 1 or sizes["lengths"] < 1:
    raise ValueError(f"{where}: lengths, rewards, correct and truncated must be lists of one "
                     f"equal, positive size, got sizes {sizes}")
  if k is not None and sizes["lengths"] != k:
    raise ValueError(f"{where}: {sizes['lengths']} responses, but the first prompt has {k}: "
                     "every prompt of a trace holds the same number")
  if any(not _is_int(x) or x < 1 for x in record["lengths"]):
    raise ValueError(f"{where}: lengths must be positive token counts")
  if any(not isinstance(x, (int, float)) or isinstance(x, bool) or not np.isfinite(x)
         for x in record["rewards"]):
    raise ValueError(f"{where}: rewards must be finite numbers")
  for key in ("correct", "truncated"):
    if any(x not in (0, 1) for x in record[key]):
      raise ValueError(f"{where}: {key} must hold 0 or 1 per response")
  return record


def _check_header(header: Any, path: Path) -> None:
  if not isinstance(header, dict) or header.get("schema") != SCHEMA:
    raise ValueError(f"trace {path}: the first line must be a header with "
                     f"\"schema\": \"{SCHEMA}\"")
  sampling, controller, rollout = (header.get(k) for k in ("sampling", "controller", "rollout"))
  if not isinstance(sampling, dict) or not _is_int(sampling.get("max_new_tokens")):
    raise ValueError(f"trace {path}: the header's sampling must hold max_new_tokens (an int)")
  if not isinstance(controller, dict) or not isinstance(controller.get("candidates"), list) \
      or not isinstance(controller.get("tau"), (int, float)):
    raise ValueError(f"trace {path}: the header's controller must hold candidates (a list) "
                     "and tau (the traced run's controller section)")
  if not isinstance(rollout, dict) or rollout.get("mode") not in ("hold_prompts",
                                                                    "hold_rollouts"):
    raise ValueError(f"trace {path}: the header's rollout must hold the run's budget "
                     "(mode, rollouts_per_step, prompts_per_step)")


def read_trace(path: Path | str) -> Trace:
  """Reads and checks a trace file; an error names the file and the first bad line."""
  path = Path(path)
  if not path.is_file():
    raise ValueError(f"trace {path} is not a file")
  with path.open() as f:
    lines = [line for line in f if line.strip()]
  if not lines:
    raise ValueError(f"trace {path} is empty")

  def parse(i: int) -> Any:
    try:
      return json.loads(lines[i])
    except json.JSONDecodeError as err:
      raise ValueError(f"trace {path} line {i + 1} is not JSON ({err.msg})") from None

  header, records, k = parse(0), [], None
  _check_header(header, path)
  for i in range(1, len(lines)):
    records.append(_checked_record(parse(i), f"trace {path} line {i + 1}", k))
    k = len(records[-1]["lengths"])
  if not records:
    raise ValueError(f"trace {path} holds no prompt")
  column = lambda key, dtype: np.asarray([r[key] for r in records], dtype)
  return Trace(header, column("id", np.int64), column("prompt_tokens", np.int64),
               column("lengths", np.int64), column("rewards", np.float64),
               column("correct", bool), column("truncated", bool))


def bootstrap_interval(statistic, prompts: int, seed: int = 0, samples: int = 1000,
                       level: float = 0.95) -> tuple[float, float]:
  """Percentile interval of ``statistic(rows)`` over bootstrap resamples of the prompts
  (``rows``: indices 0..prompts-1 drawn with replacement)."""
  rng = np.random.Generator(np.random.PCG64([seed, 3, 0]))
  values = [statistic(rng.integers(0, prompts, prompts)) for _ in range(samples)]
  tail = 100.0 * (1.0 - level) / 2.0
  low, high = np.nanpercentile(values, [tail, 100.0 - tail])
  return float(low), float(high)


def _group_flags(lengths: np.ndarray, g: int, tau: float) -> np.ndarray:
  """Straggler flags [N, K // g] of each prompt's disjoint chunks of ``g`` responses."""
  return straggler_flags(*chunk_groups(lengths, g), tau)


def straggler_rates(trace: Trace, g: int, tau: float, groups_per_step: int, *,
                    seed: int = 0, samples: int = 200) -> dict[str, float]:
  """Group and step straggler probabilities at group size ``g`` and ``tau``, with 95%
  bootstrap intervals clustered by prompt."""
  if not 1 <= g <= trace.responses:
    raise ValueError(f"group size {g} needs at least {g} responses per prompt; the trace "
                     f"holds {trace.responses}")
  flags = _group_flags(trace.lengths, g, tau)
  rng = np.random.Generator(np.random.PCG64([seed, 17, g]))
  step = lambda rows: random_step_rate(flags[rows], groups_per_step, rng, steps=500)
  group_low, group_high = bootstrap_interval(lambda rows: flags[rows].mean(), trace.prompts,
                                             seed, samples)
  step_low, step_high = bootstrap_interval(step, trace.prompts, seed, samples)
  return {"group_rate": float(flags.mean()), "group_low": group_low, "group_high": group_high,
          "step_rate": random_step_rate(flags, groups_per_step, rng), "step_low": step_low,
          "step_high": step_high, "groups": int(flags.size),
          "groups_per_step": int(groups_per_step)}


def tau_curve(trace: Trace, sizes: Sequence[int], taus: Sequence[float]
              ) -> dict[str, list[float]]:
  """Group straggler probability per G (``"G4"``...) at each of ``taus``."""
  return {"tau": [float(t) for t in taus],
          **{f"G{g}": [float(_group_flags(trace.lengths, g, t).mean()) for t in taus]
             for g in sizes}}


def length_summary(trace: Trace) -> dict[str, float]:
  """Response-length quantiles (tokens), mean, and the truncated share."""
  lengths = trace.lengths.reshape(-1).astype(np.float64)
  quantiles = {f"p{q}": float(np.percentile(lengths, q)) for q in (10, 25, 50, 75, 90, 95, 99)}
  return dict(quantiles, mean=float(lengths.mean()), max=float(lengths.max()),
              truncated_share=float(trace.truncated.mean()),
              max_new_tokens=float(trace.max_new_tokens), pass_rate=float(trace.correct.mean()))


# Per-prompt pass-rate bins: a group of G is informative with probability
# 1 - p^G - (1 - p)^G, so a larger G pays most where prompts sit near 0 or 1.
PASS_RATE_BINS = (("0", lambda p: p == 0), ("(0, 0.1]", lambda p: (p > 0) & (p <= 0.1)),
                  ("(0.1, 0.5)", lambda p: (p > 0.1) & (p < 0.5)),
                  ("[0.5, 0.9)", lambda p: (p >= 0.5) & (p < 0.9)),
                  ("[0.9, 1)", lambda p: (p >= 0.9) & (p < 1)), ("1", lambda p: p == 1))


def pass_rate_histogram(trace: Trace) -> dict[str, Any]:
  """The share of prompts in each pass-rate bin (``PASS_RATE_BINS``; a prompt's pass
  rate is its responses' share correct), and ``extreme_share``: the share at
  0 < p <= 0.1 or 0.9 <= p < 1, where a larger G turns the most groups informative."""
  p = trace.correct.mean(axis=1)
  shares = {name: float(np.mean(inside(p))) for name, inside in PASS_RATE_BINS}
  return {"bins": shares, "extreme_share": shares["(0, 0.1]"] + shares["[0.9, 1)"],
          "prompts": trace.prompts, "responses": trace.responses}
