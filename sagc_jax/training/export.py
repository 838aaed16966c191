"""The writer of a policy as a Hugging Face folder (``python -m sagc_jax.export`` and
``train.export_every``; what the folder holds is in the CLI's docstring).

``export`` reads one checkpoint's parameters and the run's ``config.json`` and never
writes into the run; ``write_hf_folder`` writes the weights in HF names and layouts
next to the starting folder's tokenizer and generation files: locally into a sibling
folder renamed into place when complete, to gs:// by an upload of the finished folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

from sagc_jax.models import from_pretrained, save_pretrained
from sagc_jax.runtime.storage import (FolderUpload, cache_root, is_remote, local_mirror,
                                      run_path, stage)
from sagc_jax.training.evaluation import load_run_config, reader_config
from sagc_jax.training.inputs import load_checkpoint_weights, policy_source
from sagc_jax.training.warm_start import SFT_MARKER

# Files of the base folder the export leaves out besides weights (``*.safetensors``,
# ``*.bin``) and hidden ones: what it writes anew, and the warm start's marker.
_REPLACED = ("config.json", "model.safetensors.index.json", SFT_MARKER)


def base_folder(config: Any, workdir: str, base: str | None = None) -> Path:
  """The HF folder the run started from (tokenizer, config, generation settings)."""
  root = cache_root(config.train.local_cache_dir)
  if base:
    return Path(stage(base, root, what="base folder"))
  if config.model.path:
    return Path(policy_source(config, root))
  mirror = local_mirror(workdir, root)
  for name, marker in (("sft_model", SFT_MARKER), ("init_model", "model.safetensors")):
    if (mirror / name / marker).exists():
      return mirror / name
  raise FileNotFoundError(f"the run's starting folder (tiny model) is not in {mirror} on this "
                          "host; pass --base with an HF folder holding its tokenizer")


def export(workdir: str, out: str, *, step: int | None = None, dtype: str | None = None,
           base: str | None = None, log=print) -> dict[str, Any]:
  """Writes the export; returns ``{"step", "out", "files"}``."""
  if run_path(out).exists():
    raise ValueError(f"--out {out} exists already; pick a new folder (nothing is overwritten)")
  run = run_path(workdir)
  config = reader_config(load_run_config(run))
  folder = base_folder(config, workdir, base)
  dtype = dtype or config.model.dtype
  target = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
  model, cfg = from_pretrained(folder, dtype=target)
  directory = config.train.checkpoint_dir or os.fspath(run / "checkpoints")
  step = load_checkpoint_weights(model, directory, step, log=log)

  files = write_hf_folder(model, cfg, folder, out)
  log(f"exported step {step} of {workdir} ({dtype}) to {out}: {', '.join(files)}")
  return {"step": step, "out": out, "files": files}


def prepare_export_root(config: Any, workdir: Any, log: Callable[[str], None]) -> None:
  """Checks at start-up that the export folder is writable (not at the first export,
  steps later) and removes hidden partial exports a killed run left behind
  (``.step_N.partial-*``: ``write_hf_folder`` renames a finished one into place, so a
  partial one is never read; the run lock keeps other writers out)."""
  root = config.train.export_dir or os.fspath(Path(workdir) / "exports")
  if is_remote(root):
    return
  key = "train.export_dir" if config.train.export_dir else "the export folder"
  try:
    Path(root).mkdir(parents=True, exist_ok=True)
  except OSError as err:
    raise ValueError(f"{key} {root} cannot be created ({err.strerror}); "
                     "train.export_every needs a writable folder") from None
  if not os.access(root, os.W_OK | os.X_OK):
    raise ValueError(f"{key} {root} is not writable; train.export_every needs a "
                     "writable folder (or set train.export_every=0)")
  for stale in sorted(Path(root).glob(".*.partial-*")):
    if stale.is_dir():
      shutil.rmtree(stale, ignore_errors=True)
      log(f"removed {stale}: a partial export left by an interrupted run")


def write_hf_folder(model: Any, cfg: Any, folder: Path | None, out: str, *,
                    replace: bool = False) -> list[str]:
  """Writes ``model`` (its weights in their own dtype) as an HF folder at ``out``,
  with every other file of ``folder`` (tokenizer, chat template, generation
  settings); returns the file names. Multi-process: every process must call it
  (the weights are all-gathered); process 0 writes (the others may pass no folder).
  ``replace``: an existing ``out`` (a step written again after a resume) is replaced
  once the new folder is complete.
  """
  writer = jax.process_index() == 0
  # A local folder is written next to its destination and renamed into place (a
  # kill leaves a hidden partial folder, never a partial export); a bucket's goes
  # through the local temporary directory.
  parent = None if is_remote(out) else Path(out).absolute().parent
  if parent is not None and writer:
    parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix=f".{Path(out).name}.partial-",
                                   dir=parent if writer else None) as tmp:
    local = Path(tmp) / "export"
    if writer:
      if folder is None:
        raise ValueError("write_hf_folder: process 0 needs the starting folder")
      local.mkdir(parents=True)
      for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in _REPLACED and not path.name.startswith(".") \
            and not path.name.endswith((".safetensors", ".bin")):
          shutil.copy2(path, local / path.name)
    save_pretrained(model, cfg, local)
    if not writer:
      return []
    if not (local / "generation_config.json").exists():
      eos = list(cfg.eos_token_ids)
      (local / "generation_config.json").write_text(json.dumps({
          "bos_token_id": cfg.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos,
          "pad_token_id": cfg.pad_token_id if cfg.pad_token_id is not None else eos[0]},
          indent=1))
    files = sorted(p.name for p in local.iterdir())
    usual_file_modes(local)
    if is_remote(out):
      FolderUpload(local, run_path(out)).sync()
    else:
      target = Path(out).absolute()
      if target.exists() and replace:
        target.rename(Path(tmp) / "replaced")    # removed with the temporary directory
      local.rename(target)
  return files


def usual_file_modes(folder: Path) -> None:
  """The modes a plain ``mkdir`` / ``open`` would give under the user's umask: the
  export is written in a ``tempfile`` folder (mode 0700) and some writers create 0600
  files, which other users and serving containers could not read."""
  umask = os.umask(0)
  os.umask(umask)
  folder.chmod(0o777 & ~umask)
  for path in folder.iterdir():
    if path.is_file():
      path.chmod(0o666 & ~umask)
