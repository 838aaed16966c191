"""Ahead-of-time compile-and-fit tool: ``python -m sagc_jax.aot`` (needs the ``tpu`` extra).

libtpu allows one process per machine unless told otherwise; compiling for an abstract
topology touches no chip, so several such processes (a test run and a CLI) may share it.
"""

import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from sagc_jax.aot.chips import CHIPS, ChipSpec, generation_of
from sagc_jax.aot.compile_report import HBM_LIMIT, compile_report, topology_mesh

__all__ = ["CHIPS", "ChipSpec", "HBM_LIMIT", "compile_report", "generation_of", "topology_mesh"]
