"""Ahead-of-time compiled programs by shape key, warmed on a thread per core.

A run compiles tens of XLA programs before its first step (the sampler's shared
prefills and decode segments, the learner's steps per bucket, the eval samplers).
Compiling them one after another leaves all but one core idle: XLA compiles
outside the GIL, so a thread pool compiles several at once. Tracing and lowering
stay on the calling thread, one program after another (``flax.nnx`` graph merges
and JAX tracing are not made thread-safe here), and are the cheap part.

Every component keeps its programs in a ``ProgramCache`` and says which keys its
warm-up needs (``WarmupJob``); ``warm`` then compiles the missing ones of several
components in one pool, so short and long compilations of different components
share the cores.

Compilation counting (``compile_count``): XLA compilations are counted per jitted
function through ``jax.monitoring``.

"Zero new compilations after warm-up" is a correctness property of the
sampler and learner (bucketed shapes must cover every group size the
controller can pick). JAX reports every backend compilation as the duration
event ``/jax/core/compile/backend_compile_duration`` with the jitted
function's name (``fun_name='jit(name)'``); one process-wide listener tallies
them so any component can take a snapshot before and after its warm-up.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Sequence

import jax.monitoring

__all__ = ["ProgramCache", "WarmupJob", "compile_count", "counts_by_function", "install", "warm"]

PROGRESS_EVERY_S = 10.0     # a progress line at most this often while warming up


class ProgramCache:
  """Compiled programs keyed by shape; ``lower(key, *args)`` lowers a missing one.

  ``get`` compiles on first use (after warm-up that is a recompilation, which the
  components' tests forbid); ``warm`` fills many keys at once.
  """

  def __init__(self, lower: Callable[..., Any]):
    self._lower = lower
    self._compiled: dict[Hashable, Any] = {}

  def get(self, key: Hashable, *args) -> Any:
    if key not in self._compiled:
      self._compiled[key] = self._lower(key, *args).compile()
    return self._compiled[key]

  def lower(self, key: Hashable, *args) -> Any:
    """The lowered (not compiled) program of ``key``, e.g. for a cost report."""
    return self._lower(key, *args)

  def __contains__(self, key: Hashable) -> bool:
    return key in self._compiled

  def __len__(self) -> int:
    return len(self._compiled)


@dataclasses.dataclass(frozen=True)
class WarmupJob:
  """Keys of one ``ProgramCache`` to compile, with the extra arguments of its lowering."""
  cache: ProgramCache
  keys: Sequence[Hashable]
  args: tuple = ()


def warm(jobs: Iterable[WarmupJob], workers: int | None = None,
         log: Callable[[str], None] | None = None) -> int:
  """Compiles every missing key of ``jobs``; returns how many programs were new.

  Lowered one by one on this thread, compiled on ``workers`` threads (default:
  one per core); ``log`` gets one line with the time of each phase, and a progress
  line ("n of N programs") every ``PROGRESS_EVERY_S`` while a phase goes on.
  """
  start = time.perf_counter()
  # Each cache's missing keys once, with the lowering arguments of the first job naming it.
  missing: dict[tuple[int, Hashable], tuple[WarmupJob, Hashable]] = {}
  for job in jobs:
    for key in job.keys:
      if key not in job.cache:
        missing.setdefault((id(job.cache), key), (job, key))
  if not missing:
    return 0
  pending: list[tuple[ProgramCache, Hashable, Any]] = []
  said = start
  for job, key in missing.values():
    pending.append((job.cache, key, job.cache.lower(key, *job.args)))
    if log is not None and time.perf_counter() - said >= PROGRESS_EVERY_S:
      said = time.perf_counter()
      log(f"  tracing and lowering: {len(pending)} of {len(missing)} programs "
          f"({said - start:.0f} s)")
  workers = max(1, min(len(pending), workers or os.cpu_count() or 1))
  lowered = time.perf_counter()
  # Not a ``with`` block: its exit waits for every running compile, so a stop signal
  # (the trainer's handler raises in this thread) would wait minutes for XLA. The
  # compiles left running are abandoned; the process that stops exits without them.
  pool = concurrent.futures.ThreadPoolExecutor(workers)
  try:
    futures = [pool.submit(item[2].compile) for item in pending]
    while True:
      done, running = concurrent.futures.wait(futures, timeout=PROGRESS_EVERY_S)
      if not running:
        break
      if log is not None:
        log(f"  compiling: {len(done)} of {len(futures)} programs done "
            f"({time.perf_counter() - lowered:.0f} s)")
    compiled = [f.result() for f in futures]
  except BaseException:
    pool.shutdown(wait=False, cancel_futures=True)
    raise
  pool.shutdown()
  for (cache, key, _), program in zip(pending, compiled):
    cache._compiled[key] = program
  if log is not None:
    log(f"  {len(pending)} programs: traced and lowered in {lowered - start:.1f} s, "
        f"compiled in {time.perf_counter() - lowered:.1f} s on {workers} threads")
  return len(pending)


_EVENT = "/jax/core/compile/backend_compile_duration"
_counts: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()
_registered = False


def _on_duration(event: str, duration: float, **kwargs) -> None:
  del duration
  if event == _EVENT:
    with _lock:
      _counts[kwargs.get("fun_name", "<unknown>")] += 1


def install() -> None:
  """Registers the listener once per process (idempotent)."""
  global _registered
  with _lock:
    if not _registered:
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      _registered = True


def compile_count(name_contains: str | None = None) -> int:
  """Compilations so far, optionally only of functions whose name contains a string."""
  return sum(n for fun, n in counts_by_function().items()
             if name_contains is None or name_contains in fun)


def counts_by_function() -> dict[str, int]:
  install()
  with _lock:
    return dict(_counts)
