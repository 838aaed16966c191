"""Straggler measurement: the one place the straggler event and a step's straggler rates
are computed from response lengths.

The trainer's metrics rows, the held-out evaluation's straggler profile, a trace's
statistics, the replay engine and calibrate all measure stragglers here, at one
measurement ``tau`` for every arm (a run's ``controller.tau``, or each of calibrate's
``--taus``); no caller reads a controller's parameters to measure. A controller that
needs the event for its own decisions (SAGC's posteriors and dual) calls
``straggler_flags`` at its own tau.

* a group straggles when ``max_len > tau * median_len`` (SAGC paper: ``max/median >
  tau``, written multiplicatively so that a zero median needs no division: an all-zero
  group does not straggle, a zero median with a positive max does);
* a step's two events: the fraction of its groups that straggle (``"group"``) and the
  seed paper's indicator S_t = 1 iff any group straggles (``"step"``).

Where groups are cut from K independent responses per prompt (a trace, the held-out
evaluation's k samples), a prompt's ``K // G`` disjoint chunks of G are that many
groups of size G, and the step rate is the share of random steps, each of
``groups_per_step`` distinct prompts (drawn with replacement once the prompts run
out, as a loader's epochs wrap) with one random chunk each, that hold a straggler.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["EVENTS", "chunk_groups", "random_step_rate", "step_straggler_stats",
           "straggler_flags", "validated_lengths"]

# The straggler signal a step contributes: the fraction of its groups that straggle,
# or the seed's per-step indicator S_t (any group straggles).
EVENTS = ("group", "step")


def straggler_flags(group_max: np.ndarray, group_median: np.ndarray,
                    tau: float) -> np.ndarray:
  """Per-group straggler events ``max > tau * median`` (bool array; module docstring)."""
  return group_max > tau * group_median


def validated_lengths(group_max: Any, group_median: Any) -> tuple[np.ndarray, np.ndarray]:
  """Checks the per-group length arrays of one step (the error names what is wrong);
  returns them as float64."""
  arrays = []
  for name, value in (("group_max", group_max), ("group_median", group_median)):
    try:
      arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
      raise ValueError(f"{name} must be an array of numbers, got {value!r:.80}") from None
    if arr.ndim != 1:
      raise ValueError(f"{name} must be 1-D (one entry per group), got shape {arr.shape}")
    if arr.size == 0:
      raise ValueError(f"{name} is empty: a step must report at least one group")
    if not np.isfinite(arr).all():
      raise ValueError(f"{name} contains NaN or infinite lengths at groups "
                       f"{np.flatnonzero(~np.isfinite(arr))[:4].tolist()}")
    if (arr < 0).any():
      raise ValueError(f"{name} contains negative lengths: {arr[arr < 0][:4].tolist()}")
    arrays.append(arr)
  gmax, gmed = arrays
  if gmax.shape != gmed.shape:
    raise ValueError(
        f"group_max has {gmax.size} groups but group_median has {gmed.size}: "
        "they must describe the same groups")
  if (gmed > gmax).any():
    bad = int(np.argmax(gmed > gmax))
    raise ValueError(
        f"group {bad}: median length {gmed[bad]:g} exceeds max length {gmax[bad]:g}")
  return gmax, gmed


def step_straggler_stats(group_max: Any, group_median: Any, group_sizes: Any, *,
                         tau: float, event: str) -> dict[str, float]:
  """A step's measured straggler statistics at the measurement ``tau``: ``g`` and
  ``log2_g`` (means over the step's groups), ``n_groups``, ``n_stragglers``,
  ``group_straggler_rate``, ``step_straggler`` (S_t) and ``straggler_rate`` (the one
  of the two that ``event`` names). The lengths are the sampler's or a world's, or
  ones a controller has checked (``validated_lengths``)."""
  gmax, gmed = np.asarray(group_max, np.float64), np.asarray(group_median, np.float64)
  sizes = np.asarray(group_sizes, np.float64)
  stragglers = float(np.count_nonzero(straggler_flags(gmax, gmed, tau)))
  group_rate = stragglers / gmax.size
  step = 1.0 if stragglers else 0.0
  return {"g": float(sizes.mean()), "log2_g": float(np.log2(sizes).mean()),
          "n_groups": float(gmax.size), "n_stragglers": stragglers,
          "group_straggler_rate": group_rate, "step_straggler": step,
          "straggler_rate": step if event == "step" else group_rate}


def chunk_groups(lengths: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
  """(max, median) length of each prompt's ``K // g`` disjoint chunks of ``g`` of its
  ``K`` responses, each ``[N, K // g]`` (callers keep ``g <= K``)."""
  lengths = np.asarray(lengths)
  n, k = lengths.shape
  chunks = lengths[:, :k // g * g].reshape(n, k // g, g).astype(np.float64)
  return chunks.max(axis=2), np.median(chunks, axis=2)


def random_step_rate(flags: np.ndarray, groups_per_step: int, rng: np.random.Generator,
                     steps: int = 2000) -> float:
  """P(a step straggles) from per-chunk flags ``[N, chunks]`` (module docstring)."""
  n, chunks = flags.shape
  if groups_per_step <= n:
    prompts = np.argsort(rng.random((steps, n)), axis=1)[:, :groups_per_step]
  else:
    prompts = rng.integers(0, n, (steps, groups_per_step))
  chunk = rng.integers(0, chunks, prompts.shape)
  return float(flags[prompts, chunk].any(axis=1).mean())
