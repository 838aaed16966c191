"""Verifiable rewards: exact match (synthetic task) and math-verify (GSM8K / MATH).

Rewards run on the host between the jitted sampler and learner, once per rollout, so
they must be cheap, deterministic and safe next to JAX:

* ``exact_match`` compares the integer of the last ``answer N`` line with the reference.
  It costs microseconds; ``submit`` returns an already-completed future.
* ``math_verify`` parses the reference and the response with the ``math-verify`` package
  (LaTeX / sympy equivalence: ``\\frac{1}{2}`` equals ``0.5``). That costs milliseconds per
  response and uses ``signal.alarm`` timeouts, which only work on the main thread. With
  ``workers > 0`` it runs in a reusable process pool (chunked, order preserved) whose
  workers run their tasks on their own main thread, so the timeouts stay on; the pool uses
  the ``spawn`` start method because forking a parent in which JAX has started its
  threads can deadlock the child (as with any spawn pool, the main script must guard its
  entry point with ``if __name__ == "__main__":``). With ``workers == 0`` it runs in the
  calling thread, with timeouts on the main thread and without them elsewhere
  (math-verify's ``parsing_timeout=None, timeout_seconds=None``).

Scores: ``1.0`` if correct else ``0.0``, plus ``format_weight`` if the response is
*formatted*: for ``exact_match`` it has a parseable ``answer N`` line (an integer); for
``math_verify`` it contains a ``\\boxed{...}``. The default ``format_weight = 0`` gives
pure 0/1 correctness rewards. Both flags are returned next to the scores for metrics.

This module imports neither JAX nor TFDS (process-pool workers import it on start).
"""

from __future__ import annotations

import abc
import concurrent.futures
import concurrent.futures.process
import math
import multiprocessing
import re
import threading
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = ["REWARD_NAMES", "ExactMatchReward", "MathVerifyReward", "RewardFunction",
           "RewardResult", "extract_synthetic_answer", "last_boxed_content",
           "make_reward_fn"]

REWARD_NAMES = ("exact_match", "math_verify")


class RewardResult(NamedTuple):
  """Per-response rewards, all of shape [num_responses]."""

  scores: np.ndarray     # float32: 1/0 correctness + format_weight * formatted
  correct: np.ndarray    # bool
  formatted: np.ndarray  # bool


# --------------------------------------------------------------------------- parsing
_ANSWER_LINE = re.compile(r"^answer (.*)$", re.MULTILINE)
_INTEGER = re.compile(r"-?\d+")


