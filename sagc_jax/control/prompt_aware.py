"""Prompt-aware SAGC: the straggler risk of a step given its prompts (opt-in,
``controller.kind="prompt_aware"``; equations also in docs/controllers.md).

Why. SAGC prices the risk of the *average* prompt at each G. A step's prompts
are known before it samples, and a prompt seen in an earlier epoch has shown how
long-tailed its responses are. A batch of prompts that straggled before is
riskier at any G than a batch of prompts that never did; pricing each batch by
its own prompts spends the straggler budget ``delta`` where it buys the most
log2 G. This is the contextual bandit version of SAGC's Thompson sampling.

Model. Each prompt gets a bucket ``b`` from its history and length
(``sagc_jax.control.context``: tail class x length class). For candidate ``G_k``
and bucket ``b`` the per-group straggler probability is

    theta_kb ~ Beta(kappa * m_k + s_kb, kappa * (1 - m_k) + f_kb)

with ``s_kb`` / ``f_kb`` the discounted straggling / non-straggling groups of size
``G_k`` whose prompt was in bucket ``b`` when the step was proposed, and ``m_k`` the
mean of SAGC's own posterior of ``G_k`` (all groups of that size). The prior
shrinks a rarely seen cell to what is known about its size instead of to 1/2;
``kappa`` (``cell_prior_strength``) is its weight in groups. A cell's counts are
multiplied by ``forgetting`` each time that cell is observed (SAGC's per-size
forgetting, per cell). Cells learn from every group whatever ``event`` is.

Prediction. For candidate G the step uses the first ``P(G)`` prompts of the
context (the caller's prompts-per-step rule, given at construction). With one
Thompson draw ``theta~`` per cell:

    group event:  p^(G | x) = (1 / P(G)) * sum_{i < P(G)} theta~_{G, b_i}
    step event:   p^(G | x) = 1 - prod_{i < P(G)} (1 - theta~_{G, b_i})

Selection is SAGC's rule with ``p~(G)`` replaced by ``p^(G | x)``: the first step
uses ``initial_g``; while ``lambda`` sits at ``lambda_max``, one size down; else the
argmax of ``log2 G - lambda * p^(G | x)`` over the current size and its
neighbours. The dual update, SAGC's per-size posteriors and the metrics are
SAGC's. Without a context (``propose()`` or ``propose(None)``) the controller
draws and decides exactly as ``SAGCController``, whose per-size posteriors it
keeps up to date.

Interface for the trainer::

    ctrl.propose(BatchContext(prompt_ids, prompt_lengths)) -> G
    # the step samples the first P(G) prompts of that context, G responses each
    ctrl.observe(group_max, group_median, prompt_ids=ids, pass_rates=rates,
                 group_sizes=sizes) -> metrics

``observe``'s extra arrays are per group, in group order, all optional:
``prompt_ids`` (default: the first groups are the context's first prompts, in
order; a group beyond them has no prompt), ``pass_rates`` (fraction of the
group's responses that passed, feeds the history), ``group_sizes`` (must all be
``g``). A group's bucket is the one its prompt had when the step was proposed; a
group whose prompt was not in the proposal's context (e.g. DAPO's extra rounds)
updates the history and SAGC's posteriors but no cell.

Plain numpy. A propose + observe costs more than SAGC's (many small numpy calls per
prompt and bucket), still negligible next to a step; the simulator reports it per
step (docs/results.md, "Controller overhead"). The
state (cells, history, pending proposal, SAGC's state, RNG) round-trips through
JSON.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from sagc_jax.control.protocol import ContextSource, GroupPlan, Needs, StepGroups
from sagc_jax.control.context import BatchContext, FeatureBuckets, PromptHistory, tail_scores
from sagc_jax.control.risk import check_range, settings_of
from sagc_jax.control.sagc import SAGCController, SAGCSettings
from sagc_jax.control.stragglers import straggler_flags, validated_lengths

__all__ = ["ContextSettings", "PromptAwareController", "PromptsFor", "per_group_array"]


@dataclasses.dataclass(frozen=True)
class ContextSettings(SAGCSettings):
  """The contextual kinds' settings: SAGC's, plus the features and the prompt history
  (``PromptAwareController``'s arguments)."""

  tail_edges: tuple = (0.8, 1.25)
  length_edges: tuple = (1.0,)
  cell_prior_strength: float = 2.0
  history_size: int = 20000
  history_forgetting: float = 0.7

# The caller's rule: prompts a step samples at candidate G (hold_prompts: a constant;
# hold_rollouts: rollouts_per_step // G). None: every prompt of the context.
PromptsFor = Union[Callable[[int], int], Mapping[int, int], None]


# The array fields of a _Proposal and their dtypes (its JSON holds them as lists).
_PROPOSAL_ARRAYS = {"ids": np.int64, "lengths": np.int64, "buckets": np.int64,
                    "weights": np.float64, "covered": bool, "sizes": np.int64}


@dataclasses.dataclass
class _Proposal:
  """What ``propose`` read from the context: the prompts any candidate could use."""
  ids: np.ndarray                  # int64, the first max_G P(G) prompts of the context
  lengths: np.ndarray              # their token lengths
  buckets: np.ndarray              # their feature buckets at proposal time
  weights: np.ndarray              # their utility weights E[4 p (1 - p)]
  covered: np.ndarray              # whether each had a history
  used: int = 0                    # prompts the chosen step samples
  sizes: np.ndarray | None = None  # per_prompt: G_i of the used prompts
  predicted: float = 0.0           # posterior-mean straggler signal of the decision

  def to_json(self) -> dict[str, Any]:
    values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in values.items()}

  @classmethod
  def from_json(cls, state: Mapping[str, Any]) -> "_Proposal":
    arrays = {k: None if state[k] is None else np.asarray(state[k], dtype)
              for k, dtype in _PROPOSAL_ARRAYS.items()}
    return cls(**arrays, used=int(state["used"]), predicted=float(state["predicted"]))


