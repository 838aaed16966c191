"""Run files on a local disk or in a bucket (``gs://``), through ``etils.epath``.

Why this module exists: on a Cloud TPU pod every worker is a separate VM that
can be preempted and recreated, so the only durable, shared place for a run is
a bucket. A ``--workdir gs://bucket/run`` therefore has to reach every writer
(config, metrics, TensorBoard, summary, plots, checkpoints) rather than
silently becoming a local folder named ``gs:``. Three things differ from a
local disk and are handled here:

* paths: ``run_path`` keeps ``scheme://`` paths as ``epath.Path`` (gcsfs under
  the hood for ``gs://``) and makes local ones absolute ``pathlib.Path``; both
  support ``/``, ``open``, ``read_text``/``write_text``, ``exists`` and ``mkdir``.
* no append: GCS objects are immutable, so ``RewrittenObject`` keeps a file's
  lines in memory and rewrites the whole object (metrics.jsonl).
* inputs that libraries read from local disk only (an HF checkpoint folder,
  TFDS manual files): ``stage`` copies a remote folder once into a local cache
  per host, with a progress line, and reuses it while the source is unchanged.

A remote workdir also gets a local *mirror* folder (``local_mirror``) for what
is cheap to rebuild and needs a real filesystem: the prepared TFDS data and the
built-in tiny model with its supervised warm start (both deterministic).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

STAGED_MARKER = ".sagc_staged.json"
_COPY_CHUNK = 16 << 20


def is_remote(path: str | os.PathLike) -> bool:
  """True for ``scheme://...`` paths (gs://, s3://, memory://, ...)."""
  return "://" in os.fspath(path)


def run_path(path: str | os.PathLike) -> Any:
  """A path object for ``path``: ``epath.Path`` if remote, absolute ``Path`` if local."""
  if is_remote(path):
    from etils import epath
    return epath.Path(os.fspath(path))
  return Path(path).expanduser().absolute()


def read_json(path: Any) -> Any:
  """The JSON value in the file at ``path`` (a str, local or ``gs://``, or a path
  object). Why: json's own error ("Expecting value: line 1 column 29") names no file,
  and the tools read many; this ``ValueError`` names it, and the command-line tools
  print it as one line."""
  file = path if hasattr(path, "read_text") else run_path(path)
  try:
    return json.loads(file.read_text(encoding="utf-8"))
  except ValueError as err:            # JSONDecodeError, UnicodeDecodeError
    raise ValueError(f"{path} is not valid JSON ({err})") from None


def write_text(path: Any, text: str) -> None:
  """``path.write_text(text)``, with an OS error that names the file: Python's own
  does not when the write, not the open, fails (a full disk: "[Errno 28] No space
  left on device")."""
  try:
    path.write_text(text)
  except OSError as err:
    if err.filename is not None:
      raise
    raise OSError(err.errno, err.strerror or str(err), str(path)) from err


def cache_root(configured: str = "") -> Path:
  """Local cache folder: ``configured``, else ``$SAGC_CACHE_DIR``, else ~/.cache/sagc_jax."""
  root = configured or os.environ.get("SAGC_CACHE_DIR") or "~/.cache/sagc_jax"
  return Path(root).expanduser().absolute()


def _cache_key(remote: str) -> Path:
  """``gs://bucket/a/b`` -> ``gs/bucket/a/b`` (a readable, collision-free local name)."""
  scheme, rest = os.fspath(remote).split("://", 1)
  parts = [p for p in rest.split("/") if p not in ("", ".", "..")]
  return Path(scheme, *parts)


def local_mirror(workdir: str | os.PathLike, root: Path) -> Path:
  """The local folder for a run's rebuildable local files (the workdir itself if local)."""
  if is_remote(workdir):
    return root / "runs" / _cache_key(workdir)
  return Path(workdir).expanduser().absolute()


def _listing(source: Any) -> dict[str, int]:
  """``{relative path: size}`` of every file under a remote folder."""
  files, pending = {}, [source]
  while pending:                       # iterdir, not rglob: epath refuses "**" on GCS
    for path in pending.pop().iterdir():
      if path.is_dir():
        pending.append(path)
      else:
        files[os.fspath(path)[len(os.fspath(source)):].lstrip("/")] = path.stat().length
  return files


def stage(source: str, root: Path, log: Callable[[str], None] = print, *,
          what: str = "folder") -> str:
  """A local folder holding ``source``: itself if local, else a cached copy.

  The copy goes to ``<root>/staged/<scheme>/<bucket>/<path>``. It is written
  under a temporary name and renamed when complete, so a kill mid-copy leaves
  nothing that looks finished; a marker records the source's file sizes, and a
  later call (a resumed run on the same host) reuses the copy while the source
  still lists the same files and sizes.
  """
  if not source or not is_remote(source):
    return source
  remote = run_path(source)
  if not remote.exists():
    raise FileNotFoundError(f"{what} {source} does not exist (or is not readable)")
  files = _listing(remote)
  if not files:
    raise FileNotFoundError(f"{what} {source} holds no files")
  dest = root / "staged" / _cache_key(source)
  marker = dest / STAGED_MARKER
  if marker.exists():
    recorded = read_json(marker)
    if recorded.get("source") == source and recorded.get("files") == files:
      log(f"staging {what} {source}: reusing the local copy in {dest}")
      return str(dest)
    log(f"staging {what} {source}: the source changed since {dest} was copied; copying again")
  tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  total, done = sum(files.values()), 0
  start = last = time.perf_counter()
  for i, (rel, size) in enumerate(sorted(files.items()), 1):
    target = tmp / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    with (remote / rel).open("rb") as fin, open(target, "wb") as fout:
      while chunk := fin.read(_COPY_CHUNK):
        fout.write(chunk)
        done += len(chunk)
        now = time.perf_counter()
        if now - last >= 10.0:
          log(f"staging {what} {source}: {done / 2**30:.2f}/{total / 2**30:.2f} GiB, "
              f"file {i}/{len(files)}, {done / 2**20 / max(now - start, 1e-9):.0f} MiB/s")
          last = now
    if target.stat().st_size != size:
      raise IOError(f"staging {what} {source}: {rel} has {target.stat().st_size} bytes, "
                    f"the bucket lists {size}")
  (tmp / STAGED_MARKER).write_text(json.dumps({"source": source, "files": files}))
  shutil.rmtree(dest, ignore_errors=True)
  rename_into_place(tmp, dest, STAGED_MARKER)
  log(f"staging {what} {source}: copied {len(files)} files, {total / 2**30:.2f} GiB to "
      f"{dest} in {time.perf_counter() - start:.1f} s")
  return str(dest)


