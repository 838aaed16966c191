"""Scoring a sampling round's completions while the sampler still decodes the rest.

Why. A synchronous step cannot learn before every response of the round is scored,
and without overlap the scoring (detokenize, verify, the user's reward terms) starts
only when the last straggler stops. Most rows stop long before it: with refill
decoding (``sampling.refill``) they stop at every segment boundary, with sub-calls
after every sub-call. ``StreamingScorer`` is the sampler's ``RolloutListener``: it
keeps the rows that finished and scores them, in chunks, while the device decodes
the rest. What is left when the call returns (the rows that finished last) is scored
by ``finish``, which is then the only reward time the step waits for.

Where the scoring runs:

* ``background=True``: on a worker thread of its own, so the sampler's host loop
  never waits for a reward call (a reward that waits on a sandbox, a judge or a
  worker process costs the decode loop nothing). The reward must allow calls from
  another thread: user terms do (they run in their worker process), and so does
  math-verify in its process pool (``reward.workers > 0``).
* ``background=False``: on the sampler's own thread, between dispatching a device
  program and reading its result (``sampling.listener.wait_for``), a chunk at a time
  while the program runs. For rewards that need the main thread: math-verify in
  process (``reward.workers=0``) keeps its ``signal.alarm`` timeouts only there. A
  chunk that outlasts the program delays the next one by the rest of the chunk.

Same rewards, for rewards of one completion each. The reward API is per completion
(as TRL's: one value per completion, from that completion and its own fields), so
scoring in chunks gives the values of one call over the whole round; ``finish`` also
checks every row scored early against the call's final output and raises on a
difference. A user term whose values depend on the rest of its batch (a ranking
within the call) would see chunks instead: turn the overlap off for it
(``rollout.overlap_rewards=False``). And a term's cap on retries after timeouts
(``mix._MAX_TIMEOUTS_PER_CALL``) counts per chunk, so a term that hangs on every
completion costs up to that many timeouts per chunk, not per round.

This module imports neither JAX nor TFDS.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Sequence

import numpy as np

from sagc_jax.rewards.mix import MixedReward

__all__ = ["StreamingScorer"]

# Rows per reward call while the device decodes: small, so that a main-thread scorer
# is back soon after a program ends.
CHUNK_ROWS = 8


class StreamingScorer:
  """Scores this process's rows of one sampler call as they finish.

  Args:
    rows: this process's rows of the call (global row ids, contiguous).
    detokenize: response token ids (the stop token included) -> text.
    score: ``(local row indices, texts) -> MixedReward`` of those rows, where a local
      index is ``row - rows.start``.
    background: score on a worker thread (else on the sampler's thread, in
      ``work_while``).
    chunk_rows: rows per reward call while the device decodes.
  """

  def __init__(self, rows: range, detokenize: Callable[[np.ndarray], str],
               score: Callable[[Sequence[int], list[str]], MixedReward], *,
               background: bool, chunk_rows: int = CHUNK_ROWS):
    if chunk_rows <= 0:
      raise ValueError(f"chunk_rows={chunk_rows} must be positive")
    self.rows, self.detokenize, self.score, self.chunk_rows = rows, detokenize, score, chunk_rows
    self._tokens: dict[int, np.ndarray] = {}
    self._pending: collections.deque[int] = collections.deque()
    self._scored: list[tuple[list[int], list[str], MixedReward]] = []
    self._chunk_times: list[tuple[float, float, int]] = []      # (start, end, rows)
    self._cond = threading.Condition()
    self._closing = False
    self._error: BaseException | None = None
    self.overlapped_s = 0.0      # scoring done before ``finish``: while the device decoded
    self.overlapped_rows = 0
    self.tail_s = 0.0            # ``finish``: the scoring the step waits for
    self._thread = None
    if background:
      self._thread = threading.Thread(target=self._work, name="sagc-streaming-scorer",
                                      daemon=True)
      self._thread.start()

  # ------------------------------------------------------- RolloutListener
  def rows_done(self, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> None:
    with self._cond:
      for row, row_tokens, length in zip(rows, tokens, lengths):
        row = int(row)
        if row not in self.rows:
          continue                 # another process's row
        if row in self._tokens:
          raise RuntimeError(f"row {row} was delivered twice by the sampler")
        self._tokens[row] = np.array(row_tokens[:int(length)])
        self._pending.append(row)
      self._cond.notify()

  def work_while(self, busy: Callable[[], bool]) -> None:
    if self._thread is not None:
      return                       # the worker thread scores
    while self._pending and busy():
      self._score_next(self.chunk_rows)

  # ------------------------------------------------------------- scoring
  def _take(self, count: int) -> list[int]:
    return [self._pending.popleft() for _ in range(min(count, len(self._pending)))]

  def _score_chunk(self, chunk: list[int]) -> None:
    start = time.perf_counter()
    texts = [self.detokenize(self._tokens[row]) for row in chunk]
    result = self.score([row - self.rows.start for row in chunk], texts)
    self._scored.append((chunk, texts, result))
    self._chunk_times.append((start, time.perf_counter(), len(chunk)))

  def _score_next(self, count: int) -> None:
    with self._cond:
      chunk = self._take(count)
    self._score_chunk(chunk)

  def _work(self) -> None:
    while True:
      with self._cond:
        while not self._pending and not self._closing:
          self._cond.wait()
        if not self._pending:
          return
        # Once the call has returned, what is left goes in one reward call.
        chunk = self._take(len(self._pending) if self._closing else self.chunk_rows)
      try:
        self._score_chunk(chunk)
      except BaseException as err:  # noqa: BLE001 - re-raised by ``finish``
        with self._cond:
          self._error = err
        return

  def close(self, drain: bool = False, wait: bool = True) -> None:
    """Stops the worker thread (idempotent): after its current chunk, or, with
    ``drain``, once it has scored every row delivered so far. ``wait=False`` returns
    at once (the step is abandoned: a slow reward must not hold up the stop; the
    daemon thread ends with its chunk)."""
    with self._cond:
      self._closing = True
      if not drain:
        self._pending.clear()
      self._cond.notify()
    if self._thread is not None and wait:
      self._thread.join()

  def finish(self, response_tokens: np.ndarray, lengths: np.ndarray
             ) -> tuple[list[str], MixedReward]:
    """Texts and rewards of every row of ``rows``, in row order, given the call's
    final output (``response_tokens`` [call rows, N], ``lengths``): rows the sampler
    did not deliver are taken from it; what is not scored yet is scored now."""
    start = time.perf_counter()
    self.close(drain=True)                      # the worker scores what it holds first
    if self._error is not None:
      raise self._error
    for row in self.rows:
      final = response_tokens[row, :int(lengths[row])]
      early = self._tokens.get(row)
      if early is None:
        self.rows_done(np.array([row]), final[None], np.array([final.size]))
      elif not np.array_equal(early, final):
        raise RuntimeError(
            f"row {row}: the {early.size} tokens scored while decoding differ from the "
            f"call's final {final.size} (a sampler delivered a row before it was final)")
    if self._pending or not self._scored:
      self._score_next(len(self._pending))       # also the empty call of an empty share
    self.tail_s = time.perf_counter() - start
    for begin, end, count in self._chunk_times:
      if begin < start:                          # started while the device decoded
        self.overlapped_s += min(end, start) - begin
        self.overlapped_rows += count
    order = [row for chunk, _, _ in self._scored for row in chunk]
    texts = [text for _, chunk_texts, _ in self._scored for text in chunk_texts]
    merged = MixedReward(*(np.concatenate(field)
                           for field in zip(*(result for _, _, result in self._scored))))
    by_row = np.argsort(np.asarray(order, np.int64), kind="stable")
    return [texts[i] for i in by_row], MixedReward(*(field[by_row] for field in merged))
