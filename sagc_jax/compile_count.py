"""Counts XLA compilations per jitted function through ``jax.monitoring``.

"Zero new compilations after warm-up" is a correctness property of the
sampler and learner (bucketed shapes must cover every group size the
controller can pick). JAX reports every backend compilation as the duration
event ``/jax/core/compile/backend_compile_duration`` with the jitted
function's name (``fun_name='jit(name)'``); one process-wide listener tallies
them so any component can take a snapshot before and after its warm-up.
"""

from __future__ import annotations

import collections
import threading

import jax.monitoring

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
  install()
  with _lock:
    if name_contains is None:
      return sum(_counts.values())
    return sum(n for fun, n in _counts.items() if name_contains in fun)


def counts_by_function() -> dict[str, int]:
  install()
  with _lock:
    return dict(_counts)
