"""What users write in ``reward.fns``: the term specs, their names and start-up checks.

A term is a built-in name (``BUILTIN_TERMS``) or ``"package.module:callable"`` (see
``sagc_jax.rewards.mix`` for how terms are scored). A user module is never imported in
the trainer's process: ``probe_callable`` imports it in a child process with a time
limit, so a module that blocks or fails at import fails start-up with one line naming
it instead of hanging it. ``check_reward_config`` runs these checks when the config's
``reward`` section is built, before the warm start.

This module imports neither JAX nor TFDS.
"""

from __future__ import annotations

import importlib
import inspect
import math
import multiprocessing
import re
from typing import Any, Callable, Sequence

from sagc_jax.rewards.verifiers import REWARD_NAMES

__all__ = ["BUILTIN_TERMS", "IMPORT_TIMEOUT_S", "check_distinct", "check_reward_config",
           "load_callable", "probe_callable", "spawn_child", "stop_child", "term_name"]

BUILTIN_TERMS = (*REWARD_NAMES, "format")
_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def spawn_child(target: Callable[..., None], args: tuple, name: str) -> tuple[Any, Any]:
  """(process, this end of its pipe): ``target(child end, *args)`` in a spawned process
  (forking a process running JAX can hang)."""
  ctx = multiprocessing.get_context("spawn")
  parent, child = ctx.Pipe()
  proc = ctx.Process(target=target, args=(child, *args), daemon=True, name=name)
  proc.start()
  child.close()
  return proc, parent


def stop_child(proc: Any, conn: Any) -> None:
  proc.kill()
  proc.join(5)
  conn.close()


def term_name(spec: str) -> str:
  """``"my_pkg.rewards:length_penalty"`` -> ``"length_penalty"``; built-ins unchanged."""
  return spec.rsplit(":", 1)[-1]


def check_distinct(specs: Sequence[str]) -> None:
  names = [term_name(s) for s in specs]
  if "errors" in names:
    raise ValueError(f"reward.fns={tuple(specs)!r}: a term named 'errors' would overwrite "
                     "reward/errors (the failed-call count); rename the function")
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"reward.fns={tuple(specs)!r}: two terms are named {duplicates}; "
                     "reward/<name> would mix them")


def load_callable(spec: str, key: str = "reward.fns") -> Callable[..., Any]:
  """Imports ``"package.module:callable"``; the error names the key and what failed."""
  if not _CALLABLE.match(spec):
    raise ValueError(f"{key}: {spec!r} is neither a built-in reward {list(BUILTIN_TERMS)} "
                     "nor 'package.module:callable'")
  module_name, attr = spec.split(":")
  try:
    module = importlib.import_module(module_name)
  except ImportError as err:
    raise ValueError(f"{key}: cannot import module {module_name!r} of {spec!r} ({err}); "
                     "it must be importable (installed, or on PYTHONPATH)") from None
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise ValueError(f"{key}: module {module_name!r} has no callable {attr!r}")
  return fn


# Keyword names each user spec accepts, found by ``probe_callable`` in a child process.
_PROBED: dict[str, set[str] | None] = {}
_PROBE_START_TIMEOUT_S = 300.0    # spawn + this package's own imports, before the user's
# A user module's own import may take this long (or reward.timeout_s, if longer): heavy
# dependencies (torch, math-verify) take seconds on a loaded host, a blocked one forever.
IMPORT_TIMEOUT_S = 60.0


def _probe_main(conn: Any, spec: str) -> None:
  """Child of ``probe_callable``: says it is up, then imports ``spec`` and sends
  ``("ok", accepted keywords or None)`` or ``("error", one line)``."""
  conn.send(("ready", None))
  try:
    accepted = _accepted_keywords(load_callable(spec))
    conn.send(("ok", None if accepted is None else sorted(accepted)))
  except ValueError as err:
    conn.send(("error", str(err)))
  except BaseException as err:  # noqa: BLE001 - a SyntaxError, an import-time exception
    conn.send(("error", f"reward.fns: importing {spec!r} raised {type(err).__name__}: "
                        f"{' '.join(str(err).split())[:300]}"))


def probe_callable(spec: str, timeout_s: float) -> set[str] | None:
  """Imports ``spec`` in a child process (never in this one) and returns the keywords
  its function accepts (None = any). Its module gets ``max(IMPORT_TIMEOUT_S,
  timeout_s)`` seconds to import: a module that blocks at import would otherwise hang
  start-up with no output. ValueError names the module on a timeout, a failed import
  or a missing callable."""
  if spec in _PROBED:
    return _PROBED[spec]
  timeout_s = max(IMPORT_TIMEOUT_S, timeout_s)
  proc, parent = spawn_child(_probe_main, (spec,), "sagc-reward-import-check")
  module = spec.split(":")[0]
  try:
    if not parent.poll(_PROBE_START_TIMEOUT_S):
      raise ValueError(f"reward.fns: the process that imports {spec!r} did not start "
                       f"within {_PROBE_START_TIMEOUT_S:.0f} s")
    parent.recv()
    if not parent.poll(timeout_s):
      raise ValueError(f"reward.fns: importing module {module!r} of {spec!r} did not finish "
                       f"within {timeout_s:g} s (does it block or wait at import time?)")
    status, payload = parent.recv()
  except EOFError:
    raise ValueError(f"reward.fns: the process importing {spec!r} died (see its error "
                     "above)") from None
  finally:
    stop_child(proc, parent)
  if status != "ok":
    raise ValueError(payload)
  _PROBED[spec] = None if payload is None else set(payload)
  return _PROBED[spec]


def _accepted_keywords(fn: Callable[..., Any]) -> set[str] | None:
  """Keyword names ``fn`` accepts; None = any (it takes ``**kwargs``)."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return None
  if any(p.kind == p.VAR_KEYWORD for p in params):
    return None
  return {p.name for p in params}


def check_reward_config(reward: Any) -> None:
  """Start-up checks of ``reward.fns`` / ``weights`` / ``timeout_s`` (each error names
  the key and the value); user functions are imported here, so a typo fails before
  the warm start."""
  specs, weights = list(reward.fns), list(reward.weights)
  for spec in specs:
    if not isinstance(spec, str):
      raise ValueError(f"reward.fns: {spec!r} must be a string")
  check_distinct(specs)
  timeout = reward.timeout_s
  if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
      0 < timeout < math.inf):        # inf: a user module that hangs would hang the run
    raise ValueError(f"reward.timeout_s={timeout!r} must be a finite number of seconds > 0")
  for spec in specs:
    if spec not in BUILTIN_TERMS:
      if not _CALLABLE.match(spec):
        load_callable(spec)             # the one-line error for a malformed spec
      probe_callable(spec, timeout)     # imported in a child, with a time limit
  if weights and len(weights) != len(specs):
    raise ValueError(f"reward.weights={tuple(weights)!r} has {len(weights)} entries but "
                     f"reward.fns has {len(specs)}: give one weight per function, or none "
                     "(all 1.0)")
  for w in weights:
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
      raise ValueError(f"reward.weights: {w!r} must be a finite number")
