"""Shared plumbing of the absl/ml_collections command-line tools.

Flags are defined only when a tool actually runs (never at import, so tests
and other tools can import the modules freely); a ``ValueError`` from config
validation becomes a one-line ``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence


def run_absl_tool(main: Callable[[Sequence[str], object], None],
                  define_flags: Callable[[], object]) -> None:
  """Defines the flags, runs ``main(argv, FLAGS)`` under ``absl.app``."""
  from absl import app

  flags = define_flags()
  try:
    app.run(lambda argv: main(argv, flags))
  except ValueError as err:
    print(f"error: {err}", file=sys.stderr)
    raise SystemExit(2) from None


def reject_positional(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")
