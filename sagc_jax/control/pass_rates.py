"""What ``signal_rate`` (``control.signal_rate``) knows of the prompts: per-prompt Beta
pass-rate posteriors over a pooled prior fitted by the beta-binomial method of moments,
the expected number of informative groups a size buys under them, and DAPO's round
process. The equations are in ``control.signal_rate``'s module docstring.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["PassRates", "dapo_step", "expected_informative", "informative_groups"]


def informative_groups(p: np.ndarray, sizes: Any) -> float:
  """``sum_i 1 - p_i^G_i - (1 - p_i)^G_i``: the groups whose rewards vary, expected at
  known pass rates ``p`` (a group of one size, or one size per prompt)."""
  p = np.asarray(p, np.float64)
  return float(np.sum(1.0 - p ** sizes - (1.0 - p) ** sizes))


def expected_informative(alpha: np.ndarray, beta: np.ndarray,
                         sizes: Sequence[int]) -> np.ndarray:
  """``E[1 - p^G - (1 - p)^G]`` under ``p ~ Beta(alpha, beta)``, shape ``[len(alpha),
  len(sizes)]`` (module docstring: ``E[p^G] = prod_{j<G} (a + j) / (a + b + j)``). Both
  products in one array, the running product down its first axis (across the row per
  factor, the fast direction): this runs every step."""
  a, b = np.asarray(alpha, np.float64), np.asarray(beta, np.float64)
  k, total = a.size, a + b
  j = np.arange(max(sizes), dtype=np.float64)[:, None]
  factors = (np.concatenate([a, b]) + j) / (np.concatenate([total, total]) + j)
  np.multiply.accumulate(factors, axis=0, out=factors)
  prods = factors[np.asarray(sizes) - 1]
  return (1.0 - prods[:, :k] - prods[:, k:]).T


def dapo_step(informative: np.ndarray, prompts: Sequence[int], max_rounds: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """(expected kept groups, expected sampling rounds) of a DAPO step per candidate:
  rounds of ``prompts[j]`` groups, each informative with probability ``informative[j]``,
  until that many are kept or ``max_rounds`` ran (``rl.dynamic_sampling``'s rule). The
  distribution of the groups kept so far (capped at the target) is carried round by
  round, each round adding a Binomial(P, q)."""
  kept, rounds = np.empty(len(prompts)), np.empty(len(prompts))
  for j, (q, p) in enumerate(zip(informative, prompts)):
    q = min(max(float(q), 0.0), 1.0)
    k = np.arange(p + 1)
    pmf = np.array([math.comb(p, i) for i in k], np.float64) * q ** k * (1.0 - q) ** (p - k)
    dist = np.zeros(p + 1)
    dist[0] = 1.0
    expected = 0.0
    for r in range(max_rounds):
      expected += 1.0 if r == 0 else float(dist[:p].sum())
      grown = np.convolve(dist[:p], pmf)
      dist = np.concatenate([grown[:p], [dist[p] + grown[p:].sum()]])
    kept[j], rounds[j] = float(dist @ k), expected
  return kept, rounds


class PassRates:
  """Per-prompt Beta posteriors shrunk toward a pooled prior (module docstring).

  Prompt ids index dense arrays (they are a dataset's source indices), grown as ids
  arrive; the state keeps only the prompts seen."""

  def __init__(self, forgetting: float, pool_forgetting: float, strength: tuple[float, float]):
    self.forgetting, self.pool_forgetting = forgetting, pool_forgetting
    self.strength = strength
    self.counts = np.zeros((0, 2))           # per prompt id: discounted correct, responses
    # Discounted group count, sum r, sum r^2, sum r (1 - r) / (G - 1) (G >= 2) and its count.
    self.pool = [0.0] * 5

  def prior(self) -> tuple[float, float]:
    """The pooled ``Beta(m mu, m (1 - mu))`` (``Beta(1, 1)`` before any group)."""
    n, s1, s2, s3, n3 = self.pool
    if n <= 0:
      return 1.0, 1.0
    mu = min(max(s1 / n, 1e-3), 1.0 - 1e-3)
    spread = s2 / n - (s1 / n) ** 2 - (s3 / n3 if n3 > 0 else 0.0)
    low, high = self.strength
    m = high if spread <= 0 else min(max(mu * (1.0 - mu) / spread - 1.0, low), high)
    return m * mu, m * (1.0 - mu)

  def posterior(self, ids: np.ndarray | None, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Beta (alpha, beta) of ``ids`` (None: ``count`` unseen prompts)."""
    a0, b0 = self.prior()
    if ids is None:
      return np.full(count, a0), np.full(count, b0)
    ids = np.asarray(ids, np.int64)
    counts = np.zeros((ids.size, 2))
    known = ids < len(self.counts)
    counts[known] = self.counts[ids[known]]
    return a0 + counts[:, 0], b0 + counts[:, 1] - counts[:, 0]

  def expected_informative(self, ids: np.ndarray | None, count: int,
                           sizes: Sequence[int]) -> np.ndarray:
    """``expected_informative`` of each prompt of ``ids`` (None: ``count`` unseen ones),
    ``[count, len(sizes)]``. When none of them was seen, every row is the pooled prior's,
    computed once in floats: on a large dataset almost every prompt of a step is new."""
    a0, b0 = self.prior()
    counts = None
    if ids is not None and len(self.counts):
      ids = np.asarray(ids, np.int64)
      inside = ids < len(self.counts)
      if inside.all():
        counts = self.counts[ids]
      else:
        counts = np.zeros((ids.size, 2))
        counts[inside] = self.counts[ids[inside]]
      if not counts[:, 1].any():
        counts = None
    if counts is not None:
      return expected_informative(a0 + counts[:, 0], b0 + counts[:, 1] - counts[:, 0], sizes)
    row, up, down, j = [], 1.0, 1.0, 0
    for g in sizes:
      while j < g:
        up, down, j = up * (a0 + j) / (a0 + b0 + j), down * (b0 + j) / (a0 + b0 + j), j + 1
      row.append(1.0 - up - down)
    return np.tile(row, (count, 1))

  def update(self, ids: np.ndarray | None, rates: np.ndarray, sizes: np.ndarray) -> None:
    """One observed group per entry: its prompt (None: pooled only), pass rate and size."""
    gamma = self.pool_forgetting
    s1, s2 = float(rates.sum()), float(rates @ rates)
    low, high = int(sizes.min()), int(sizes.max())
    if low == high:                          # one size: the noise term in scalars
      noise, counted = ((s1 - s2) / (low - 1.0), rates.size) if low > 1 else (0.0, 0)
    else:
      multi = sizes > 1
      noise = float((rates[multi] * (1.0 - rates[multi]) / (sizes[multi] - 1.0)).sum())
      counted = int(multi.sum())
    pool = self.pool
    self.pool = [gamma * pool[0] + rates.size, gamma * pool[1] + s1, gamma * pool[2] + s2,
                 gamma * pool[3] + noise, gamma * pool[4] + counted]
    if ids is None:
      return
    ids = np.asarray(ids, np.int64)
    if ids.size and ids.max() >= len(self.counts):
      grown = max(int(ids.max()) + 1, 2 * len(self.counts))
      self.counts = np.concatenate([self.counts, np.zeros((grown - len(self.counts), 2))])
    self.counts[ids] *= self.forgetting
    np.add.at(self.counts, ids, np.stack([rates * sizes, sizes], axis=1))

  def state_dict(self) -> dict[str, Any]:
    seen = np.flatnonzero(self.counts[:, 1])
    return {"ids": seen.tolist(), "hits": self.counts[seen, 0].tolist(),
            "trials": self.counts[seen, 1].tolist(), "pool": list(self.pool)}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    ids = np.asarray(state["ids"], np.int64)
    size = int(ids.max()) + 1 if ids.size else 0
    self.counts = np.zeros((size, 2))
    self.counts[ids, 0], self.counts[ids, 1] = state["hits"], state["trials"]
    self.pool = [float(x) for x in state["pool"]]
