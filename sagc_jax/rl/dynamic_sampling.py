"""DAPO dynamic sampling: refill a step's batch with informative groups only.

Which groups a round keeps is DAPO's rule (``control.dapo.keep_informative``, shared
with the replay engine). Each round is a full
sampler call at the step's G (the SAGC controller observes the length stats of
every round: a round that straggles costs the step just the same). After ``max_rounds`` rounds the step proceeds with what it
has and says so; with no informative group at all it is skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from sagc_jax.control.dapo import keep_informative
from sagc_jax.rl.rollout import RolloutBatch, concat_rollouts, select_groups


@dataclasses.dataclass
class DynamicSamplingResult:
  batch: RolloutBatch | None     # None: no informative group in any round
  rounds: int
  informative_groups: int
  target_groups: int
  sampled_groups: int
  message: str | None            # set when the target was not reached
  round_stats: list[Any] = dataclasses.field(default_factory=list)   # one per round


def collect_informative_groups(sample_round: Callable[[int], tuple[RolloutBatch, Any]],
                               keep_rows: Callable[[RolloutBatch], np.ndarray],
                               target_groups: int, rows: int, max_rounds: int
                               ) -> DynamicSamplingResult:
  """Calls ``sample_round(r)`` until ``target_groups`` informative groups are kept.

  Args:
    sample_round: draws round r (new prompts each round): its RolloutBatch with
      rewards and its statistics (returned in order as ``round_stats``).
    keep_rows: per-row keep mask of a round (e.g. ``learner.prepare(b)[1]``).
    target_groups: groups the step's batch should hold.
    rows: row bucket of the merged batch.
    max_rounds: sampling rounds allowed per step (>= 1).
  """
  if max_rounds < 1 or target_groups < 1:
    raise ValueError(f"max_rounds={max_rounds} and target_groups={target_groups} must be >= 1")
  parts, kept, kept_rows, sampled, stats = [], 0, 0, 0, []
  rounds = 0
  for rounds in range(1, max_rounds + 1):
    batch, round_stats = sample_round(rounds - 1)
    stats.append(round_stats)
    keep = np.asarray(keep_rows(batch), bool)
    ids = batch.group_ids[batch.row_valid]
    sampled += int(np.unique(ids).size)
    groups, first_rows = np.unique(ids, return_index=True)
    groups = groups[np.argsort(first_rows)]                # in order of appearance
    varied = np.isin(groups, batch.group_ids[keep & batch.row_valid])
    sizes = np.array([np.count_nonzero(ids == group) for group in groups])
    # Groups may differ in size (a plan with a size per prompt): those that still fit
    # the row bucket.
    take = groups[keep_informative(varied, sizes, target_groups - kept, rows - kept_rows)]
    kept_rows += int(sizes[np.isin(groups, take)].sum())
    take = take.tolist()
    if take:
      parts.append(select_groups(batch, take))
      kept += len(take)
    if kept >= target_groups:
      break
  message = None
  if kept < target_groups:
    message = (f"dynamic sampling: only {kept}/{target_groups} informative groups after "
               f"max_rounds={max_rounds} rounds ({sampled} groups sampled); "
               + ("training on the partial batch" if kept else "skipping the update")
               + " (raise learner.dynamic_max_rounds or check the reward signal)")
  merged = concat_rollouts(parts, rows) if parts else None
  return DynamicSamplingResult(merged, rounds, kept, target_groups, sampled, message, stats)
