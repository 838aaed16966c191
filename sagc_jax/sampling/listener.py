"""What a sampler tells its caller while a call runs: rows that have finished, and
when the host is free because the device is busy.

Why. A synchronous RL step scores its responses on the host (detokenize, verify,
user reward functions), and without overlap that work starts only when the last
response has stopped. The refill sampler knows, at every segment boundary, which
rows have stopped for good; the sub-call path knows it after each sub-call. A
``RolloutListener`` receives those rows (``rows_done``) and is lent the host while
the device decodes the rest (``work_while``), so the scoring of finished rows hides
behind the decoding of the stragglers: the tail the step waits for after the last
token shrinks to the rows that finished last.

``work_while`` runs on the sampler's own (main) thread, between dispatching a device
program and reading its result, so a listener may do its work there (a reward that
needs the main thread, such as math-verify's ``signal.alarm`` timeouts, keeps them)
and keep the device busy by returning as soon as ``busy()`` says the program has
finished; or it may work on a thread of its own and return at once
(``rewards.streaming.StreamingScorer`` does either).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import jax
import numpy as np

from sagc_jax.runtime.distributed import to_host
from sagc_jax.runtime.stop import StopRequested

__all__ = ["RolloutListener", "wait_for"]


class RolloutListener(Protocol):

  def rows_done(self, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
    """Rows of the call (global row ids, real rows only) that will not change again:
    their response tokens ``[len(rows), max_new_tokens]`` (valid up to ``lengths``)."""

  def work_while(self, busy: Callable[[], bool]) -> None:
    """Does pending host work while ``busy()`` is True, and returns soon after it is
    False (or when nothing is pending)."""


def wait_for(tree: Any, listener: RolloutListener | None) -> Any:
  """``to_host(tree)``, lending the host to ``listener`` while the device computes it."""
  if listener is not None:
    pending = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    try:
      listener.work_while(lambda: not all(x.is_ready() for x in pending))
    except StopRequested:
      raise                          # the run ends: the program is abandoned
    except BaseException:
      jax.block_until_ready(tree)    # no program of this call may outlive it (its host
      raise                          # callback would reach the next call's sink)
  return to_host(tree)
