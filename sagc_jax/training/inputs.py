"""What training and evaluation both build from a run's config: mesh, data, policy, rewards.

A training run needs much more (rollout sampler, learner, controller, checkpoints,
metrics: ``sagc_jax.training.loop``), but ``python -m sagc_jax.eval`` needs only this plus
its evaluation samplers (``sagc_jax.training.evaluation``), so it builds no learner, no
optimizer state and no controller, and writes nothing into the run.

Order matters for the user's time: prompt lengths are checked against the prompt
buckets with the starting folder's tokenizer *before* the supervised warm start, so a
too-small bucket fails in seconds instead of after minutes of SFT.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.config import RunConfig
from sagc_jax.config.sections import FILE_DATASETS
from sagc_jax.data import builder_options, example_location, load_split
from sagc_jax.models import encode_prompts, from_pretrained, load_tokenizer
from sagc_jax.models.gguf_import import cached_import, is_gguf_source
from sagc_jax.models.tokenizer import max_token_chars
from sagc_jax.models.transformer import Transformer
from sagc_jax.rewards.mix import RewardMix, reward_mix_from_config
from sagc_jax.runtime import distributed
from sagc_jax.runtime.mesh import make_mesh
from sagc_jax.runtime import stop
from sagc_jax.runtime.compilation import PROGRESS_EVERY_S
from sagc_jax.runtime.persistent_cache import set_cache_dir
from sagc_jax.runtime.storage import stage
from sagc_jax.training.warm_start import prepare_policy, starting_folder

__all__ = ["RunInputs", "build_run_inputs", "check_prompt_lengths", "configure_compilation_cache",
           "load_checkpoint_weights"]


@dataclasses.dataclass
class RunInputs:
  """The policy and its data: everything a run's config names before RL starts."""
  config: RunConfig
  mesh: Mesh
  train_source: Any                # random-access sources (``sagc_jax.data.load_split``)
  eval_source: Any
  model: Transformer               # the starting policy, on the mesh
  model_cfg: Any
  tokenizer: Any
  reward_fn: RewardMix            # the training reward; .verify = the task's verifier
  pad_id: int
  stop_ids: tuple[int, ...]

  def encode(self, examples: Sequence[dict]) -> list[list[int]]:
    """Prompt token ids of dataset examples (the chat template when the config asks)."""
    return encode_prompts(self.tokenizer, [ex["prompt"] for ex in examples],
                          use_chat_template=self.config.data.use_chat_template or None)

  def decode(self, samples) -> list[str]:
    """Response texts of every real row of a ``SampleBatch``."""
    return [self.detokenize(samples.response_tokens[r, :samples.lengths[r]])
            for r in range(samples.num_rows)]

  def detokenize(self, tokens) -> str:
    """One response's text from its token ids (special tokens, the stop token, dropped)."""
    return self.tokenizer.decode(tokens, skip_special_tokens=True)

  def close(self) -> None:
    self.reward_fn.close()


def configure_compilation_cache(config: RunConfig, default: Any) -> None:
  """Points JAX's persistent compilation cache at ``train.compilation_cache_dir``, else
  ``default`` (a run's ``jax_cache``; a reader of a run: the local cache's).

  Which programs are written is JAX's own setting (``jax_persistent_cache_min_compile_
  time_secs``, 1 s unless the user's ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says
  otherwise). JAX opens the folder at a process's first compilation after one is set
  and keeps it for the process: a later run in the same process uses that folder. An
  entry that cannot be written is removed (``runtime.persistent_cache``).
  """
  if not config.train.compilation_cache:
    return
  set_cache_dir(config.train.compilation_cache_dir or str(default))


def check_prompt_lengths(config: RunConfig, tokenizer: Any,
                         sources: Sequence[tuple[str, Any]], limit: int = 200_000,
                         locate: Callable[[str, int], str | None] = lambda split, i: None,
                         log: Callable[[str], None] = print) -> None:
  """Fails at start-up (not mid-run) if a prompt exceeds the largest prompt bucket.

  A character bound comes first (``models.tokenizer.max_token_chars``): a prompt too
  long to fit whatever its tokens is refused without being tokenized (tokenizing one
  huge record can take minutes and gigabytes). ``sources`` are ``(split, source)`` pairs;
  ``locate(split, example id)`` names a record's file and line (file datasets). On a
  large dataset the check takes minutes: a progress line every 10 s."""
  largest = max(config.rollout.prompt_buckets)
  template = config.data.use_chat_template or None
  char_bound = largest * max_token_chars(tokenizer)
  field = config.data.prompt_field if config.data.name in FILE_DATASETS else "prompt"
  buckets = f"rollout.prompt_buckets={tuple(config.rollout.prompt_buckets)}"

  def where(split: str, example: dict, index: int) -> str:
    location = locate(split, int(example["id"])) if "id" in example else None
    return f"{location or f'{split} example {index}'} (field {field!r})"
  start = last_line = time.perf_counter()
  for split, source in sources:
    n = min(len(source), limit)
    for lo in range(0, n, 4096):
      examples = [source[i] for i in range(lo, min(lo + 4096, n))]
      prompts = [ex["prompt"] for ex in examples]
      i = next((i for i, p in enumerate(prompts) if len(p) > char_bound), None)
      if i is not None:
        raise ValueError(
            f"{buckets}: {where(split, examples[i], lo + i)} has {len(prompts[i]):,} "
            f"characters, more than any {largest}-token prompt can hold (at most "
            f"{char_bound:,} characters with this tokenizer); shorten or remove that record")
      lengths = [len(ids) for ids in encode_prompts(tokenizer, prompts,
                                                    use_chat_template=template)]
      if max(lengths) > largest:
        i = int(np.argmax(lengths))
        raise ValueError(
            f"{buckets}: {where(split, examples[i], lo + i)} has a {max(lengths)}-token "
            f"prompt; the largest bucket must hold every prompt (add a bucket >= "
            f"{max(lengths)})")
      if time.perf_counter() - last_line >= PROGRESS_EVERY_S:
        last_line = time.perf_counter()
        log(f"checking prompt lengths: {lo + len(examples):,} of {n:,} {split} prompts "
            f"({last_line - start:.0f} s)")


