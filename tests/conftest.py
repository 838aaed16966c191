"""Test-session setup: 8 fake CPU devices for the sharding tests.

The device count is fixed when jax initialises its backend, so it must be set
before any test module imports jax. Single-device code is unaffected (arrays
live on device 0 unless a mesh says otherwise).
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

# No TPU here: JAX on CPU without loading libtpu (its noise and lockfile), as every
# command does (runtime/platform.py); AOT compilation for abstract TPU topologies
# loads libtpu itself and works with the CPU platform.
from sagc_jax.runtime.platform import choose_platform  # noqa: E402

choose_platform()

# libtpu (the `tpu` extra, for the AOT tests) takes a per-machine lockfile when JAX
# initialises; the AOT CLI test starts a second process that must load it too.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import pytest  # noqa: E402

# Modules whose tests train, start several processes, compile TPU programs or load the
# real model: marked ``slow`` and run after everything else, so that a first failure
# in the fast correctness tests shows within minutes. ``pytest -m "not slow"`` is the
# quick suite, ``pytest -m slow`` the rest (docs/testing.md).
SLOW_MODULES = frozenset({
    "test_aot", "test_compare", "test_completion_log", "test_export", "test_import_model",
    "test_launch", "test_multihost", "test_process_faults", "test_reward_mix",
    "test_storage", "test_trainer"})


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: trains, runs several processes, compiles for "
                          "TPU or loads the real model (runs last; -m 'not slow' skips)")


def pytest_collection_modifyitems(config, items):
  for item in items:
    if item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: item.get_closest_marker("slow") is not None)  # stable