def _mount_point(path: Path) -> Path:
  """The mount point of the disk that holds ``path`` (an existing folder)."""
  path = path.absolute()
  while not os.path.ismount(path) and path != path.parent:
    path = path.parent
  return path


class DiskFullError(OSError):
  """ENOSPC, told as one sentence (its ``str`` is the message, without "[Errno 28]")."""

  def __str__(self) -> str:
    return self.strerror


def copy_folder(source: Path, dest: Path) -> None:
  """``shutil.copytree(source, dest)``; when the disk fills up, ``dest`` is removed and
  the error is one sentence naming the disk and the space the copy needed (shutil
  reports a failed tree copy as a list of per-file errors)."""
  existed = dest.exists()          # copytree refuses it: never remove what was there
  try:
    shutil.copytree(source, dest)
  except OSError as err:
    if not existed:
      shutil.rmtree(dest, ignore_errors=True)
    causes = [err] + [e for e in (err.args[0] if isinstance(err, shutil.Error)
                                  and err.args and isinstance(err.args[0], list) else ())]
    full = any(getattr(c, "errno", None) == errno.ENOSPC or "[Errno 28]" in str(c)
               for c in causes)
    if not full:
      raise
    disk = _mount_point(dest.parent)
    free = shutil.disk_usage(dest.parent).free
    needed = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    raise DiskFullError(errno.ENOSPC, (
        f"the disk at {disk} is full: copying {source} to {dest.parent} needs "
        f"{needed / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free "
        "(the partial copy was removed); free space there or choose another folder, "
        "then rerun")) from None


def rename_into_place(tmp: Path, dest: Path, marker: str) -> None:
  """Renames the finished local folder ``tmp`` to ``dest``: a reader never sees half a
  folder. When the rename fails because another process on this host put its copy
  there first (``dest / marker`` exists), ``tmp`` is dropped."""
  dest.parent.mkdir(parents=True, exist_ok=True)
  try:
    tmp.rename(dest)
  except OSError:
    shutil.rmtree(tmp, ignore_errors=True)
    if not (dest / marker).exists():
      raise


class FolderUpload:
  """Copies the files of a local folder that grew since the last call to a remote folder.

  For files that libraries write locally and append to (TensorBoard event
  files): they stay local and reach the bucket on ``sync`` (at checkpoints and
  on close). Locally the same folder is used as is (``remote`` None).
  """

  def __init__(self, local: Path, remote: Any | None):
    self.local = local
    self.remote = remote
    self._sizes: dict[Path, int] = {}

  def sync(self) -> None:
    if self.remote is None or not self.local.exists():
      return
    for path in sorted(self.local.rglob("*")):
      if path.is_file() and self._sizes.get(path) != path.stat().st_size:
        data = path.read_bytes()
        (self.remote / path.relative_to(self.local).as_posix()).write_bytes(data)
        self._sizes[path] = len(data)


class AppendedFile:
  """A local line-oriented file, appended and flushed line by line (a kill keeps every line)."""

  def __init__(self, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    self.path = path
    self._file = open(path, "a", encoding="utf-8")

  @property
  def lines(self) -> list[str]:
    return self.path.read_text(encoding="utf-8").splitlines()

  def replace(self, lines: list[str]) -> None:
    self._file.close()
    self.path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    self._file = open(self.path, "a", encoding="utf-8")

  def append(self, line: str) -> None:
    self._file.write(line + "\n")
    self._file.flush()

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class RewrittenObject:
  """A line-oriented file that grows by whole rewrites (object stores have no append).

  ``append`` adds a line in memory and uploads the whole file when
  ``sync_secs`` have passed since the last upload; ``flush`` uploads now
  (the trainer calls it when a checkpoint is saved and on close, so every
  checkpointed step's rows are in the bucket).
  """

  def __init__(self, path: Any, sync_secs: float):
    self.path = path
    self.sync_secs = sync_secs
    self.lines: list[str] = path.read_text().splitlines() if path.exists() else []
    self._dirty = False
    self._last_sync = time.monotonic()

  def replace(self, lines: list[str]) -> None:
    self.lines = list(lines)
    self._dirty = True
    self.flush()

  def append(self, line: str) -> None:
    self.lines.append(line)
    self._dirty = True
    if time.monotonic() - self._last_sync >= self.sync_secs:
      self.flush()

  def flush(self) -> None:
    if self._dirty:
      self.path.write_text("".join(line + "\n" for line in self.lines))
      self._dirty = False
    self._last_sync = time.monotonic()

  def close(self) -> None:
    self.flush()


def line_file(path: Any, sync_secs: float) -> AppendedFile | RewrittenObject:
  """An appendable line file at ``path`` (local: appended; remote: rewritten)."""
  return RewrittenObject(path, sync_secs) if is_remote(path) else AppendedFile(Path(path))
