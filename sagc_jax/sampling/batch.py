"""The host-side result of one sampler call (``SampleBatch``) and its rows per prompt."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

__all__ = ["SampleBatch", "rows_per_prompt"]


@dataclasses.dataclass
class SampleBatch:
  """Host (numpy) result of one ``generate`` call, padded to the row bucket.

  Padding rows have ``row_valid == False``, length 0, pad tokens and zero
  log-probs. ``response_mask[r, t]`` is True for the ``lengths[r]`` generated
  tokens of row r (the stop token included).
  """
  prompt_tokens: np.ndarray      # [B, Tp] int32, left-padded
  prompt_mask: np.ndarray        # [B, Tp] bool
  response_tokens: np.ndarray    # [B, N] int32
  response_logprobs: np.ndarray  # [B, N] float32
  response_mask: np.ndarray      # [B, N] bool
  lengths: np.ndarray            # [B] int32
  row_valid: np.ndarray          # [B] bool
  group_ids: np.ndarray          # [B] int32 (prompt index of the row)
  # Per real group, as delivered by the in-jit host callback during this call (the
  # SAGC controller's inputs). In a multi-process run a process may receive none;
  # ``distributed.share_sink_stats`` gives every process the delivered values.
  group_max: np.ndarray          # [num_prompts] float64
  group_median: np.ndarray       # [num_prompts] float64
  group_size: int
  num_prompts: int
  decode_steps: int              # while-loop iterations actually run (max over sub-calls)
  seconds: float                 # wall-clock of the device call(s)
  decode_slots: int = 0          # sum over sub-calls of rows x decode steps (padded work)
  # Rows per prompt when they differ (``generate(group_sizes=...)``); None: group_size.
  group_sizes: np.ndarray | None = None

  @property
  def num_rows(self) -> int:
    if self.group_sizes is not None:
      return int(self.group_sizes.sum())
    return self.num_prompts * self.group_size


def rows_per_prompt(num_prompts: int, group_size: int,
                 group_sizes: Sequence[int] | None) -> np.ndarray:
  """Rows per prompt: ``group_size`` each, or the validated ``group_sizes``."""
  if group_sizes is None:
    return np.full(num_prompts, group_size, np.int64)
  sizes = np.asarray(group_sizes)
  if (sizes.shape != (num_prompts,) or not np.issubdtype(sizes.dtype, np.integer)
      or (sizes <= 0).any()):
    raise ValueError(f"group_sizes must be {num_prompts} positive ints (one per prompt), got "
                     f"{np.asarray(group_sizes).tolist()}")
  return sizes.astype(np.int64)
