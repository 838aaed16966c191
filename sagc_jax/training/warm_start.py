"""Where the policy starts: a user checkpoint, or the tiny model + supervised warm start.

With ``model.path`` set, the policy is that HF folder. Otherwise the built-in
tiny model is written to ``<workdir>/init_model`` (random init, offline) and,
on the synthetic task with ``sft.enabled``, fine-tuned on the reference
solutions into ``<workdir>/sft_model`` (an HF folder too). Both are cached: a
resumed run, an eval, or every arm of a comparison reuses them. The SFT folder
is written under a temporary name and renamed when complete, so a kill during
the warm start never leaves a half-written policy behind.

A finished warm start is also kept in the local cache (``<cache>/warm_starts/<key>``,
``key`` a hash of everything that determines it: the tiny model, the dataset, the
``sft`` settings, the seed and this code), so that another run with the same
settings (a comparison after the main job, a new workdir) copies it instead of
fine-tuning again for minutes. The cache is per machine: XLA:CPU numerics differ
between CPU models, and so would the fine-tuned weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from sagc_jax.models import build_tiny_checkpoint, from_pretrained, load_tokenizer, \
    save_pretrained
from sagc_jax.runtime.storage import copy_folder, read_json, rename_into_place
from sagc_jax.training.sft import supervised_finetune, tokenize_examples

SFT_MARKER = "sft_done.json"
TINY_MARKER = "sagc_tiny_model.json"      # which tiny model a cached init_model is


def starting_folder(config: Any, workdir: Path, *, model_path: str | None = None) -> Path:
  """The HF folder the policy is built from, before any warm start: ``model_path``
  (default ``config.model.path``), else the built-in tiny model, written to
  ``<workdir>/init_model`` on first use. Its tokenizer is the policy's."""
  model_path = config.model.path if model_path is None else model_path
  if model_path:
    return Path(model_path)
  init_dir = workdir / "init_model"
  identity = {"tiny_family": config.model.tiny_family, "init_seed": config.model.init_seed}
  if not (init_dir / "model.safetensors").exists():
    try:
      build_tiny_checkpoint(init_dir, seed=config.model.init_seed,
                            family=config.model.tiny_family)
      (init_dir / TINY_MARKER).write_text(json.dumps(identity))
    except OSError:       # a full disk: no half-written model to be taken for built later
      shutil.rmtree(init_dir, ignore_errors=True)
      raise
  elif (init_dir / TINY_MARKER).exists():
    # The cached policy (and the run's checkpoints) belong to the tiny model it was
    # built as: a changed family or seed would otherwise be silently ignored.
    built = read_json(init_dir / TINY_MARKER)
    for key, value in identity.items():
      if built.get(key) != value:
        raise ValueError(f"model.{key}={value!r}, but this workdir's tiny model was built "
                         f"with {key}={built.get(key)!r} ({init_dir}); resume with the run's "
                         "setting or start the new model in another workdir")
  return init_dir


def prepare_policy(config: Any, workdir: Path, train_source: Any,
                   log: Callable[[str], None] = print, *, model_path: str | None = None,
                   cache: Path | None = None) -> Path:
  """The HF folder of the initial policy, building and caching it when needed.

  ``workdir`` is a local folder (a remote run's local mirror); ``model_path``
  overrides ``config.model.path`` (the trainer passes its local staged copy);
  ``cache``: the local cache root whose ``warm_starts`` a warm start is copied from
  and kept in (None: this workdir only).
  """
  start = starting_folder(config, workdir, model_path=model_path)
  if (config.model.path if model_path is None else model_path) or not (
      config.sft.enabled and config.data.name == "synthetic"):
    return start
  sft_dir = workdir / "sft_model"
  if (sft_dir / SFT_MARKER).exists():
    log(f"starting policy: the supervised warm start cached in {sft_dir}")
    return sft_dir
  kept = None if cache is None else Path(cache) / "warm_starts" / warm_start_key(config)
  if kept is not None and (kept / SFT_MARKER).exists():
    _copy_into_place(kept, sft_dir)
    log(f"starting policy: the supervised warm start of an earlier run with the same "
        f"model, data, sft settings and seed, copied from {kept}")
    return sft_dir
  supervised_warm_start(config, start, sft_dir, train_source, log)
  if kept is not None:
    try:
      _copy_into_place(sft_dir, kept)
    except OSError as err:        # a full or read-only cache costs reuse, not the run
      log(f"warning: the warm start could not be kept in {kept} ({err}); later runs "
          "will fine-tune again")
  return sft_dir


