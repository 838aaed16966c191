"""The training reward: a weighted sum of named reward terms, built-in or the user's.

``reward.name`` is the task's *verifier* (``exact_match`` or ``math_verify``, see
``sagc_jax.rewards.verifiers``): its correctness flags define accuracy everywhere (training
metrics, held-out evaluation, pass@k). ``reward.fns`` / ``reward.weights`` define what
the learner maximises; left empty, the reward is the verifier's score alone (what
every run did before pluggable rewards). A term is

* a built-in name: ``exact_match`` / ``math_verify`` (that verifier's score: 1 if
  correct, plus ``reward.format_weight`` if formatted) or ``format`` (1 if the task
  verifier finds a parseable final answer, else 0);
* ``"package.module:callable"``: a user function called the way TRL calls its reward
  functions, ``fn(prompts=[...], completions=[...], **fields)``, where ``fields`` are
  the examples' dataset fields (``answer``, ``id``, ...), one list entry per
  completion (only the fields the function accepts are passed unless it takes
  ``**kwargs``; ``prompts`` too). It returns one float per completion, or None where
  the term does not apply (it then adds nothing to that completion's reward, and is
  left out of the term's logged mean).

A user function must never cost the run: when a call raises, times out
(``reward.timeout_s``) or returns something malformed, each completion is scored on
its own; a completion whose call still fails scores 0 for that term, is counted in
``errors`` (``reward/errors`` in the metrics), and the first failure of each term is
logged with the offending completion truncated. User functions run in one worker
process (spawned, so its calls run on its own main thread: math-verify's signal
timeouts work there); a call that overruns the timeout is stopped by killing that
process, which the next call restarts. Even code that never releases the GIL (a
backtracking regex) cannot stall the trainer.

The specs themselves (names, imports, start-up checks) are ``sagc_jax.rewards.specs``.
This module imports neither JAX nor TFDS.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from sagc_jax.rewards.specs import (BUILTIN_TERMS, check_distinct, load_callable,
                                    probe_callable, spawn_child, stop_child, term_name)
from sagc_jax.rewards.verifiers import REWARD_NAMES, RewardFunction, make_reward_fn

__all__ = ["MixedReward", "RewardMix", "RewardTerm", "reward_mix_from_config"]

_SHOWN_CHARS = 200
_MAX_TIMEOUTS_PER_CALL = 3     # then the term's remaining completions are not retried


class MixedReward(NamedTuple):
  """Per-completion results; every field has the completions as its first axis, so
  that multi-process runs can gather each one by rows."""

  scores: np.ndarray      # float32 [n]: sum over terms of weight * value (None -> 0)
  correct: np.ndarray     # bool [n]: the task verifier's correctness
  formatted: np.ndarray   # bool [n]: the task verifier's format flag
  terms: np.ndarray       # float32 [n, num_terms]: each term's value, NaN = not applicable
  errors: np.ndarray      # int32 [n]: failed term calls (raised / timed out / malformed)


class RewardTerm(NamedTuple):
  name: str               # the metric name: reward/<name>
  spec: str               # as configured: a built-in name or "module:callable"
  weight: float


class _CallFailed(Exception):
  """A user term's call raised, crashed its worker or returned something malformed."""


class _CallTimedOut(_CallFailed):
  """A user term's call overran ``reward.timeout_s`` (its worker was killed)."""


# Largest |value| a user term may return. The learner's advantages are float32 group
# statistics; 1e39 is finite in float64 but inf in float32, and squares of values past
# ~1e19 overflow float32 in the group variance. 1e9 leaves every weighted sum and square
# finite while no plausible reward comes near it.
REWARD_LIMIT = 1e9


def _as_values(out: Any, n: int) -> list[float]:
  """A user function's output as n floats (NaN for None); raises ``_CallFailed``."""
  if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
    raise _CallFailed(f"returned {type(out).__name__}, not a sequence of {n} values")
  try:
    values = list(out)
  except Exception as err:  # noqa: BLE001 - e.g. a 0-d array: malformed, not fatal
    raise _CallFailed(f"returned {type(out).__name__} that cannot be read as a sequence "
                      f"({type(err).__name__}: {err})") from None
  if len(values) != n:
    raise _CallFailed(f"returned {len(values)} values for {n} completions")
  return [math.nan if v is None else _as_value(v, i) for i, v in enumerate(values)]