def extract_synthetic_answer(text: str) -> str | None:
  """The integer on the LAST line that starts with ``"answer "``; None if missing.

  ``"12-3=9\\nanswer 9\\n"`` -> ``"9"``; ``"answer -12"`` -> ``"-12"``. Only the last
  answer line counts: if it does not hold exactly one integer (surrounding spaces
  allowed) the result is None even when an earlier answer line was fine.
  """
  lines = _ANSWER_LINE.findall(text)
  if not lines:
    return None
  value = lines[-1].strip()
  return value if _INTEGER.fullmatch(value) else None


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed_content(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced.

  ``"so \\boxed{\\frac{1}{2}}."`` -> ``"\\frac{1}{2}"``. The brace-less form
  ``\\boxed 5`` gives ``"5"``. None if there is no complete box (unbalanced braces).
  """
  for match in reversed(list(_BOXED.finditer(text))):
    start = match.end()
    if start < len(text) and text[start] == "{":
      depth = 0
      for i in range(start, len(text)):
        if text[i] == "{":
          depth += 1
        elif text[i] == "}":
          depth -= 1
          if depth == 0:
            return text[start + 1:i]
      continue  # unbalanced: try an earlier box
    bare = re.match(r"[^\s$]+", text[start:])
    if bare and match.group(0).endswith((" ", "\t", "\n")):
      return bare.group(0)
  return None


# ----------------------------------------------------------------------- interface
def _check_inputs(responses: Sequence[str], answers: Sequence[str]) -> tuple[list[str], list[str]]:
  for name, seq in (("responses", responses), ("answers", answers)):
    if isinstance(seq, (str, bytes)):
      raise TypeError(f"{name} must be a sequence of str, not a single {type(seq).__name__}")
  responses, answers = list(responses), list(answers)
  if len(responses) != len(answers):
    raise ValueError(f"got {len(responses)} responses but {len(answers)} answers: "
                     "they must pair up one to one")
  for name, seq in (("responses", responses), ("answers", answers)):
    for i, item in enumerate(seq):
      if not isinstance(item, str):
        raise TypeError(f"{name}[{i}] must be a str, got {type(item).__name__}")
  return responses, answers


class RewardFunction(abc.ABC):
  """Scores responses against reference answers; a context manager (see ``close``)."""

  name: str = "base"

  def __init__(self, format_weight: float = 0.0):
    if (isinstance(format_weight, bool) or not isinstance(format_weight, (int, float))
        or not math.isfinite(format_weight)):
      raise ValueError(f"format_weight must be a finite number, got {format_weight!r}")
    self.format_weight = float(format_weight)

  @abc.abstractmethod
  def _judge(self, responses: list[str], answers: list[str]) -> tuple[list[bool], list[bool]]:
    """(correct, formatted) flags of each response."""

  def _result(self, correct: Sequence[bool], formatted: Sequence[bool]) -> RewardResult:
    correct_arr = np.asarray(correct, dtype=bool).reshape(-1)
    formatted_arr = np.asarray(formatted, dtype=bool).reshape(-1)
    scores = correct_arr.astype(np.float32) + np.float32(self.format_weight) * formatted_arr
    return RewardResult(scores.astype(np.float32), correct_arr, formatted_arr)

  def __call__(self, responses: Sequence[str], answers: Sequence[str]) -> RewardResult:
    return self.submit(responses, answers).result()

  def submit(self, responses: Sequence[str],
             answers: Sequence[str]) -> concurrent.futures.Future:
    """Starts scoring; the future's result is the ``RewardResult``.

    The base implementation scores now, in the calling thread, and returns a completed
    future (invalid inputs raise here, not in the future).
    """
    responses, answers = _check_inputs(responses, answers)
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
      future.set_result(self._result(*self._judge(responses, answers)))
    except BaseException as e:  # surfaced by future.result(), like an executor would
      future.set_exception(e)
    return future

  def close(self) -> None:
    """Releases workers (idempotent). A no-op for in-process rewards."""

  @property
  def needs_main_thread(self) -> bool:
    """Whether calls must come from the main thread to keep their timeouts."""
    return False

  def __enter__(self) -> "RewardFunction":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


class ExactMatchReward(RewardFunction):
  """Synthetic task: correct iff the last ``answer N`` integer equals the reference
  (both stripped, compared as strings); formatted iff that integer parses."""

  name = "exact_match"

  def _judge(self, responses: list[str], answers: list[str]) -> tuple[list[bool], list[bool]]:
    extracted = [extract_synthetic_answer(r) for r in responses]
    correct = [e is not None and e == a.strip() for e, a in zip(extracted, answers)]
    return correct, [e is not None for e in extracted]


# ------------------------------------------------------------------------ math-verify
def _gold_text(answer: str) -> str:
  """The reference as math-verify input: boxed unless it already has $...$ or a box."""
  answer = answer.strip()
  if "$" in answer or _BOXED.search(answer):
    return answer
  return "\\boxed{" + answer + "}"


def _math_verify_chunk(pairs: Sequence[tuple[str, str]],
                       use_timeouts: bool) -> list[tuple[bool, bool]]:
  """(correct, formatted) of each (response, answer) pair. Runs in workers too.

  ``use_timeouts`` must be False off the main thread (signal.alarm). References are
  parsed once per distinct value (a group's G responses share one).
  """
  import math_verify  # pylint: disable=g-import-not-at-top (heavy; workers import it once)

  parse_kw = {} if use_timeouts else {"parsing_timeout": None}
  verify_kw = {} if use_timeouts else {"timeout_seconds": None}
  golds: dict[str, Any] = {}
  out = []
  for response, answer in pairs:
    boxed = last_boxed_content(response)
    formatted = boxed is not None
    try:
      if answer not in golds:
        golds[answer] = math_verify.parse(_gold_text(answer), **parse_kw)
      gold = golds[answer]
      pred = math_verify.parse("\\boxed{" + boxed + "}" if formatted else response, **parse_kw)
      correct = bool(gold) and bool(pred) and bool(math_verify.verify(gold, pred, **verify_kw))
    except Exception:  # a malformed response must cost its reward, never the step
      correct = False
    out.append((correct, formatted))
  return out


def _worker_init() -> None:
  import math_verify  # noqa: F401  (pays the import once per worker, at start)


def _check_workers(workers: int) -> int:
  if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
    raise ValueError(f"workers must be an int >= 0, got {workers!r}")
  return workers


class MathVerifyReward(RewardFunction):
  """GSM8K / MATH: math-verify equivalence of the last ``\\boxed{}`` (or, without a box,
  what math-verify extracts from the whole response: its final number / expression)
  with the reference answer; formatted iff a ``\\boxed{}`` is present.

  ``workers > 0``: a process pool (spawn) created here, reused by every call, released
  by ``close()``; calls are split into chunks of about ``n / (4 * workers)`` responses.
  """

  name = "math_verify"

  def __init__(self, format_weight: float = 0.0, workers: int = 0):
    super().__init__(format_weight)
    self.workers = _check_workers(workers)
    self._closed = False
    self._pool: concurrent.futures.ProcessPoolExecutor | None = None
    if workers > 0:
      self._pool = concurrent.futures.ProcessPoolExecutor(
          max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
          initializer=_worker_init)

  @property
  def needs_main_thread(self) -> bool:
    return self._pool is None        # in process: signal.alarm timeouts, main thread only

  def _judge(self, responses: list[str], answers: list[str]) -> tuple[list[bool], list[bool]]:
    use_timeouts = threading.current_thread() is threading.main_thread()
    flags = _math_verify_chunk(list(zip(responses, answers)), use_timeouts)
    return [c for c, _ in flags], [f for _, f in flags]

  def submit(self, responses: Sequence[str],
             answers: Sequence[str]) -> concurrent.futures.Future:
    """With workers: returns at once, scoring proceeds in the pool (chunks gathered in
    order). Without: scores now in the calling thread (see the module docstring) and
    returns a completed future."""
    if self._closed:
      raise RuntimeError("MathVerifyReward is closed")
    if self._pool is None:
      return super().submit(responses, answers)
    pairs = list(zip(*_check_inputs(responses, answers)))
    size = max(1, math.ceil(len(pairs) / (4 * self.workers)))
    chunks = [self._pool.submit(_math_verify_chunk, pairs[i:i + size], True)
              for i in range(0, len(pairs), size)]
    out: concurrent.futures.Future = concurrent.futures.Future()
    remaining = [len(chunks)]
    lock = threading.Lock()

    def on_done(fut: concurrent.futures.Future) -> None:
      with lock:
        remaining[0] -= 1
        error = fut.exception()
        if out.done() or (error is None and remaining[0]):
          return
        if isinstance(error, concurrent.futures.process.BrokenProcessPool):
          error = RuntimeError(
              "a math_verify reward worker died. Workers are started with 'spawn', "
              "which re-imports the main script: its entry point must be guarded by "
              "`if __name__ == '__main__':`")
          error.__cause__ = fut.exception()
        if error is not None:
          out.set_exception(error)
          return
        flags = [f for chunk in chunks for f in chunk.result()]
        out.set_result(self._result([c for c, _ in flags], [f for _, f in flags]))

    if not chunks:
      out.set_result(self._result([], []))
    for chunk in chunks:
      chunk.add_done_callback(on_done)
    return out

  def close(self) -> None:
    self._closed = True
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)
      self._pool = None


def make_reward_fn(name: str, format_weight: float = 0.0, workers: int = 0) -> RewardFunction:
  """The reward called ``name`` (one of ``REWARD_NAMES``).

  ``workers`` only applies to ``math_verify`` (exact match is microseconds per call).
  """
  if name == "exact_match":
    _check_workers(workers)
    return ExactMatchReward(format_weight)
  if name == "math_verify":
    return MathVerifyReward(format_weight, workers)
  raise ValueError(f"unknown reward {name!r}; allowed: {list(REWARD_NAMES)}")