def _prompts_table(prompts_for: PromptsFor, candidates: Sequence[int]) -> dict[int, int] | None:
  """P(G) of every candidate (in candidate order), checked; None: the whole context."""
  if prompts_for is None:
    return None
  counts = {}
  for g in candidates:
    try:
      p = prompts_for[g] if isinstance(prompts_for, Mapping) else prompts_for(g)
    except KeyError:
      raise ValueError(f"prompts_for has no entry for candidate G={g}") from None
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
      raise ValueError(f"prompts_for gives P({g})={p!r}: must be a positive int")
    counts[g] = int(p)
  return counts


def per_group_array(name: str, value: Any, n: int, *, integer: bool) -> np.ndarray:
  """``value`` as a per-group array of ``n`` ints, or of fractions in [0, 1]."""
  arr = np.asarray(value)
  if arr.shape != (n,):
    raise ValueError(f"{name} must have one entry per group ({n}), got shape {arr.shape}")
  if integer and arr.dtype.kind not in "iu":
    raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
  if not integer:
    if arr.dtype.kind not in "iuf":
      raise ValueError(f"{name} must hold numbers, got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if not (np.isfinite(arr).all() and (arr >= 0).all() and (arr <= 1).all()):
      raise ValueError(f"{name} must be fractions in [0, 1], got {arr[:4].tolist()}...")
  return arr


class PromptAwareController(SAGCController):
  """SAGC with a contextual risk model (module docstring).

  Args (beyond ``SAGCController``'s, which keep their meaning and defaults):
    prompts_for: P(G), the caller's prompts per step at each candidate: a
      callable ``G -> int``, a dict ``{G: int}``, or None (every prompt of the
      context at every G).
    tail_edges: edges of the tail classes on the prompt's tail score (a group's
      ``log(max/median) / log(tau)``, discounted mean).
    length_edges: edges of the length classes, in multiples of the mean prompt
      length observed so far.
    cell_prior_strength: ``kappa``, pseudo-groups of the size's own posterior
      mean in each cell's prior (> 0).
    history_size: prompts remembered (least recently observed evicted first).
    history_forgetting: discount of a prompt's evidence each time it is observed,
      in (0, 1].
  """

  kind = "prompt_aware"
  Settings = ContextSettings
  needs = Needs(context=True)

  def __init__(self, candidates: Sequence[int], tau: float, delta: float, *,
               prompts_for: PromptsFor = None, **settings: Any):
    s = settings_of(self.Settings, self.kind, candidates=candidates, tau=tau, delta=delta,
                    **settings)
    sagc = {f.name: getattr(s, f.name) for f in dataclasses.fields(SAGCSettings)}
    super().__init__(**sagc)
    self.features = FeatureBuckets(tuple(s.tail_edges), tuple(s.length_edges))
    self.cell_prior_strength = check_range("cell_prior_strength", s.cell_prior_strength)
    self._prompts = _prompts_table(prompts_for, self.candidates)
    self._history = PromptHistory(s.history_size, s.history_forgetting)
    shape = (len(self.candidates), self.features.count)
    self._cell_straggle = np.zeros(shape)
    self._cell_ok = np.zeros(shape)
    self._proposal: _Proposal | None = None
    self._draws: np.ndarray | None = None      # this step's Thompson draws per cell
    # Discounted sum and count of the tail scores of every group, per size: a
    # prompt's score is read relative to the mean score of its group's size.
    self._score_sum = np.zeros(len(self.candidates))
    self._score_count = np.zeros(len(self.candidates))

  @classmethod
  def from_settings(cls, settings: Any, *, prompts_for: PromptsFor = None
                    ) -> "PromptAwareController":
    return cls(**dataclasses.asdict(settings), prompts_for=prompts_for)

  # ---------------------------------------------------------------- public API
  def prompts_for(self, g: int, context_size: int) -> int:
    """P(g), the prompts a step at size ``g`` samples from a context of that size."""
    return context_size if self._prompts is None else self._prompts[g]

  def propose(self, context: BatchContext | None = None) -> int:
    """G for the next step; the step then samples the first ``P(G)`` prompts of
    ``context``. Calling it again before ``observe`` returns the same G (the new
    context is ignored), as SAGC's ``propose`` does."""
    if self._pending:
      return self.g
    self._proposal = None if context is None else self._read_context(context)
    g = super().propose()
    if self._proposal is not None:
      self._proposal.used = self.prompts_for(g, len(self._proposal.ids))
      self._proposal.predicted = self._predict(self.cell_posterior_mean(), self._index)
    return g

  def plan(self, context: ContextSource | None = None) -> GroupPlan:
    """``propose`` on the step's upcoming prompts (read only here)."""
    return GroupPlan(self.propose(None if context is None else context()))

  def cell_posterior_mean(self) -> np.ndarray:
    """Posterior mean straggler probability per (candidate, bucket), shape
    ``[len(candidates), features.count]``."""
    a, b = self._cell_params()
    return a / (a + b)

  def observe_step(self, groups: StepGroups) -> dict[str, float]:
    """SAGC's update, plus the cells and the prompt history (module docstring).
    Diagnostics beyond SAGC's: ``predicted_straggler_rate`` (posterior-mean prediction
    of the straggler signal for the prompts and sizes that were proposed; SAGC's p(G)
    without a context), ``feature_coverage`` (fraction of the groups whose prompt had
    a history when proposed) and ``history_prompts``."""
    gmax, gmed = validated_lengths(groups.group_max, groups.group_median)
    n = gmax.size
    size_index = self._observed_sizes(groups.group_sizes, n)
    ids, known, buckets, lengths = self._observed_prompts(groups.prompt_ids, n)
    rates = None if groups.pass_rates is None else per_group_array(
        "pass_rates", groups.pass_rates, n, integer=False)
    flags = straggler_flags(gmax, gmed, self.params.tau)
    proposal = self._proposal
    predicted = (float(self.posterior_mean()[self._index]) if proposal is None
                 else proposal.predicted)
    metrics = self._record_step(flags, size_index)
    self._update_cells(size_index, buckets, flags)
    scores = self._relative_tail_scores(tail_scores(gmax, gmed, self.params.tau), size_index)
    if known.any():
      sizes = np.asarray(self.candidates)[size_index]
      self._history.update(ids[known].tolist(), scores[known], sizes[known],
                           None if rates is None else rates[known], lengths[known])
    self._proposal = None
    # Buckets below one row of length classes are tail class 0: no history.
    coverage = float(np.count_nonzero(buckets >= len(self.features.length_edges) + 1)) / n
    metrics.update({"predicted_straggler_rate": predicted, "feature_coverage": coverage,
                    "history_prompts": float(len(self._history))})
    return metrics

  def state_dict(self) -> dict[str, Any]:
    state = super().state_dict()
    state.update({
        "features": {"tail_edges": list(self.features.tail_edges),
                     "length_edges": list(self.features.length_edges)},
        "cells": {"straggle": self._cell_straggle.tolist(), "ok": self._cell_ok.tolist()},
        "tail_score": {"sum": self._score_sum.tolist(), "count": self._score_count.tolist()},
        "history": self._history.state_dict(),
        "proposal": None if self._proposal is None else self._proposal.to_json(),
    })
    return state

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if state.get("kind") != self.kind:     # before reading keys only this kind writes
      raise ValueError(f"state is for a {state.get('kind')!r} controller, this is {self.kind!r}")
    features = state["features"]
    if (tuple(features["tail_edges"]) != self.features.tail_edges
        or tuple(features["length_edges"]) != self.features.length_edges):
      raise ValueError(f"state feature buckets {features} differ from this controller's "
                       f"(tail_edges={self.features.tail_edges}, "
                       f"length_edges={self.features.length_edges}): its cells would "
                       "mean something else")
    super().load_state_dict(state)     # same candidates and buckets: the cells' shape
    self._history.load_state_dict(state["history"])
    self._cell_straggle = np.asarray(state["cells"]["straggle"], np.float64)
    self._cell_ok = np.asarray(state["cells"]["ok"], np.float64)
    self._score_sum = np.asarray(state["tail_score"]["sum"], np.float64)
    self._score_count = np.asarray(state["tail_score"]["count"], np.float64)
    proposal = state["proposal"]
    self._proposal = None if proposal is None else _Proposal.from_json(proposal)

  # ------------------------------------------------------------- internals
  def _read_context(self, context: BatchContext) -> _Proposal:
    """Features of the prompts any candidate could use; raises before any change."""
    if not isinstance(context, BatchContext):
      raise ValueError(f"context must be a BatchContext, got {type(context).__name__}")
    need = len(context) if self._prompts is None else max(self._prompts.values())
    if len(context) < need:
      g = next(g for g, p in self._prompts.items() if p == need)   # the smallest such G
      raise ValueError(f"context holds {len(context)} prompts, but candidate G={g} "
                       f"samples P({g})={need}: pass at least {need}")
    ids = context.prompt_ids[:need]
    lengths = context.prompt_lengths[:need]
    scores, weights = self._history.lookup(ids)
    mean_length = self._history.mean_length(fallback=float(lengths.sum()) / lengths.size)
    buckets = self.features.of(scores, lengths, mean_length)
    return _Proposal(ids=ids, lengths=lengths, buckets=buckets, weights=weights,
                     covered=~np.isnan(scores))

  def _cell_params(self) -> tuple[np.ndarray, np.ndarray]:
    mean = self.posterior_mean()[:, None]
    kappa = self.cell_prior_strength
    return kappa * mean + self._cell_straggle, kappa * (1.0 - mean) + self._cell_ok

  def _choose(self) -> int:
    if self._proposal is None:
      return super()._choose()
    # One draw per cell every step, so the RNG stream does not depend on G.
    self._draws = self._rng.beta(*self._cell_params())
    n = len(self._proposal.ids)
    risk = [self._predict(self._draws, k, self.prompts_for(g, n))
            for k, g in enumerate(self.candidates)]
    return self._lagrangian_choice(risk)

  def _predict(self, theta: np.ndarray, k: int, used: int | None = None) -> float:
    """Predicted straggler signal of the first ``used`` context prompts at candidate
    ``k`` (default: the prompts the proposal uses) from per-cell probabilities."""
    used = self._proposal.used if used is None else used
    counts = np.bincount(self._proposal.buckets[:used], minlength=self.features.count)
    if self.params.event == "step":      # 1 - prod_i (1 - theta_{k, b_i})
      return float(-np.expm1(counts @ np.log1p(-theta[k])))
    return float(counts @ theta[k]) / used

  def _observed_sizes(self, group_sizes: Any, n: int) -> np.ndarray:
    """Index in ``candidates`` of every group's size; a prompt-aware step uses ``g``."""
    if group_sizes is not None:
      sizes = per_group_array("group_sizes", group_sizes, n, integer=True)
      if (sizes != self.g).any():
        raise ValueError(f"group_sizes {sorted(set(sizes.tolist()))} differ from the "
                         f"proposed G={self.g}: a prompt_aware step uses one size")
    return np.full(n, self._index)

  def _observed_prompts(self, prompt_ids: Any, n: int):
    """(ids, known, buckets, lengths) per group: the prompt id (valid where
    ``known``), the bucket at proposal time (-1: not in the proposal) and the token
    length (NaN: unknown)."""
    proposal = self._proposal
    buckets = np.full(n, -1, np.int64)
    lengths = np.full(n, math.nan)
    if prompt_ids is None:
      ids = np.zeros(n, np.int64)
      known = np.zeros(n, bool)
      if proposal is not None:
        m = min(n, proposal.used)
        ids[:m], known[:m] = proposal.ids[:m], True
        buckets[:m], lengths[:m] = proposal.buckets[:m], proposal.lengths[:m]
      return ids, known, buckets, lengths
    ids = per_group_array("prompt_ids", prompt_ids, n, integer=True).astype(np.int64)
    if proposal is not None and n <= proposal.used and np.array_equal(ids, proposal.ids[:n]):
      buckets[:], lengths[:] = proposal.buckets[:n], proposal.lengths[:n]  # in context order
    elif proposal is not None:
      position: dict[int, int] = {}
      for i, pid in enumerate(proposal.ids[:proposal.used].tolist()):
        position.setdefault(pid, i)
      for g, pid in enumerate(ids.tolist()):
        i = position.get(pid)
        if i is not None:
          buckets[g], lengths[g] = proposal.buckets[i], proposal.lengths[i]
    return ids, np.ones(n, bool), buckets, lengths

  def _relative_tail_scores(self, scores: np.ndarray, size_index: np.ndarray) -> np.ndarray:
    """Each group's tail score over the discounted mean score of its size, this step's
    groups included (1 = an average prompt at that size; 1 when that mean is 0)."""
    gamma = self.params.forgetting
    n = len(self.candidates)
    total = np.bincount(size_index, weights=scores, minlength=n)
    count = np.bincount(size_index, minlength=n)
    seen = count > 0
    self._score_sum[seen] = gamma * self._score_sum[seen] + total[seen]
    self._score_count[seen] = gamma * self._score_count[seen] + count[seen]
    mean = self._score_sum[size_index] / self._score_count[size_index]
    return np.divide(scores, mean, out=np.ones_like(scores), where=mean > 0)

  def _update_cells(self, size_index: np.ndarray, buckets: np.ndarray,
                    flags: np.ndarray) -> None:
    """Per-cell forgetting, then this step's groups added to their (size, bucket) cell."""
    mask = buckets >= 0
    if not mask.any():
      return
    n_cells = self._cell_straggle.size
    cell = size_index[mask] * self.features.count + buckets[mask]
    trials = np.bincount(cell, minlength=n_cells).astype(np.float64)
    hits = np.bincount(cell, weights=flags[mask].astype(np.float64), minlength=n_cells)
    straggle, ok = self._cell_straggle.reshape(-1), self._cell_ok.reshape(-1)
    gamma = self.params.forgetting
    seen = slice(None) if self._forget_unused else trials > 0   # per-cell forgetting
    straggle[seen] *= gamma
    ok[seen] *= gamma
    straggle += hits
    ok += trials - hits