def _as_value(v: Any, i: int) -> float:
  """The value at position ``i`` of a user function's output (not None) as a float;
  raises ``_CallFailed``."""
  if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
    raise _CallFailed(f"returned {v!r} ({type(v).__name__}) at position {i}: "
                      "a float or None is expected")
  try:
    value = float(v)
  except OverflowError:
    value = math.inf
  if not math.isfinite(value):
    raise _CallFailed(f"returned {str(v)[:40]} at position {i}: rewards must be finite")
  if abs(value) > REWARD_LIMIT:
    raise _CallFailed(f"returned {str(v)[:40]} at position {i}: rewards must be within "
                      f"+-{REWARD_LIMIT:.0e} (the learner works in float32, where the group "
                      "statistics of larger values overflow)")
  return value


def _worker_main(conn: Any, specs: Sequence[str]) -> None:
  """The reward-worker process: imports the user functions, then answers calls
  ``(spec, kwargs, n)`` with ``("ok", floats)`` or ``("error", message)``. Calls run on
  this process's main thread (so functions that use ``signal`` timeouts, such as
  math-verify, work)."""
  fns = {spec: load_callable(spec) for spec in specs}
  conn.send(("ready", None))
  while True:
    try:
      message = conn.recv()
    except EOFError:
      return
    if message is None:
      return
    spec, kwargs, n = message
    try:
      conn.send(("ok", _as_values(fns[spec](**kwargs), n)))
    except _CallFailed as err:
      conn.send(("error", str(err)))
    except BaseException as err:  # noqa: BLE001 - reported to the trainer
      conn.send(("error", f"raised {type(err).__name__}: {str(err)[:500]}"))


class _RewardWorker:
  """One process that runs the user reward functions, killed and restarted when a call
  overruns ``reward.timeout_s``: a thread could not be stopped, and code that holds
  the GIL (a backtracking regex) would block the trainer itself."""

  _START_TIMEOUT_S = 300.0        # spawn + imports of the user modules

  def __init__(self, specs: Sequence[str]):
    self.specs = list(specs)
    self._proc = None
    self._conn = None
    self.restarts = 0

  def _start(self) -> None:
    self._proc, self._conn = spawn_child(_worker_main, (self.specs,), "sagc-reward-worker")
    if not self._conn.poll(self._START_TIMEOUT_S):
      self._stop()
      raise RuntimeError("the reward worker process did not start within "
                         f"{self._START_TIMEOUT_S:.0f} s")
    try:
      self._conn.recv()
    except EOFError:
      self._stop()
      raise RuntimeError("the reward worker process died while importing "
                         f"{self.specs}; see its error above") from None

  def _stop(self) -> None:
    if self._proc is not None:
      stop_child(self._proc, self._conn)
    self._proc = self._conn = None

  def call(self, spec: str, kwargs: dict[str, Any], n: int, timeout_s: float) -> list[float]:
    if self._proc is None or not self._proc.is_alive():
      if self._proc is not None:
        self._stop()
        self.restarts += 1
      self._start()
    self._conn.send((spec, kwargs, n))
    if not self._conn.poll(timeout_s):
      self._stop()                   # the next call starts a fresh worker
      self.restarts += 1
      raise _CallTimedOut(f"timed out after {timeout_s:g} s (reward.timeout_s)")
    try:
      status, payload = self._conn.recv()
    except EOFError:
      self._stop()
      self.restarts += 1
      raise _CallFailed("crashed the reward worker process") from None
    if status != "ok":
      raise _CallFailed(payload)
    return payload

  def close(self) -> None:
    if self._conn is not None:
      try:
        self._conn.send(None)
      except OSError:
        pass
    if self._proc is not None:
      self._proc.join(5)
    self._stop()


