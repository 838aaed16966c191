"""Loading and saving Hugging Face checkpoint folders (``config.json`` + safetensors).

Loading never materialises the whole model on one device: the model is first built
abstractly (``nnx.eval_shape``: shapes, dtypes and sharding annotations, no memory),
then each tensor is read from its safetensors file on its own and placed straight into
its shards with ``jax.make_array_from_callback``. Host memory peaks at one tensor; on a
multi-host mesh each process only builds the shards it owns.

Only safetensors are read. A folder with only pickle weights (``*.bin``, ``*.pt``) is
refused: unpickling runs arbitrary code. Every mismatch between the checkpoint and the
config (missing or unexpected tensors, wrong shapes) is reported by tensor name.

Saving writes ``config.json`` in transformers' format (both RoPE dialects) and
``model.safetensors`` (or shards + ``model.safetensors.index.json`` when
``max_shard_bytes`` is given), which ``AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from sagc_jax.models.config import ModelConfig
from sagc_jax.models.transformer import Transformer, abstract_model, place_state
from sagc_jax.runtime.distributed import to_device
from sagc_jax.runtime.storage import read_json

__all__ = ["from_pretrained", "hf_tensor_name", "read_config", "save_pretrained"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Buffers some older exports persisted; recomputed from the config, never loaded.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|(^|\.)rotary_emb\.original_inv_freq$")

PathLike = str | os.PathLike


def hf_tensor_name(path: tuple) -> tuple[str, bool]:
  """nnx parameter path -> (HF tensor name, whether HF stores it transposed)."""
  parts = [str(p) for p in path]
  transposed = parts[-1] == "kernel"
  if transposed:
    parts[-1] = "weight"
  name = ".".join(parts)
  return (name if parts[0] == "lm_head" else "model." + name), transposed


def read_config(path: PathLike) -> ModelConfig:
  """``ModelConfig`` from ``<path>/config.json``."""
  cfg_file = Path(path) / "config.json"
  if not cfg_file.is_file():
    raise FileNotFoundError(f"no config.json in checkpoint folder {str(path)!r}")
  return ModelConfig.from_hf_dict(read_json(cfg_file))


@contextlib.contextmanager
def _open_safetensors(file: Path):
  """``safe_open`` whose failures (a truncated file, a damaged header) name the file."""
  try:
    handle = safe_open(str(file), framework="np")
  except Exception as err:  # noqa: BLE001 - safetensors raises its own error type
    raise ValueError(f"{file} is not a readable safetensors file ({err}); re-download or "
                     "re-export it") from None
  with handle as f:
    yield f


def _save_file(tensors: dict[str, np.ndarray], file: Path) -> None:
  """safetensors' ``save_file``, whose I/O failure (a full disk) is an ``OSError``
  naming the file, as the tools report one: safetensors raises its own error type."""
  try:
    save_file(tensors, str(file), metadata={"format": "pt"})
  except SafetensorError as err:
    full = "os error 28" in str(err)
    raise OSError(errno.ENOSPC if full else errno.EIO,
                  os.strerror(errno.ENOSPC) if full else str(err), str(file)) from None


def _tensor_files(folder: Path) -> dict[str, Path]:
  """Tensor name -> safetensors file holding it (from the index, or file headers)."""
  index = folder / _INDEX
  if index.is_file():
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index} has no 'weight_map' dict")
    missing_files = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
    if missing_files:
      raise FileNotFoundError(f"{index} names shard files that do not exist: {missing_files}")
    return {name: folder / f for name, f in weight_map.items()}
  files = [folder / _SINGLE] if (folder / _SINGLE).is_file() else sorted(
      folder.glob("*.safetensors"))
  if not files:
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
      raise ValueError(
          f"checkpoint folder {str(folder)!r} has only pickle weights {pickles}; they are not "
          "loaded (unpickling can run arbitrary code). Convert them to safetensors first.")
    raise FileNotFoundError(f"no safetensors weights in checkpoint folder {str(folder)!r}")
  out = {}
  for file in files:
    with _open_safetensors(file) as f:
      for name in f.keys():
        out[name] = file
  return out


def _expected_tensors(state: nnx.State) -> dict[str, tuple[tuple, bool, tuple[int, ...]]]:
  """HF name -> (nnx path, transposed, HF shape) for every parameter of the model."""
  out = {}
  for path, var in nnx.to_flat_state(state):
    name, transposed = hf_tensor_name(path)
    shape = tuple(var.shape)
    out[name] = (path, transposed, shape[::-1] if transposed else shape)
  return out


def _check_names(expected: Iterable[str], available: Iterable[str], cfg: ModelConfig,
                 folder: Path) -> None:
  expected, available = set(expected), set(available)
  ignorable = {n for n in available if _IGNORED.search(n)}
  if cfg.tie_word_embeddings:
    ignorable.add("lm_head.weight")  # some exports keep the tied copy; it equals the embedding
  missing = sorted(expected - available)
  unexpected = sorted(available - expected - ignorable)
  problems = []
  if missing:
    problems.append(f"missing tensors {missing[:8]}{' ...' if len(missing) > 8 else ''}")
  if unexpected:
    problems.append(f"unexpected tensors {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
  if problems:
    raise ValueError(f"checkpoint {str(folder)!r} does not match its config "
                     f"(model_type={cfg.model_type}): " + "; ".join(problems))


def from_pretrained(path: PathLike, dtype: jnp.dtype = jnp.float32,
                    mesh: Mesh | None = None) -> tuple[Transformer, ModelConfig]:
  """Loads an HF checkpoint folder (Llama 3.x, Qwen2/2.5, Qwen3) as ``(model, cfg)``.

  Args:
    path: folder with ``config.json`` and ``model.safetensors`` or sharded safetensors
      (``model.safetensors.index.json``).
    dtype: parameter dtype (tensors are cast on the host while loading).
    mesh: if given, each parameter is placed with its fitted NamedSharding on this mesh;
      otherwise on the default device.
  """
  folder = Path(path)
  if not folder.is_dir():
    raise FileNotFoundError(f"checkpoint folder {str(path)!r} does not exist")
  cfg = read_config(folder)
  files = _tensor_files(folder)
  graphdef, state = nnx.split(abstract_model(cfg, dtype))
  shardings = place_state(state, mesh)
  expected = _expected_tensors(state)
  _check_names(expected, files, cfg, folder)
  target = {path: var for path, var in nnx.to_flat_state(state)}
  np_dtype = np.dtype(jnp.dtype(dtype))
  with contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(_open_safetensors(f))
               for f in sorted(set(files[n] for n in expected))}
    for name, (nnx_path, transposed, hf_shape) in expected.items():
      handle = handles[files[name]]
      found = tuple(handle.get_slice(name).get_shape())
      if found != hf_shape:
        raise ValueError(f"tensor {name!r} in {files[name].name} has shape {found}, "
                         f"expected {hf_shape} from config.json")
      host = handle.get_tensor(name)
      if transposed:
        host = host.T
      host = np.ascontiguousarray(host.astype(np_dtype, copy=False))
      if not np.isfinite(host).all():
        raise ValueError(f"tensor {name!r} in {files[name]} has NaN or inf values: the "
                         "checkpoint is damaged; refusing to load it")
      target[nnx_path].set_value(to_device(host, shardings[nnx_path]))
      del host
  return nnx.merge(graphdef, state), cfg


def _host_copy(x: jax.Array) -> np.ndarray:
  if not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def _dtype_name(model: Transformer) -> str:
  dtypes = {str(v.get_value().dtype) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  return dtypes.pop() if len(dtypes) == 1 else "float32"


def save_pretrained(model: Transformer, cfg: ModelConfig, out_dir: PathLike, *,
                    max_shard_bytes: int | None = None) -> Path:
  """Writes ``out_dir/config.json`` and the weights in HF names and layouts.

  Tensors keep the parameters' dtype. With ``max_shard_bytes`` the weights are split into
  ``model-0000i-of-0000n.safetensors`` files plus an index, and host memory holds one shard
  at a time. Multi-host: every process must call it (arrays are all-gathered); only
  process 0 writes.
  """
  if model.cfg != cfg:
    raise ValueError("save_pretrained: cfg differs from the model's own config")
  out = Path(out_dir)
  shards: list[list] = [[]]
  size = total = 0
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    name, transposed = hf_tensor_name(path)
    value = var.get_value()
    nbytes = value.size * value.dtype.itemsize
    if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append((name, transposed, value))
    size += nbytes
    total += nbytes
  writer = jax.process_index() == 0
  if writer:
    out.mkdir(parents=True, exist_ok=True)
  names = ([_SINGLE] if len(shards) == 1 else
           [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
  weight_map = {}
  for file_name, shard in zip(names, shards):
    tensors = {}
    for name, transposed, value in shard:
      host = _host_copy(value)
      tensors[name] = np.ascontiguousarray(host.T if transposed else host)
      weight_map[name] = file_name
    if writer:
      _save_file(tensors, out / file_name)
    del tensors
  if writer:
    if len(shards) > 1:
      index = {"metadata": {"total_size": total}, "weight_map": weight_map}
      (out / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True), encoding="utf-8")
    elif (out / _INDEX).exists():
      (out / _INDEX).unlink()  # a stale index would shadow the new single file
    config = cfg.to_hf_dict(_dtype_name(model))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
  return out