def warm_start_key(config: Any) -> str:
  """A hash of what determines the tiny model's warm start: the model, the dataset,
  the ``sft`` settings, the run's seed (the batch order) and the code that trains it."""
  import jax
  import optax

  from sagc_jax.data import builder_options, synthetic
  from sagc_jax.models import tiny, tokenizer, transformer
  from sagc_jax.training import sft

  settings = {"tiny_family": config.model.tiny_family, "init_seed": config.model.init_seed,
              "data": [config.data.name, builder_options(config.data)],
              "sft": config.sft.to_dict(), "seed": config.seed,
              "versions": [jax.__version__, optax.__version__]}
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
  # The code that builds the model, the data and the tokens, and trains.
  for module in (tiny, tokenizer, transformer, synthetic, sft):
    digest.update(Path(module.__file__).read_bytes())
  digest.update(Path(__file__).read_bytes())
  return digest.hexdigest()[:24]


def _copy_into_place(source: Path, target: Path) -> None:
  """Copies a finished folder to ``target`` under a temporary name, then renames it:
  a reader never sees half a folder, and of two concurrent writers one wins."""
  tmp = _fresh_tmp(target)
  copy_folder(source, tmp)
  rename_into_place(tmp, target, SFT_MARKER)


def _fresh_tmp(target: Path) -> Path:
  """This process's temporary name for ``target``, once the temporary folders a killed
  earlier copy or warm start left beside it are removed."""
  for stale in target.parent.glob(f"{target.name}.tmp*"):
    shutil.rmtree(stale, ignore_errors=True)
  return target.with_name(f"{target.name}.tmp{os.getpid()}")


def answer_only(examples: list[dict], prob: float, seed: int) -> list[dict]:
  """``examples`` with each solution reduced to its answer line with probability
  ``prob`` (independently, from a generator seeded by ``seed``)."""
  rng = np.random.default_rng((seed, 1))
  return [dict(ex, solution=f"answer {ex['answer']}\n") if rng.random() < prob else ex
          for ex in examples]


def _finetune(model: Any, cfg: Any, tokenizer: Any, examples: list[dict], steps: int,
              warmup_steps: int, config: Any, log: Callable[[str], None]) -> list[float]:
  """``steps`` steps of supervised fine-tuning on ``examples``; returns the losses."""
  sft = config.sft
  ids, attn, loss_mask, dropped = tokenize_examples(
      tokenizer, examples, sft.seq_bucket, eos_id=cfg.eos_token_ids[0],
      pad_id=cfg.pad_token_id if cfg.pad_token_id is not None else 0)
  if dropped:
    log(f"supervised warm start: {dropped} examples longer than sft.seq_bucket="
        f"{sft.seq_bucket} tokens were left out")
  return supervised_finetune(model, ids, attn, loss_mask, steps=steps,
                             batch_size=sft.batch_size, lr=sft.lr,
                             warmup_steps=warmup_steps, seed=config.seed, log=log)


def supervised_warm_start(config: Any, init_dir: Path, sft_dir: Path, train_source: Any,
                          log: Callable[[str], None]) -> None:
  sft = config.sft
  log(f"supervised warm start: {sft.steps} steps of batch {sft.batch_size} on the "
      f"{len(train_source)} training solutions")
  model, cfg = from_pretrained(init_dir)
  tokenizer = load_tokenizer(init_dir)
  examples = [train_source[i] for i in range(len(train_source))]
  start = time.perf_counter()
  losses = _finetune(model, cfg, tokenizer, examples, sft.steps, sft.warmup_steps, config, log)
  if sft.guess_stage_steps:
    # A warm start that has the skill of writing the work but rarely uses it: the
    # starting point of the SAGC paper's regime, where RL discovers longer reasoning.
    lazy = answer_only(examples, sft.guess_stage_prob, config.seed)
    log(f"supervised warm start, guess stage: {sft.guess_stage_steps} steps with "
        f"{sft.guess_stage_prob:.0%} of the solutions reduced to their answer line")
    losses += _finetune(model, cfg, tokenizer, lazy, sft.guess_stage_steps,
                        min(sft.warmup_steps, sft.guess_stage_steps - 1), config, log)
  # Any process that ran the warm start writes it: with a shared workdir only the
  # primary gets here (the others find its copy), with per-host disks each host keeps
  # its own (identical, the fine-tuning is deterministic) copy.
  tmp = _fresh_tmp(sft_dir)
  copy_folder(init_dir, tmp)
  try:
    save_pretrained(model, cfg, tmp)
    (tmp / SFT_MARKER).write_text(json.dumps({
        "steps": sft.steps, "guess_stage_steps": sft.guess_stage_steps,
        "first_loss": losses[0], "final_loss": losses[-1],
        "seconds": time.perf_counter() - start}))
  except OSError as err:
    # A full disk (ENOSPC) or a lost mount: nothing half-written is left to be mistaken
    # for a policy, and the error names the folder (the CLI prints it as one line).
    shutil.rmtree(tmp, ignore_errors=True)
    raise OSError(err.errno, f"supervised warm start: saving the fine-tuned policy to {tmp} "
                  f"failed ({err.strerror or err}); the partial folder was removed. Free "
                  f"space in {sft_dir.parent} (or fix the path) and rerun: the warm start "
                  "runs again") from err
  shutil.rmtree(sft_dir, ignore_errors=True)
  rename_into_place(tmp, sft_dir, SFT_MARKER)