class _UserTerm:
  """One user reward function, called safely (see the module docstring)."""

  def __init__(self, name: str, spec: str, worker: _RewardWorker, timeout_s: float,
               log: Callable[[str], None]):
    self.name = name
    self.spec = spec
    self.worker = worker
    self.timeout_s = timeout_s
    self.log = log
    self.accepted = probe_callable(spec, timeout_s)   # never imported in this process
    self.failures_logged = 0

  def _call(self, prompts: list[str], completions: list[str],
            fields: dict[str, list[Any]], rows: Sequence[int]) -> list[float]:
    kwargs = {k: [v[r] for r in rows] for k, v in {"prompts": prompts, **fields}.items()
              if self.accepted is None or k in self.accepted}
    kwargs["completions"] = [completions[r] for r in rows]
    return self.worker.call(self.spec, kwargs, len(rows), self.timeout_s)

  def __call__(self, prompts: list[str], completions: list[str],
               fields: dict[str, list[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(values [n] with NaN = not applicable, failed [n] bool)."""
    n = len(completions)
    values = np.full(n, np.nan, np.float64)
    failed = np.zeros(n, bool)
    try:
      values[:] = self._call(prompts, completions, fields, range(n))
      return values, failed
    except _CallFailed:
      pass                                  # find the completion(s) it fails on
    timeouts = 0
    for r in range(n):
      if timeouts >= _MAX_TIMEOUTS_PER_CALL:
        failed[r] = True
        continue
      try:
        values[r] = self._call(prompts, completions, fields, [r])[0]
      except _CallFailed as err:
        failed[r] = True
        timeouts += isinstance(err, _CallTimedOut)
        if not self.failures_logged:
          shown = completions[r][:_SHOWN_CHARS] + ("..." if len(completions[r]) >
                                                   _SHOWN_CHARS else "")
          self.log(f"warning: reward {self.name!r} {err} on completion {shown!r}; it scores "
                   "0 for this term and is counted in reward/errors (only the first "
                   "failure of each reward is shown)")
        self.failures_logged += 1
    values[failed] = 0.0
    return values, failed


class RewardMix:
  """Scores completions: the task verifier's flags plus the weighted terms."""

  def __init__(self, verifier: str, terms: Sequence[RewardTerm], *, format_weight: float = 0.0,
               workers: int = 0, timeout_s: float = 10.0,
               log: Callable[[str], None] = print):
    if not terms:
      terms = [RewardTerm(verifier, verifier, 1.0)]
    check_distinct([t.spec for t in terms])
    self.terms = list(terms)
    self.verifier_name = verifier
    self._verifiers: dict[str, RewardFunction] = {}
    self._users: dict[str, _UserTerm] = {}
    user_specs = [t.spec for t in terms if t.spec not in BUILTIN_TERMS]
    self._worker = _RewardWorker(user_specs) if user_specs else None
    try:
      for name in {verifier, *(t.spec for t in terms if t.spec in REWARD_NAMES)}:
        self._verifiers[name] = make_reward_fn(name, format_weight, workers)
      for t in terms:
        if t.spec not in BUILTIN_TERMS:
          self._users[t.spec] = _UserTerm(t.name, t.spec, self._worker, timeout_s, log)
    except Exception:
      self.close()
      raise

  @property
  def term_names(self) -> list[str]:
    return [t.name for t in self.terms]

  @property
  def needs_main_thread(self) -> bool:
    """Whether calls must come from the main thread (an in-process math-verify keeps its
    timeouts there); user terms run in their worker process and may be called from any
    one thread at a time."""
    return any(v.needs_main_thread for v in self._verifiers.values())

  def verify(self, completions: Sequence[str], answers: Sequence[str]):
    """The task verifier alone (``RewardResult``): what accuracy is measured with."""
    return self._verifiers[self.verifier_name](completions, answers)

  def __call__(self, completions: Sequence[str], answers: Sequence[str],
               prompts: Sequence[str] | None = None,
               fields: dict[str, Sequence[Any]] | None = None) -> MixedReward:
    """``fields``: per-completion dataset fields for user terms (``answer`` is added)."""
    completions, answers = list(completions), list(answers)
    n = len(completions)
    prompts = list(prompts) if prompts is not None else [""] * n
    fields = {k: list(v) for k, v in (fields or {}).items()}
    fields.setdefault("answer", answers)
    for key, value in fields.items():
      if len(value) != n:
        raise ValueError(f"reward field {key!r} has {len(value)} entries for {n} completions")
    judged = {name: fn(completions, answers) for name, fn in self._verifiers.items()}
    task = judged[self.verifier_name]
    values = np.zeros((n, len(self.terms)), np.float64)
    errors = np.zeros(n, np.int32)
    for j, t in enumerate(self.terms):
      if t.spec == "format":
        values[:, j] = task.formatted
      elif t.spec in judged:
        values[:, j] = judged[t.spec].scores
      else:
        values[:, j], failed = self._users[t.spec](prompts, completions, fields)
        errors += failed
    weights = np.array([t.weight for t in self.terms], np.float64)
    scores = np.nansum(values * weights, axis=1) if n else np.zeros(0)
    return MixedReward(scores.astype(np.float32), task.correct, task.formatted,
                       values.astype(np.float32), errors)

  def close(self) -> None:
    for fn in self._verifiers.values():
      fn.close()
    if self._worker is not None:
      self._worker.close()

  def __enter__(self) -> "RewardMix":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def reward_mix_from_config(reward: Any, log: Callable[[str], None] = print) -> RewardMix:
  """The ``RewardMix`` of a validated config's ``reward`` section."""
  specs = list(reward.fns)
  weights = list(reward.weights) or [1.0] * len(specs)
  terms = [RewardTerm(term_name(s), s, float(w)) for s, w in zip(specs, weights)]
  return RewardMix(reward.name, terms, format_weight=reward.format_weight,
                   workers=reward.workers, timeout_s=reward.timeout_s, log=log)
