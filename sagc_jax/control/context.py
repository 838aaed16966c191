"""What a step knows about its prompts before it samples: the batch context, a bounded
per-prompt history, and the feature buckets of the contextual controllers.

SAGC's risk model is one Beta per group size: the straggler probability of an
average prompt. A step's prompts are not average. Before the step samples, the
trainer knows which prompts the loader hands out next and their token lengths,
and for a prompt seen in an earlier epoch, how its responses' lengths spread and
how often they passed. ``PromptAwareController`` and ``PerPromptController``
(docs/controllers.md) turn that into a risk per prompt; this module holds the
inputs:

* ``BatchContext``: the upcoming prompts in loader order, ``prompt_ids`` (stable
  int64 ids) and ``prompt_lengths`` (tokens). The caller passes at least as many
  prompts as the largest prompt count any candidate G could need; for candidate G
  the step uses the first ``P(G)`` of them.
* ``PromptHistory``: per remembered prompt, discounted evidence of

  - its *tail score*: ``score = sum_k g^k r_k / sum_k g^k`` over its observed
    groups, newest first, with ``g`` = ``history_forgetting`` per observation of that
    prompt and ``r_k`` the group's ``y = min(log(max/median) / log(tau), 3)`` (``y > 1``
    iff the group straggled; a zero median with a positive max counts as 3) divided by
    the mean ``y`` of the groups of the same size (the controller computes ``r``;
    1 = an average prompt, and the growth of max/median with G cancels). A
    continuous score rather than the straggle bit, because a prompt recurs about
    once per epoch and one group's ratio says more than whether it crossed ``tau``;
  - its pass rate: ``Beta(1 + h, 1 + n - h)``, ``h`` / ``n`` the discounted
    passing / total responses (``pass_rate * G`` and ``G`` per group), from which
    the prompt's utility weight (``lookup``) is the posterior mean of the Bernoulli
    variance, ``E[4 p (1 - p)] = 4 a b / ((a + b)(a + b + 1))`` (1 at a known p = 0.5,
    near 0 for a prompt always or never solved, 2/3 for an unseen prompt);
  - its last known token length.

  The memory is bounded: at most ``capacity`` prompts, the least recently
  observed one evicted first (an ``OrderedDict`` in observation order), so the
  checkpointed state stays small (about 70 bytes of JSON per prompt).
* ``FeatureBuckets``: a prompt's bucket is ``tail class x length class``. Tail
  class 0 = no history, then ``1 + #{edges <= score}`` over ``tail_edges``;
  length class ``#{edges * mean_len <= length}`` over ``length_edges``, relative
  to the mean token length of the prompts observed so far (the context's mean
  before any), so the default edge ``(1.0,)`` reads "longer than the average
  prompt" on any dataset.

Everything here is plain numpy and Python (no JAX) and serialises to JSON exactly
(floats by ``repr``).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["BatchContext", "FeatureBuckets", "PromptHistory", "TAIL_SCORE_CAP",
           "tail_scores"]

# Largest tail score one group contributes (a ratio of tau ** 3); also the score of a
# zero median with a positive max. Bounds the influence of one extreme group.
TAIL_SCORE_CAP = 3.0


@dataclasses.dataclass(frozen=True)
class BatchContext:
  """The upcoming prompts of a step, in loader order.

  ``prompt_ids``: stable int64 ids (the same prompt has the same id in every
  epoch); ``prompt_lengths``: their token lengths (non-negative ints). Both are
  1-D and equally long; they are converted to numpy arrays on construction.
  """

  prompt_ids: np.ndarray
  prompt_lengths: np.ndarray

  def __post_init__(self):
    for name in ("prompt_ids", "prompt_lengths"):
      arr = np.asarray(getattr(self, name))
      if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"BatchContext.{name} must be a non-empty 1-D array, "
                         f"got shape {arr.shape}")
      if arr.dtype.kind not in "iu":
        raise ValueError(f"BatchContext.{name} must hold integers, got dtype {arr.dtype}")
      object.__setattr__(self, name, arr.astype(np.int64))
    ids, lengths = self.prompt_ids, self.prompt_lengths
    if ids.size != lengths.size:
      raise ValueError(f"BatchContext has {ids.size} prompt_ids but {lengths.size} "
                       "prompt_lengths: one length per prompt")
    if (lengths < 0).any():
      raise ValueError(f"BatchContext.prompt_lengths must be >= 0, got "
                       f"{lengths[lengths < 0][:4].tolist()}")

  def __len__(self) -> int:
    return int(self.prompt_ids.size)


def tail_scores(group_max: np.ndarray, group_median: np.ndarray, tau: float) -> np.ndarray:
  """Per-group ``min(log(max/median) / log(tau), TAIL_SCORE_CAP)`` (0 for an all-zero
  group, the cap for a zero median with a positive max)."""
  positive = group_median > 0
  ratio = np.where(positive, group_max, 1.0) / np.where(positive, group_median, 1.0)
  score = np.log(ratio) * (1.0 / math.log(tau))
  score[~positive & (group_max > 0)] = TAIL_SCORE_CAP
  return np.clip(score, 0.0, TAIL_SCORE_CAP)


def _edges(name: str, edges: Sequence[float]) -> tuple[float, ...]:
  try:
    values = tuple(float(e) for e in edges)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a sequence of numbers, got {edges!r}") from None
  if any(not math.isfinite(e) or e < 0 for e in values) or list(values) != sorted(set(values)):
    raise ValueError(f"{name}={tuple(edges)!r} must be finite, >= 0 and strictly increasing")
  return values


@dataclasses.dataclass(frozen=True)
class FeatureBuckets:
  """Bucket of a prompt = tail class x length class (module docstring)."""

  tail_edges: tuple[float, ...] = (0.8, 1.25)
  length_edges: tuple[float, ...] = (1.0,)

  def __post_init__(self):
    object.__setattr__(self, "tail_edges", _edges("tail_edges", self.tail_edges))
    object.__setattr__(self, "length_edges", _edges("length_edges", self.length_edges))
    # Tail scores are >= 0 and an unseen prompt's is read as -1, so one search over
    # (-0.5, *tail_edges) gives class 0 for no history and 1 + #{edges <= score} else.
    object.__setattr__(self, "_tail_search", np.array((-0.5, *self.tail_edges)))
    object.__setattr__(self, "_length_search", np.array(self.length_edges))

  @property
  def count(self) -> int:
    """Number of buckets: (1 + len(tail_edges) + 1) x (len(length_edges) + 1)."""
    return (len(self.tail_edges) + 2) * (len(self.length_edges) + 1)

  def of(self, scores: np.ndarray, lengths: np.ndarray, mean_length: float) -> np.ndarray:
    """Buckets of prompts with tail ``scores`` (NaN = no history) and token ``lengths``."""
    tail = np.searchsorted(self._tail_search, np.where(scores == scores, scores, -1.0),
                           side="right")                      # NaN != NaN: unseen -> -1
    length = np.searchsorted(self._length_search * mean_length, lengths, side="right")
    return tail * (len(self.length_edges) + 1) + length


class PromptHistory:
  """Bounded, least-recently-observed-evicted memory of prompts (module docstring).

  A record is ``[tail_sum, tail_weight, pass_hits, pass_trials, length]``;
  ``forgetting`` discounts a prompt's evidence each time that prompt is observed.
  """

  def __init__(self, capacity: int, forgetting: float):
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
      raise ValueError(f"history_size must be a positive int, got {capacity!r}")
    if isinstance(forgetting, bool) or not isinstance(forgetting, (int, float)) or not (
        0.0 < forgetting <= 1.0):
      raise ValueError(f"history_forgetting={forgetting!r} is outside (0.0, 1.0]")
    self.capacity = int(capacity)
    self.forgetting = float(forgetting)
    self._records: collections.OrderedDict[int, list[float]] = collections.OrderedDict()
    self._length_sum = 0.0            # token lengths of every observed group's prompt
    self._length_count = 0.0

  def __len__(self) -> int:
    return len(self._records)

  def __contains__(self, prompt_id: int) -> bool:
    return int(prompt_id) in self._records

  def mean_length(self, fallback: float) -> float:
    """Mean token length over the observed groups' prompts (``fallback`` before any)."""
    return self._length_sum / self._length_count if self._length_count else float(fallback)

  def lookup(self, prompt_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tail score, utility weight) per prompt; NaN score and weight 2/3 when unseen."""
    scores = np.full(prompt_ids.size, np.nan)
    weights = np.full(prompt_ids.size, 2.0 / 3.0)
    get = self._records.get
    found = [(i, rec) for i, rec in enumerate(map(get, prompt_ids.tolist())) if rec is not None]
    if found:
      rows = [i for i, _ in found]
      tail_sum, tail_weight, hits, trials, _ = np.array([rec for _, rec in found]).T
      scores[rows] = tail_sum / tail_weight      # a record holds >= 1 observation
      a, b = 1.0 + hits, 1.0 + trials - hits
      weights[rows] = 4.0 * a * b / ((a + b) * (a + b + 1.0))
    return scores, weights

  def update(self, prompt_ids: Sequence[int], scores: Sequence[float],
             sizes: Sequence[int], pass_rates: Sequence[float] | None,
             lengths: Sequence[float]) -> None:
    """Adds one observed group per entry (its prompt's tail score, group size,
    pass rate or None, token length or NaN when unknown) and evicts down to capacity."""
    gamma = self.forgetting
    records = self._records
    scores, sizes, lengths = (np.asarray(a, np.float64).tolist()
                              for a in (scores, sizes, lengths))
    rates = None if pass_rates is None else np.asarray(pass_rates, np.float64).tolist()
    for i, pid in enumerate(prompt_ids):
      rec = records.pop(pid, None) or [0.0, 0.0, 0.0, 0.0, math.nan]   # new: no evidence
      rec[0] = gamma * rec[0] + scores[i]
      rec[1] = gamma * rec[1] + 1.0
      if rates is not None:
        rec[2] = gamma * rec[2] + rates[i] * sizes[i]
        rec[3] = gamma * rec[3] + sizes[i]
      if lengths[i] == lengths[i]:            # not NaN: the length is known
        rec[4] = lengths[i]
        self._length_sum += lengths[i]
        self._length_count += 1.0
      records[pid] = rec                      # re-inserted: now the most recent
    while len(records) > self.capacity:
      records.popitem(last=False)

  def state_dict(self) -> dict[str, Any]:
    """Records oldest first, as ``[id, tail_sum, tail_weight, pass_hits, pass_trials,
    length]`` (length None when unknown: JSON has no NaN)."""
    return {
        "records": [[pid, *rec[:4], None if math.isnan(rec[4]) else rec[4]]
                    for pid, rec in self._records.items()],
        "length_sum": self._length_sum,
        "length_count": self._length_count,
    }

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    records = collections.OrderedDict(
        (int(row[0]), [float(v) for v in row[1:5]]
         + [math.nan if row[5] is None else float(row[5])]) for row in state["records"])
    if len(records) > self.capacity:
      raise ValueError(f"state remembers {len(records)} prompts, more than "
                       f"history_size={self.capacity}")
    self._records = records
    self._length_sum = float(state["length_sum"])
    self._length_count = float(state["length_count"])
