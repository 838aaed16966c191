"""Start-up validation of a training config, and its ``LearnerConfig``.

``validate`` runs before any work and raises ``ValueError`` naming the dotted key,
the bad value and what is allowed. ``learner_config`` resolves the algorithm
preset: objective keys left at ``None`` take ``ALGORITHM_PRESETS[learner.algorithm]``,
explicit ones win. Imports no JAX.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from sagc_jax.config import checks
from sagc_jax.config.schema import (DATASETS, DTYPES, FILE_DATASETS, PAGED_KERNEL_CHOICES,
                                    REWARDS, base_config)
from sagc_jax.control.budget import ROLLOUT_MODES, candidate_group_sizes, prompts_per_round
from sagc_jax.control.controller import controller_from_config
from sagc_jax.models.gguf_import import is_gguf_source, resolve_source
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.runtime.storage import is_remote
from sagc_jax.sampling.params import SamplingParams


def _tuple_of_positive_ints(config: Any, key: str) -> tuple[int, ...]:
  value = checks.lookup(config, key)
  try:
    items = tuple(value)
  except TypeError:
    raise ValueError(f"{key}={value!r} must be a tuple of positive ints") from None
  if not items or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in items):
    raise ValueError(f"{key}={value!r} must be a non-empty tuple of positive ints")
  return items


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks every section; the first problem raises ``ValueError`` naming its key."""
  checks.one_of(config, "model.dtype", DTYPES)
  if config.model.require_path and not config.model.path:
    raise ValueError("model.path is empty: this preset needs an HF checkpoint folder, local or gs:// "
                     "(--config.model.path=/path/to/checkpoint)")
  checks.one_of(config, "model.tiny_family", ("llama", "qwen2", "qwen3"))
  if isinstance(config.model.path, str) and is_gguf_source(config.model.path):
    try:
      resolve_source(config.model.path)
    except ValueError as err:
      raise ValueError(f"model.path={config.model.path!r}: {err}") from None
  checks.number_in(config, "model.init_std", 0.0, low_open=True)
  shape = tuple(checks.lookup(config, "mesh.shape"))
  axes = tuple(checks.lookup(config, "mesh.axes"))
  if len(shape) != len(axes) or any(not isinstance(s, int) or (s < 1 and s != -1)
                                    for s in shape) or shape.count(-1) > 1:
    raise ValueError(f"mesh.shape={shape!r} must give one positive size (or a single -1) "
                     f"per axis of mesh.axes={axes!r}")
  if "data" not in axes:
    raise ValueError(f"mesh.axes={axes!r} must include 'data' (rollout rows are sharded on it)")

  checks.one_of(config, "data.name", DATASETS)
  checks.positive_int(config, "data.eval_examples")
  if config.data.name in ("gsm8k_local", "math_local") and not config.data.manual_dir:
    raise ValueError(f"data.manual_dir is empty: data.name={config.data.name!r} reads your "
                     "local GSM8K/MATH files from it")
  if config.data.name in FILE_DATASETS:
    from sagc_jax.data import FilesSpec, builder_options
    try:
      FilesSpec(format=config.data.name, **builder_options(config.data))
    except ValueError as err:
      raise ValueError(f"data.{err}") from None
    if not config.data.eval_files and not config.data.eval_split.startswith("train"):
      raise ValueError(f"data.eval_split={config.data.eval_split!r}: data.eval_files is "
                       "empty, so the dataset has only a train split; set data.eval_files "
                       "or evaluate on part of train (data.eval_split='train[:200]')")
  else:
    defaults = base_config().data
    ignored = [k for k in ("files", "eval_files", "prompt_field", "answer_field",
                           "prompt_template") if config.data[k] != defaults[k]]
    if ignored:
      raise ValueError(f"data.{', data.'.join(ignored)} set but data.name="
                       f"{config.data.name!r} does not read them (they are for "
                       f"{FILE_DATASETS})")
  if config.data.name == "synthetic":
    from sagc_jax.data.synthetic import SyntheticConfig
    try:
      SyntheticConfig(**config.data.synthetic.to_dict())
    except (TypeError, ValueError) as err:
      raise ValueError(f"data.synthetic: {err}") from None
  checks.one_of(config, "reward.name", REWARDS)
  checks.number_in(config, "reward.format_weight", 0.0)
  checks.non_negative_int(config, "reward.workers")
  from sagc_jax.rewards.mix import check_reward_config
  check_reward_config(config.reward)

  controller_from_config(config)          # raises "controller: ..." on bad settings
  if config.controller.kind == "per_prompt":
    # Groups of different sizes go through one fused or segmented sampler call.
    if checks.lookup(config, "rollout.refill_slots"):
      raise ValueError(f"controller.kind='per_prompt' needs rollout.refill_slots=0 (got "
                       f"{config.rollout.refill_slots}): the refill sampler takes one group "
                       "size per call")
    limit = checks.lookup(config, "rollout.max_rows_per_call")
    largest = max(prompts_per_round(config.rollout, g) * g
                  for g in candidate_group_sizes(config.controller))
    if 0 < limit < largest:
      raise ValueError(f"controller.kind='per_prompt' needs rollout.max_rows_per_call=0 or "
                       f">= {largest} (got {limit}): groups of different sizes are not "
                       "split over sub-calls")

  mode = checks.one_of(config, "rollout.mode", ROLLOUT_MODES)
  candidates = candidate_group_sizes(config.controller)
  checks.group_budget(config, "rollout", mode, candidates)
  r = config.rollout
  try:
    max_new = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                             top_p=r.top_p, top_k=r.top_k, stop_ids=(0,)).max_new_tokens
  except ValueError as err:
    raise ValueError(f"rollout.{err}") from None
  _tuple_of_positive_ints(config, "rollout.prompt_buckets")
  responses = _tuple_of_positive_ints(config, "rollout.response_buckets")
  if max(responses) != max_new:
    raise ValueError(f"rollout.response_buckets={responses}: the largest bucket must equal "
                     f"rollout.max_new_tokens={max_new} (every response must fit, and no "
                     "bucket can be wider than the sampler's output)")
  checks.positive_int(config, "rollout.eval_batch")
  limit = checks.lookup(config, "rollout.max_rows_per_call")
  if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
    raise ValueError(f"rollout.max_rows_per_call={limit!r} must be an int >= 0 (0 = no limit)")
  if limit and limit < max(candidates):
    raise ValueError(f"rollout.max_rows_per_call={limit} is smaller than the largest group "
                     f"size {max(candidates)}: a group must fit in one sampler call")

  segment = checks.lookup(config, "rollout.decode_segment")
  if isinstance(segment, bool) or not isinstance(segment, int) or segment < -1:
    raise ValueError(f"rollout.decode_segment={segment!r} must be an int >= -1 "
                     "(-1 = auto, 0 = fused sampler)")
  for key in ("rollout.compaction", "rollout.segmented_eval", "rollout.overlap_rewards",
              "train.eval_greedy"):
    if not isinstance(checks.lookup(config, key), bool):
      raise ValueError(f"{key}={checks.lookup(config, key)!r} must be True or False")
  checks.positive_int(config, "rollout.min_compact_rows")
  for key in ("refill_slots", "kv_pages", "refill_segment"):
    checks.non_negative_int(config, f"rollout.{key}")
  checks.positive_int(config, "rollout.page_size")
  kernel = config.rollout.get("paged_kernel", "xla")
  if kernel not in PAGED_KERNEL_CHOICES:
    raise ValueError(f"rollout.paged_kernel={kernel!r} is not one of {PAGED_KERNEL_CHOICES}")
  slots = config.rollout.refill_slots
  if slots and "data" in tuple(config.mesh.axes):
    sizes = [s for s in config.mesh.shape if s != -1]
    known = int(np.prod(sizes)) if sizes else 1
    shape = [jax.device_count() // known if s == -1 else s for s in config.mesh.shape]
    data = shape[tuple(config.mesh.axes).index("data")]
    if data and slots % data:
      raise ValueError(f"rollout.refill_slots={slots} must be a multiple of the mesh's "
                       f"'data' axis ({data}, mesh.shape={tuple(config.mesh.shape)}): each "
                       "data shard decodes its own slots")
  for key in ("steps", "checkpoint_every", "keep_checkpoints", "eval_every", "log_every"):
    checks.positive_int(config, f"train.{key}")
  checks.number_in(config, "train.metrics_sync_secs", 0.0)
  checks.number_in(config, "train.stop_grace_s", 0.0)
  checks.non_negative_int(config, "train.eval_k")
  checks.non_negative_int(config, "train.log_completions_every")
  checks.non_negative_int(config, "train.log_completions")
  checks.non_negative_int(config, "train.export_every")
  project = checks.lookup(config, "train.wandb_project")
  if not isinstance(project, str):
    raise ValueError(f"train.wandb_project={project!r} must be a string ('' = off)")
  if project:
    import importlib.util
    if importlib.util.find_spec("wandb") is None:
      raise ValueError(f"train.wandb_project={project!r} needs the wandb package, which is "
                       "not installed: pip install wandb (or set train.wandb_project='')")
  eval_k = config.train.eval_k
  if eval_k == 1:
    raise ValueError("train.eval_k=1 must be 0 (off) or >= 2 (pass@k needs k samples; one "
                     "sample per example is eval_sampled_accuracy already)")
  if eval_k > checks.lookup(config, "rollout.eval_batch"):
    raise ValueError(f"train.eval_k={eval_k} must be <= rollout.eval_batch="
                     f"{config.rollout.eval_batch} (the k samples of an example are one "
                     "evaluation group)")
  if 0 < checks.lookup(config, "rollout.max_rows_per_call") < eval_k:
    raise ValueError(f"train.eval_k={eval_k} must be <= rollout.max_rows_per_call="
                     f"{config.rollout.max_rows_per_call} (a group is never split over "
                     "sampler calls)")
  limit = checks.lookup(config, "train.max_consecutive_skipped")
  if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
    raise ValueError(f"train.max_consecutive_skipped={limit!r} must be an int >= 0 "
                     "(0 = never stop)")
  for key in ("model.path", "data.manual_dir", "data.data_dir", "train.local_cache_dir",
              "train.export_dir", "train.initial_eval_dir"):
    value = checks.lookup(config, key)
    if not isinstance(value, str):
      raise ValueError(f"{key}={value!r} must be a string (a folder path; '' for the default)")
  filesystem = "TFDS builds and the staging cache need a real filesystem"
  for key, why in (("data.data_dir", filesystem), ("train.local_cache_dir", filesystem),
                   ("train.initial_eval_dir", "it is read by the runs of one machine; '' = off")):
    if is_remote(checks.lookup(config, key)):
      raise ValueError(f"{key}={checks.lookup(config, key)!r} must be a local folder ({why})")
  learner = learner_config(config)        # raises "learner.<key>=..." on bad settings
  for g in candidates:
    rows = prompts_per_round(config.rollout, g) * g
    learner.check_split(rows, f"the {rows} rollouts of a G={g} step")

  sft_steps = checks.positive_int(config, "sft.steps")
  warmup = checks.lookup(config, "sft.warmup_steps")
  if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < sft_steps:
    raise ValueError(f"sft.warmup_steps={warmup!r} must be an int in [0, sft.steps={sft_steps})")
  checks.positive_int(config, "sft.batch_size")
  checks.number_in(config, "sft.lr", 0.0, low_open=True)
  checks.positive_int(config, "sft.seq_bucket")
  checks.non_negative_int(config, "sft.guess_stage_steps")
  checks.number_in(config, "sft.guess_stage_prob", 0.0, 1.0)


def learner_config(config: ml_collections.ConfigDict) -> LearnerConfig:
  """The ``LearnerConfig`` of a training config.

  ``learner.algorithm`` selects the preset wherever it was set: every objective key
  left at ``None`` takes ``ALGORITHM_PRESETS[algorithm]``'s value, explicit keys win
  (``LearnerConfig.from_dict``). The one config-level rule added here: DAPO's soft
  overlong buffer defaults to a quarter of ``rollout.max_new_tokens``.
  """
  values = config.learner.to_dict()
  if values.get("overlong_buffer") is None and values.get("algorithm") == "dapo":
    values["overlong_buffer"] = max(config.rollout.max_new_tokens // 4, 1)
  values["max_response_len"] = config.rollout.max_new_tokens
  values["temperature"] = config.rollout.temperature or 1.0
  # The schedule counts optimizer updates: mini_batches x epochs per RL step.
  values.setdefault("total_steps", config.train.steps * config.learner.mini_batches
                    * config.learner.epochs)
  return LearnerConfig.from_dict(values)
