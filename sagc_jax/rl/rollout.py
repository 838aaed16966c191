"""The learner's input: one step's rollouts as padded host arrays, and their assembly.

A ``RolloutBatch`` holds everything the train step needs for every row of a
row bucket: prompt (left-padded) and response tokens, masks, the sampler's
log-probs (PPO "old" log-probs), group ids, rewards and the response lengths.
Padding rows have ``row_valid == False`` and an all-zero response mask, so they
never reach a loss, a statistic or a gradient. The learner side owns this type;
``training.build.rollout_batch`` builds one from a sampler result (the sampler's
``SampleBatch``) and the rewards.

DAPO dynamic sampling needs several sampling rounds per step; ``select_groups``
and ``concat_rollouts`` cut whole groups out of rounds and stitch them into one
batch padded to a row bucket (group ids renumbered, prompts re-padded to the
widest round).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass
class RolloutBatch:
  prompt_tokens: np.ndarray      # [B, Tp] int32, left-padded
  prompt_mask: np.ndarray        # [B, Tp] bool
  response_tokens: np.ndarray    # [B, N] int32
  response_mask: np.ndarray      # [B, N] bool
  old_logprobs: np.ndarray       # [B, N] float32
  lengths: np.ndarray            # [B] int32
  group_ids: np.ndarray          # [B] int32
  row_valid: np.ndarray          # [B] bool
  scores: np.ndarray             # [B] float32 rewards (0 for padding rows)
  # The call's G (the plan's base size when groups differ in size);
  # the learner reads the groups from group_ids only.
  group_size: int

  @property
  def num_rows(self) -> int:
    return self.prompt_tokens.shape[0]


def select_groups(batch: RolloutBatch, keep_groups: Sequence[int]) -> RolloutBatch:
  """The real rows of the listed groups, in that order (no padding rows)."""
  rows = np.concatenate([np.flatnonzero(batch.row_valid & (batch.group_ids == g))
                         for g in keep_groups]) if len(keep_groups) else np.zeros(0, int)
  return dataclasses.replace(batch, **{f.name: getattr(batch, f.name)[rows]
                                       for f in dataclasses.fields(batch)
                                       if f.name != "group_size"})


def concat_rollouts(parts: Sequence[RolloutBatch], rows: int, pad_id: int = 0) -> RolloutBatch:
  """Stacks the real rows of ``parts`` and pads to ``rows`` rows.

  Group ids are renumbered 0..n-1 in order of appearance; prompts are
  left-padded to the widest part. All parts must share the response width; their
  groups may differ in size (the group ids say which rows form a group).
  """
  parts = [p for p in parts if p.num_rows]
  if not parts:
    raise ValueError("concat_rollouts: nothing to concatenate")
  widths = {p.response_tokens.shape[1] for p in parts}
  if len(widths) != 1:
    raise ValueError(f"concat_rollouts: parts differ in response width {widths}")
  prompt_width = max(p.prompt_tokens.shape[1] for p in parts)
  real = [select_groups(p, list(dict.fromkeys(p.group_ids[p.row_valid].tolist())))
          for p in parts]
  total = sum(p.num_rows for p in real)
  if total > rows:
    raise ValueError(f"concat_rollouts: {total} real rows do not fit in {rows} rows")
  group_ids, next_id = [], 0
  for p in real:
    rank = {g: next_id + i for i, g in enumerate(dict.fromkeys(p.group_ids.tolist()))}
    group_ids.append(np.array([rank[g] for g in p.group_ids.tolist()], np.int64))
    next_id += len(rank)
  pad_rows = rows - total

  def stack(name, fill, width=None):
    arrays = [getattr(p, name) for p in real]
    if width is not None:
      arrays = [np.pad(a, ((0, 0), (width - a.shape[1], 0)), constant_values=fill)
                for a in arrays]
    out = np.concatenate(arrays)
    pad_shape = (pad_rows,) + out.shape[1:]
    return np.concatenate([out, np.full(pad_shape, fill, out.dtype)])

  return RolloutBatch(
      prompt_tokens=stack("prompt_tokens", pad_id, prompt_width),
      prompt_mask=stack("prompt_mask", False, prompt_width),
      response_tokens=stack("response_tokens", pad_id),
      response_mask=stack("response_mask", False),
      old_logprobs=stack("old_logprobs", 0.0),
      lengths=stack("lengths", 0),
      group_ids=np.concatenate([np.concatenate(group_ids).astype(np.int32),
                                np.zeros(pad_rows, np.int32)]),
      row_valid=np.arange(rows) < total,
      scores=stack("scores", 0.0),
      group_size=parts[0].group_size)
