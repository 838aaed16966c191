"""DAPO's dynamic-sampling rule (Yu et al. 2025, Sec. 3.2): which groups of a sampling
round a step keeps. One rule for the trainer (``rl.dynamic_sampling``) and the replay
engine (``replay.engine``).

A group whose rewards are all equal (every response right, or every one wrong) has
zero advantages and gives no policy gradient, so DAPO keeps only groups whose rewards
vary, in order, until the step holds its target number of groups; the caller samples
further rounds of new prompts at the step's G until then or until its rounds limit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["keep_informative"]


def keep_informative(varied: np.ndarray, sizes: np.ndarray, wanted: int,
                     rows_free: int | None = None) -> np.ndarray:
  """The keep mask of a round's groups: in order, each group whose rewards vary
  (``varied``) while fewer than ``wanted`` are kept and, when ``rows_free`` is given,
  while its ``sizes`` rows fit in the rows still free (a group that does not fit is
  passed over: a later, smaller one may)."""
  keep = np.zeros(len(varied), bool)
  for j in np.flatnonzero(varied):
    if wanted <= 0:
      break
    if rows_free is not None:
      if sizes[j] > rows_free:
        continue
      rows_free -= int(sizes[j])
    keep[j] = True
    wanted -= 1
  return keep