def policy_source(config: RunConfig, cache_root: Path,
                  log: Callable[[str], None] = print, *, convert: bool = True) -> str:
  """The local HF folder ``model.path`` names ('' for the built-in tiny model).

  A gs:// folder is staged into ``cache_root``; a ``.gguf`` file or a built-in GGUF
  source (``smollm2-135m-instruct``) is converted once into ``cache_root/gguf``
  (``models.gguf_import.cached_import``). With ``convert=False`` a GGUF source is
  left as it is (a non-primary process waits for the primary's conversion).
  """
  path = stage(config.model.path, cache_root, log, what="model.path")
  if path and is_gguf_source(path) and convert:
    return str(cached_import(path, cache_root, log=log))
  return path


def build_run_inputs(config: RunConfig, local_dir: Path, cache_root: Path,
                     log: Callable[[str], None]) -> RunInputs:
  """Mesh, data splits, starting policy (building the tiny model and its warm start
  when the config asks and they are not cached in ``local_dir``), tokenizer, rewards.

  ``config`` must be validated. The primary process prepares data and the warm start;
  the others then read them.
  """
  is_primary = jax.process_index() == 0
  mesh = make_mesh(config.mesh.shape, config.mesh.axes)
  data_dir = config.data.data_dir or str(local_dir / "tfds")
  manual_dir = stage(config.data.manual_dir, cache_root, log, what="data.manual_dir") or None
  model_path = policy_source(config, cache_root, log, convert=is_primary)
  load = lambda split: load_split(config.data.name, split, data_dir, manual_dir,
                                  **builder_options(config.data))
  if is_primary:
    with stop.stoppable("data preparation"):      # TFDS renames a finished split in
      load("train")                               # place: a stopped one is redone
      load(config.data.eval_split)
  distributed.barrier("sagc_data_prepared")
  train_source = load("train")
  eval_source = load(config.data.eval_split)

  # The starting folder's tokenizer is the policy's: check every prompt fits first.
  folder = None
  if is_primary:
    start = starting_folder(config, local_dir, model_path=model_path)
    locate = lambda split, i: example_location(config.data.name, split, i, data_dir,
                                               manual_dir, **builder_options(config.data))
    check_prompt_lengths(config, load_tokenizer(start),
                         (("train", train_source), (config.data.eval_split, eval_source)),
                         locate=locate, log=log)
    with stop.stoppable("the supervised warm start"):   # saved to a temporary folder
      folder = prepare_policy(config, local_dir, train_source, log, model_path=model_path,
                              cache=cache_root)
  distributed.barrier("sagc_policy_prepared")
  if folder is None:
    model_path = policy_source(config, cache_root, log)
    folder = prepare_policy(config, local_dir, train_source, log, model_path=model_path,
                            cache=cache_root)
  dtype = jnp.bfloat16 if config.model.dtype == "bfloat16" else jnp.float32
  model, model_cfg = from_pretrained(folder, dtype=dtype, mesh=mesh)
  tokenizer = load_tokenizer(folder)
  stop_ids = set(model_cfg.eos_token_ids)
  if tokenizer.eos_token_id is not None:
    stop_ids.add(int(tokenizer.eos_token_id))
  pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
  # Each process scores its own share: its reward warnings must show on every process.
  reward_fn = reward_mix_from_config(config.reward, distributed.on_every_process(log))
  return RunInputs(config=config, mesh=mesh, train_source=train_source,
                   eval_source=eval_source, model=model, model_cfg=model_cfg,
                   tokenizer=tokenizer, reward_fn=reward_fn, pad_id=pad_id,
                   stop_ids=tuple(sorted(int(i) for i in stop_ids)))


def load_checkpoint_weights(model: Transformer, directory: str | os.PathLike,
                            step: int | None = None, log: Callable[[str], None] = print) -> int:
  """Writes the (float32 master) weights of checkpoint ``step`` into ``model``, in its
  own dtype and layout; returns the step.

  Read-only: nothing in ``directory`` is moved. Without ``step``, the newest
  checkpoint whose weights read back finite is used; older ones are tried when a newer
  one is damaged (each failure is logged). A given ``step`` must restore or it raises.
  """
  from sagc_jax.runtime.checkpoint import Checkpointer

  _, params, _ = nnx.split(model, nnx.Param, ...)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32,
                                                         sharding=x.sharding), params)
  checkpointer = Checkpointer(directory, read_only=True, log=log)
  try:
    found, restored = checkpointer.restore_params(abstract, step)
  finally:
    checkpointer.close()
  dtype = jax.tree.leaves(params)[0].dtype
  nnx.update(model, jax.tree.map(lambda x: x.astype(dtype), restored))
  return found
