"""Per-prompt group sizes: each prompt of a step gets its own G_i under the step's
row budget (opt-in, ``controller.kind="per_prompt"``; docs/controllers.md).

Why. One G for the whole step spends the same rows on every prompt. A larger
group buys most where the advantage estimate is noisy, a prompt whose pass rate
is near 1/2 (a prompt always or never solved gives GRPO no gradient at any G),
and costs most where the prompt's own length tail is long (its group is the one
likely to straggle). Moving rows from the second kind to the first raises the
step's utility at the same rows and the same straggler budget.

Decision of one step, given the context (``sagc_jax.control.context``):

1. Base size and prompt count. ``G_b`` is chosen exactly as
   ``PromptAwareController`` chooses G (contextual Thompson draw ``theta~`` per
   (size, bucket) cell, local move or step down at the dual's cap). The step
   samples the first ``k = P(G_b)`` prompts of the context (the caller's rule) and
   has ``R = k * G_b`` rows: the rows a one-size step at ``G_b`` would use, i.e.
   ``rollouts_per_step`` under hold_rollouts. So ``k`` moves like SAGC's prompt
   count, and the loader hands out the prompts it would for SAGC.
2. Allocation. With ``w_i = E[4 p_i (1 - p_i)]`` (the prompt's pass-rate posterior,
   2/3 when unseen) normalised to mean 1 over the k prompts,
   ``wbar_i = w_i / mean_j w_j`` (all 1 when every w is 0), choose

       max_{G_i in C}  sum_i [ wbar_i * log2 G_i  -  lambda * theta~_{G_i, b_i} ]
       s.t.            sum_i G_i <= R.

   The normalisation keeps the base choice and the allocation on one scale: the
   uniform allocation ``G_i = G_b`` scores k times the base Lagrangian, so the
   same ``lambda`` prices both. The problem is a multiple-choice knapsack, solved
   exactly by dynamic programming over rows in units of ``gcd(C)``
   (``allocate_group_sizes``: ``O(k * R / gcd(C) * |C|)``, a few hundred
   microseconds at k = 32). Rows may be left unused when every larger size costs
   more risk than it buys.
3. The dual, SAGC's per-size posteriors (each size observed per group of that
   size) and the cells learn as in the prompt-aware mode; the constraint is on the
   step's fraction of straggling groups, whatever their sizes, so only
   ``event="group"`` is supported (a per-prompt allocation of the step event's
   ``1 - prod(1 - theta)`` is not separable).

Interface for the trainer::

    sizes = ctrl.propose_groups(BatchContext(prompt_ids, prompt_lengths))
    # the step samples the first len(sizes) prompts, prompt i with sizes[i] responses
    ctrl.observe(group_max, group_median, prompt_ids=..., pass_rates=...,
                 group_sizes=sizes) -> metrics

``g`` is the most common G_i of the last proposal (ties: the smaller), a size a
caller needing one can use; ``base_g`` is ``G_b``. ``observe``'s metric ``g`` is the
mean G_i over the step's groups and ``log2_g`` the mean log2 G_i.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from sagc_jax.control.context import BatchContext
from sagc_jax.control.protocol import ContextSource, GroupPlan, Needs, StepGroups
from sagc_jax.control.prompt_aware import PromptAwareController, per_group_array

__all__ = ["PerPromptController", "allocate_group_sizes"]


def allocate_group_sizes(values: np.ndarray, sizes: Sequence[int], budget: int) -> np.ndarray:
  """Exact ``argmax sum_i values[i, j_i]  s.t.  sum_i sizes[j_i] <= budget``.

  ``values`` is ``[k, len(sizes)]`` (``sizes`` sorted ascending); returns the chosen
  index ``j_i`` per row. Dynamic programming over the budget in units of
  ``gcd(sizes)``: ``f_i(c)`` is the best value of the first i items within c units,
  ``f_i(c) = max_j f_{i-1}(c - w_j) + values[i, j]``; ties go to the smaller size.
  Raises ``ValueError`` when even the smallest size for every row exceeds the budget.
  """
  values = np.asarray(values, np.float64)
  k, m = values.shape
  unit = math.gcd(*sizes)
  w = [s // unit for s in sizes]
  cap = budget // unit
  if k * w[0] > cap:
    raise ValueError(f"row budget {budget} is below {k} prompts x G={sizes[0]}")
  if k * w[-1] <= cap:                    # the budget does not bind
    return values.argmax(axis=1)
  if k * w[0] + min(b - a for a, b in zip(w, w[1:])) > cap:   # room for the smallest only
    return np.zeros(k, np.int64)
  pad = w[-1]
  best = np.zeros(pad + cap + 1)
  best[:pad] = -np.inf                    # negative capacity: infeasible
  choice = np.empty((k, cap + 1), np.int8)
  options = np.empty((m, cap + 1))
  for i in range(k):
    for j, wj in enumerate(w):
      np.add(best[pad - wj:pad - wj + cap + 1], values[i, j], out=options[j])
    choice[i] = options.argmax(axis=0)
    best[pad:] = options.max(axis=0)
  picked = np.empty(k, np.int64)
  c = cap
  for i in range(k - 1, -1, -1):
    picked[i] = choice[i, c]
    c -= w[picked[i]]
  return picked


class PerPromptController(PromptAwareController):
  """One group size per prompt under the step's row budget (module docstring).

  Takes ``PromptAwareController``'s arguments (keyword-only after ``delta``, with its
  defaults); ``event`` must be ``"group"``.
  """

  kind = "per_prompt"
  # Groups of different sizes go through one fused or segmented sampler call; each
  # process's share of the rows would differ in length, and the host gathers take
  # equal shares.
  needs = Needs(context=True, per_prompt_sizes=True, one_process=True, no_refill=True,
                whole_step_per_call=True)

  def __init__(self, candidates: Sequence[int], tau: float, delta: float, **kwargs: Any):
    if kwargs.get("event", "group") != "group":
      raise ValueError(f"event={kwargs['event']!r}: per_prompt supports only 'group' (the "
                       "step event's risk is not a sum over prompts)")
    super().__init__(candidates, tau, delta, **kwargs)
    self._log2 = np.log2(np.asarray(self.candidates, np.float64))
    self._last_sizes: np.ndarray | None = None

  @property
  def g(self) -> int:
    """The most common G_i of the last proposal (ties: the smaller); the base size
    before any proposal."""
    if self._last_sizes is None:
      return self.candidates[self._index]
    counts = [np.count_nonzero(self._last_sizes == c) for c in self.candidates]
    return self.candidates[counts.index(max(counts))]

  @property
  def base_g(self) -> int:
    """G_b, the size that set the step's prompts and row budget."""
    return self.candidates[self._index]

  def propose(self, context: BatchContext | None = None) -> int:
    raise ValueError("a per_prompt controller chooses one size per prompt: call "
                     "propose_groups(context)")

  def plan(self, context: ContextSource | None = None) -> GroupPlan:
    """Sizes per prompt of the step's upcoming prompts; the plan's G is G_b."""
    sizes = self.propose_groups(None if context is None or self._pending else context())
    return GroupPlan(self.base_g, sizes)

  def propose_groups(self, context: BatchContext) -> np.ndarray:
    """G_i for the first k prompts of ``context`` (module docstring), as an int64
    array whose sum is at most ``P(G_b) * G_b``. Calling it again before ``observe``
    returns the same sizes."""
    if self._pending:
      return self._proposal.sizes.copy()
    if context is None:
      raise ValueError("propose_groups needs a BatchContext (the step's upcoming prompts)")
    self._proposal = proposal = self._read_context(context)
    self._index = self._choose()
    self._pending = True
    base = self.base_g
    k = self.prompts_for(base, len(proposal.ids))
    buckets = proposal.buckets[:k]
    weights = proposal.weights[:k]
    mean_weight = float(weights.mean())
    wbar = weights / mean_weight if mean_weight > 0 else np.ones(k)
    values = wbar[:, None] * self._log2[None, :] - self._lambda * self._draws[:, buckets].T
    picked = allocate_group_sizes(values, self.candidates, k * base)
    proposal.used = k
    proposal.sizes = np.asarray(self.candidates, np.int64)[picked]
    proposal.predicted = float(self.cell_posterior_mean()[picked, buckets].mean())
    self._last_sizes = proposal.sizes
    return proposal.sizes.copy()

  def observe_step(self, groups: StepGroups) -> dict[str, float]:
    """The prompt-aware update with each group at its own size (``group_sizes``,
    default: the proposed sizes when the step has exactly the proposed groups).
    Extra diagnostics: ``base_g``, ``g_mode`` (the ``g`` property), ``allocated_rows``
    and ``row_budget`` (0 for a step observed without a proposal)."""
    proposal = self._proposal
    budget = float(proposal.used * self.base_g) if proposal is not None else 0.0
    metrics = super().observe_step(groups)
    sizes = proposal.sizes if groups.group_sizes is None else np.asarray(groups.group_sizes)
    metrics.update({"base_g": float(self.base_g), "g_mode": float(self.g),
                    "allocated_rows": float(sizes.sum()), "row_budget": budget})
    return metrics

  def state_dict(self) -> dict[str, Any]:
    state = super().state_dict()
    state["last_sizes"] = None if self._last_sizes is None else self._last_sizes.tolist()
    return state

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    super().load_state_dict(state)
    sizes = state["last_sizes"]
    self._last_sizes = None if sizes is None else np.asarray(sizes, np.int64)

  def _observed_sizes(self, group_sizes: Any, n: int) -> np.ndarray:
    proposal = self._proposal
    if group_sizes is None:
      if proposal is None or proposal.sizes is None or proposal.sizes.size != n:
        raise ValueError(f"group_sizes is required: the step reports {n} groups, not "
                         "the proposed ones")
      sizes = proposal.sizes
    else:
      sizes = per_group_array("group_sizes", group_sizes, n, integer=True)
    bad = sorted(set(sizes.tolist()) - set(self.candidates))
    if bad:
      raise ValueError(f"group_sizes {bad} are not among the candidates {self.candidates}")
    return np.searchsorted(self.candidates, sizes)
