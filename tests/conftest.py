"""Test-session setup: 8 fake CPU devices for the sharding tests.

The device count is fixed when jax initialises its backend, so it must be set
before any test module imports jax. Single-device code is unaffected (arrays
live on device 0 unless a mesh says otherwise).
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

# libtpu (the `tpu` extra, for the AOT tests) takes a per-machine lockfile when JAX
# initialises; the AOT CLI test starts a second process that must load it too.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
