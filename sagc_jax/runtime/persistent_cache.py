"""JAX's persistent compilation cache, with no broken entry left behind.

Why: JAX writes a cache entry in place and only warns when the write fails, so a full
disk leaves a truncated entry, which every later start fails to read (a warning each
time: JAX never replaces an entry that exists), and the run goes on to its next write
that fails. ``set_cache_dir`` points the cache at a folder and installs, once per
process, a ``warnings.showwarning`` hook on JAX's two cache warnings: the entries of
the program named that do not decompress are removed, and a write that failed for
lack of space is the run's error, one sentence naming the folder.
"""

from __future__ import annotations

import errno
import re
import sys
import warnings
from typing import Any

import jax

from sagc_jax.runtime.storage import DiskFullError, run_path

__all__ = ["set_cache_dir"]

# JAX's warnings (jax/_src/compiler.py), with the program's name or its cache key.
_CACHE_WARNING = re.compile(r"Error (writing|reading) persistent compilation cache entry "
                            r"for '([^']+)'")
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_previous = warnings.showwarning          # what the hook hands every other warning to


def set_cache_dir(folder: str) -> None:
  """Compiled programs are kept in ``folder`` (local or ``gs://``), guarded as the
  module docstring says."""
  global _previous
  jax.config.update("jax_compilation_cache_dir", folder)
  if warnings.showwarning is not _on_warning:
    _previous, warnings.showwarning = warnings.showwarning, _on_warning


def _on_warning(message, category, filename, lineno, file=None, line=None) -> None:
  found = _CACHE_WARNING.match(str(message))
  folder = found and jax.config.jax_compilation_cache_dir
  if folder:
    drop_broken_entries(folder, found.group(2))
    failed = sys.exc_info()[1]     # JAX warns while it handles the write's error
    if found.group(1) == "writing" and getattr(failed, "errno", None) in _NO_ROOM:
      raise DiskFullError(failed.errno, (
          f"no space left on the disk of the compilation cache {folder}: the compiled "
          f"program {found.group(2)} could not be kept (its partial entry was removed); "
          "free space there, or set train.compilation_cache_dir to another disk, and "
          "rerun")) from failed
  _previous(message, category, filename, lineno, file, line)


def drop_broken_entries(folder: Any, name: str) -> None:
  """Removes the entries of program ``name`` (or of the one cache key ``name``) in
  ``folder`` that do not decompress whole, with their access-time files."""
  entry = re.compile(re.escape(name) + r"(-[0-9a-f]{64})?-cache")
  for path in run_path(folder).iterdir():
    if entry.fullmatch(path.name) and not _readable(path):
      for stale in (path, path.with_name(path.name.removesuffix("cache") + "atime")):
        stale.unlink(missing_ok=True)


def _readable(path: Any) -> bool:
  try:
    from jax._src.compilation_cache import decompress_executable   # no public API
    decompress_executable(path.read_bytes())
    return True
  except Exception:  # noqa: BLE001 - an ImportError too: then the entry costs a compile
    return False
