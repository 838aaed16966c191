"""Where the suite's time goes: set ``SAGC_TEST_PROFILE=FILE`` (``tests/conftest.py`` then
loads this plugin).

Each test's wall-clock (setup, call and teardown) and the XLA compile time and count
that ``jax.monitoring`` reports while it runs (``backend_compile_duration``: a
persistent-cache hit counts too, with its read time). A worker writes ``FILE.<worker>``;
xdist's controller (or a run without ``-n``) merges them into ``FILE`` (JSON, one entry
per test) and prints the modules by wall-clock::

  SAGC_TEST_PROFILE=/tmp/quick.json python -m pytest -n 2 -m "not slow" tests

Compile time in a process a test starts is not seen; compiles on the warm-up pool's
threads are, so a test's compile time can exceed its wall-clock.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import time

import pytest

_EVENT = "/jax/core/compile/backend_compile_duration"
_current = {"test": "<collection>"}
_stats: dict[str, dict[str, float]] = {}


def _entry(test: str) -> dict[str, float]:
  return _stats.setdefault(test, {"wall_s": 0.0, "compile_s": 0.0, "compiles": 0})


def _on_duration(event: str, duration: float, **kwargs) -> None:
  if event == _EVENT:
    entry = _entry(_current["test"])
    entry["compile_s"] += duration
    entry["compiles"] += 1


def pytest_configure(config):
  if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
    import jax.monitoring
    jax.monitoring.register_event_duration_secs_listener(_on_duration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  _current["test"] = item.nodeid
  start = time.monotonic()
  yield
  _entry(item.nodeid)["wall_s"] += time.monotonic() - start
  _current["test"] = "<between tests>"


def pytest_sessionfinish(session):
  path = os.environ["SAGC_TEST_PROFILE"]
  worker = getattr(session.config, "workerinput", {}).get("workerid")
  if worker is not None:
    with open(f"{path}.{worker}", "w", encoding="utf-8") as f:
      json.dump(_stats, f)
    return
  merged = dict(_stats)
  for part in sorted(glob.glob(f"{path}.gw*")):
    with open(part, encoding="utf-8") as f:
      merged.update(json.load(f))
    os.remove(part)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(merged, f, indent=1, sort_keys=True)
  modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
  for test, entry in merged.items():
    row = modules[test.partition("::")[0]]
    row[0] += entry["wall_s"]
    row[1] += entry["compile_s"]
    row[2] += entry["compiles"]
  reporter = session.config.pluginmanager.get_plugin("terminalreporter")
  if reporter is None:
    return
  total = [sum(r[i] for r in modules.values()) for i in range(3)]
  reporter.write_line(f"\ntest time {total[0]:.0f} s, of which XLA compilation "
                      f"{total[1]:.0f} s ({total[2]:.0f} compilations); by module:")
  for module, (wall, compile_s, count) in sorted(modules.items(), key=lambda m: -m[1][0]):
    reporter.write_line(f"  {module:42s} {wall:7.1f} s   compile {compile_s:6.1f} s "
                        f"({count:.0f})")
  reporter.write_line(f"per test: {path}")
