"""Ahead-of-time compile-and-fit tool: ``python -m sagc_jax.aot`` (needs the ``tpu`` extra).

libtpu allows one process per machine unless told otherwise; compiling for an abstract
topology touches no chip, so several such processes (a test run and a CLI) may share it.

The package imports no JAX itself, so ``python -m sagc_jax.aot --help`` answers at once:
the compile report is ``sagc_jax.aot.compile_report.compile_report``, the chip table
``sagc_jax.aot.chips``.
"""

import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
