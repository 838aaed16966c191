"""The typed training config: one frozen section per concern, each checked when built.

Users write and override an ml_collections ``ConfigDict`` (``configs/*.py``,
``--config.KEY=VALUE``, a run's ``config.json``); the command-line tools turn it,
once, into a ``RunConfig`` (``config.run_config``), and everything below them reads
these frozen sections: attribute access, no ``.get(key, default)``, no second copy
of a default. The pattern is Tunix's ``GRPOConfig`` / ``DAPOConfig``: dataclasses
that validate in ``__post_init__``.

Every error names the dotted key, the value and what is allowed. A section checks
its own keys; the rules that relate two sections are ``config.run.check_run``.
The field defaults here are the schema's defaults (``config.schema.base_config``
is built from them). Imports no JAX: the few checks that need a JAX-side module
(sampling settings, GGUF sources) import it when they run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any, Mapping

from sagc_jax.control import budget
from sagc_jax.config.section import Section
from sagc_jax.config.controller import ControllerSection
from sagc_jax.base import checks

__all__ = ["DATASETS", "DTYPES", "FILE_DATASETS", "PAGED_KERNEL_CHOICES", "REWARDS",
           "ControllerSection", "DataSection", "MeshSection", "ModelSection", "RewardSection",
           "RolloutSection", "SftSection", "TrainSection", "SECTIONS"]

DATASETS = ("synthetic", "word_problems", "gsm8k_local", "math_local", "jsonl", "parquet")
FILE_DATASETS = ("jsonl", "parquet")   # user prompt/answer files (sagc_jax.data.prompt_files)
REWARDS = ("exact_match", "math_verify")
DTYPES = ("float32", "bfloat16")
PAGED_KERNEL_CHOICES = ("xla", "pallas")   # rollout.paged_kernel (models.paged_cache)


@dataclasses.dataclass(frozen=True)
class ModelSection(Section):
  """The policy: an HF checkpoint folder (local, gs:// or a GGUF source), or '' for
  the built-in tiny model (random init, then the supervised warm start).
  ``config_json``: an HF config.json that sizes the model for ``sagc_jax.aot`` when
  ``path`` is not on this host."""

  NAME = "model"
  path: str = ""
  dtype: str = "float32"
  tiny_family: str = "llama"
  init_seed: int = 0
  init_std: float = 0.02
  require_path: bool = False
  config_json: str = ""

  def __post_init__(self):
    checks.one_of(self._root(), "model.dtype", DTYPES)
    if self.require_path and not self.path:
      raise ValueError("model.path is empty: this preset needs an HF checkpoint folder, local "
                       "or gs:// (--config.model.path=/path/to/checkpoint)")
    checks.one_of(self._root(), "model.tiny_family", ("llama", "qwen2", "qwen3"))
    if isinstance(self.path, str) and self.path:
      from sagc_jax.models.gguf_import import is_gguf_source, resolve_source
      if is_gguf_source(self.path):
        with self._errors_as(f"model.path={self.path!r}: "):
          resolve_source(self.path)
    checks.number_in(self._root(), "model.init_std", 0.0, low_open=True)
    self._string("path")


@dataclasses.dataclass(frozen=True)
class MeshSection(Section):
  """Device mesh: a size per named axis, -1 = all remaining devices."""

  NAME = "mesh"
  shape: tuple = (-1, 1)
  axes: tuple = ("data", "model")

  def __post_init__(self):
    shape, axes = self._tuple("shape"), self._tuple("axes")
    if len(shape) != len(axes) or any(not isinstance(s, int) or (s < 1 and s != -1)
                                      for s in shape) or shape.count(-1) > 1:
      raise ValueError(f"mesh.shape={shape!r} must give one positive size (or a single -1) "
                       f"per axis of mesh.axes={axes!r}")
    if "data" not in axes:
      raise ValueError(f"mesh.axes={axes!r} must include 'data' (rollout rows are sharded on it)")

  def data_ways(self, device_count: int) -> int:
    """Size of the 'data' axis on ``device_count`` devices."""
    data = self.shape[self.axes.index("data")]
    return device_count // math.prod(s for s in self.shape if s != -1) if data == -1 else data


_SYNTHETIC_DEFAULTS = dict(max_operand=9, min_ops=1, max_ops=3, allow_mul=False,
                           recheck_prob=0.35, max_rechecks=6, modulus=0, guess_prob=0.0,
                           num_train=20000, num_test=500, seed=0)


@dataclasses.dataclass(frozen=True)
class DataSection(Section):
  """The task. ``name='jsonl'`` / ``'parquet'``: your own prompt/answer records;
  ``files`` / ``eval_files`` are glob patterns of the train / 'test' split's files,
  relative to ``manual_dir`` if set (else to the directory the run starts in, then
  recorded as ``manual_dir``); without ``eval_files``, ``eval_split`` must be part of
  train ('train[:200]'). ``prompt_template``: '' = the prompt as is, else every
  '{prompt}' in it is replaced by the prompt. ``train_prompts``: RL draws only the train
  split's first N prompts (0 = all), so each recurs within a short run while the
  supervised warm start still learns from the whole split (on a split of N it memorises
  them). ``synthetic``: the built-in task's settings
  (``sagc_jax.data.synthetic.SyntheticConfig``)."""

  NAME = "data"
  name: str = "synthetic"
  data_dir: str = ""
  manual_dir: str = ""
  eval_split: str = "test"
  eval_examples: int = 200
  train_prompts: int = 0
  use_chat_template: bool = False
  files: tuple = ()
  eval_files: tuple = ()
  prompt_field: str = "prompt"
  answer_field: str = "answer"
  prompt_template: str = ""
  synthetic: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: dict(_SYNTHETIC_DEFAULTS))

  def __post_init__(self):
    self._tuple("files")
    self._tuple("eval_files")
    checks.one_of(self._root(), "data.name", DATASETS)
    checks.positive_int(self._root(), "data.eval_examples")
    checks.non_negative_int(self._root(), "data.train_prompts")
    if self.name in ("gsm8k_local", "math_local") and not self.manual_dir:
      raise ValueError(f"data.manual_dir is empty: data.name={self.name!r} reads your "
                       "local GSM8K/MATH files from it")
    if self.name in FILE_DATASETS:
      from sagc_jax.data.prompt_files import FilesSpec
      with self._errors_as("data."):
        FilesSpec(format=self.name, **self.file_options())
      if not self.eval_files and not self.eval_split.startswith("train"):
        raise ValueError(f"data.eval_split={self.eval_split!r}: data.eval_files is "
                         "empty, so the dataset has only a train split; set data.eval_files "
                         "or evaluate on part of train (data.eval_split='train[:200]')")
    else:
      defaults = DataSection.__dataclass_fields__
      ignored = [k for k in ("files", "eval_files", "prompt_field", "answer_field",
                             "prompt_template") if getattr(self, k) != defaults[k].default]
      if ignored:
        raise ValueError(f"data.{', data.'.join(ignored)} set but data.name="
                         f"{self.name!r} does not read them (they are for "
                         f"{FILE_DATASETS})")
    self._set("synthetic", dict(self.synthetic))
    if self.name == "synthetic":
      from sagc_jax.data.synthetic import SyntheticConfig
      with self._errors_as("data.synthetic: ", (TypeError, ValueError)):
        SyntheticConfig(**self.synthetic)
      num_train = self.synthetic.get("num_train", _SYNTHETIC_DEFAULTS["num_train"])
      if self.train_prompts > num_train:
        raise ValueError(f"data.train_prompts={self.train_prompts} is more than the train "
                         f"split's data.synthetic.num_train={num_train} prompts")
    self._string("manual_dir")
    self._string("data_dir")
    self._local_folder("data_dir", "TFDS builds and the staging cache need a real filesystem")

  def file_options(self) -> dict[str, Any]:
    """The ``FilesSpec`` options of a ``jsonl`` / ``parquet`` dataset."""
    return dict(files=self.files, eval_files=self.eval_files, prompt_field=self.prompt_field,
                answer_field=self.answer_field, prompt_template=self.prompt_template)


@dataclasses.dataclass(frozen=True)
class RewardSection(Section):
  """``name``: the task's verifier (accuracy); ``fns`` / ``weights``: the training
  reward's terms (empty: the verifier's score), see ``sagc_jax.rewards.mix``."""

  NAME = "reward"
  name: str = "exact_match"
  format_weight: float = 0.0
  workers: int = 0
  fns: tuple = ()
  weights: tuple = ()
  timeout_s: float = 10.0

  def __post_init__(self):
    self._tuple("fns")
    self._tuple("weights")
    checks.one_of(self._root(), "reward.name", REWARDS)
    checks.number_in(self._root(), "reward.format_weight", 0.0)
    checks.non_negative_int(self._root(), "reward.workers")
    from sagc_jax.rewards.specs import check_reward_config
    check_reward_config(self)


@dataclasses.dataclass(frozen=True)
class RolloutSection(Section):
  """Sampling: the step budget (``mode``, docs/configs.md), decoding settings, shape
  buckets and the sampler's decoding path.

  ``max_rows_per_call``: larger rollout / eval batches are split into sequential
  sampler calls of at most this many rows (whole groups; 0 = never), which bounds
  one call's KV cache. ``decode_segment``: tokens per segment of the segmented
  sampler (-1 = auto, about 8 span buckets; 0 = the fused sampler), with compaction
  of the running rows down to ``min_compact_rows``. Refill decoding (rollouts only):
  ``refill_slots`` decode slots over a paged KV cache (0 = off) of ``page_size``-token
  pages, ``kv_pages`` per layer pool (0 = every slot can hold a longest row),
  ``refill_segment`` decode steps between refills (0 = auto), ``paged_kernel`` "xla"
  (every backend) or "pallas" (the TPU kernel). ``overlap_rewards``: score rows that
  finished while the rest still decode. ``segmented_eval``: evaluation samplers
  segmented too (off: the fused sampler's one program per shape compiles faster).
  """

  NAME = "rollout"
  mode: str = "hold_prompts"
  prompts_per_step: int = 8
  rollouts_per_step: int = 64
  max_new_tokens: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  prompt_buckets: tuple = (32,)
  response_buckets: tuple = (64,)
  eval_batch: int = 64
  max_rows_per_call: int = 0
  decode_segment: int = -1
  compaction: bool = True
  min_compact_rows: int = 8
  refill_slots: int = 0
  page_size: int = 16
  kv_pages: int = 0
  refill_segment: int = 0
  paged_kernel: str = "xla"
  overlap_rewards: bool = True
  segmented_eval: bool = False

  def __post_init__(self):
    checks.one_of(self._root(), "rollout.mode", budget.ROLLOUT_MODES)
    from sagc_jax.sampling.params import SamplingParams
    with self._errors_as("rollout."):
      SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                     top_p=self.top_p, top_k=self.top_k, stop_ids=(0,))
    self._positive_ints("prompt_buckets")
    responses = self._positive_ints("response_buckets")
    if max(responses) != self.max_new_tokens:
      raise ValueError(f"rollout.response_buckets={responses}: the largest bucket must equal "
                       f"rollout.max_new_tokens={self.max_new_tokens} (every response must "
                       "fit, and no bucket can be wider than the sampler's output)")
    checks.positive_int(self._root(), "rollout.eval_batch")
    self._int_at_least("max_rows_per_call", 0, "0 = no limit")
    self._int_at_least("decode_segment", -1, "-1 = auto, 0 = fused sampler")
    for field in ("compaction", "segmented_eval", "overlap_rewards"):
      self._bool(field)
    checks.positive_int(self._root(), "rollout.min_compact_rows")
    for field in ("refill_slots", "kv_pages", "refill_segment"):
      checks.non_negative_int(self._root(), f"rollout.{field}")
    checks.positive_int(self._root(), "rollout.page_size")
    checks.one_of(self._root(), "rollout.paged_kernel", PAGED_KERNEL_CHOICES)

  def _positive_ints(self, field: str) -> tuple[int, ...]:
    value = getattr(self, field)
    try:
      items = tuple(value)
    except TypeError:
      raise ValueError(f"{self._key(field)}={value!r} must be a tuple of positive ints") from None
    if not items or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in items):
      raise ValueError(f"{self._key(field)}={value!r} must be a non-empty tuple of positive ints")
    self._set(field, items)
    return items

  def prompts_for(self, g: int) -> int:
    """P(G): prompts per sampling round at group size ``g`` (``control.budget``)."""
    return budget.prompts_for(self, g)


@dataclasses.dataclass(frozen=True)
class SftSection(Section):
  """Supervised warm start on the task's reference solutions (built-in task only),
  cached in the workdir so a resumed run does not repeat it. ``guess_stage_steps``:
  an optional second stage on the same examples with ``guess_stage_prob`` of the
  solutions reduced to their answer line (0 = no second stage)."""

  NAME = "sft"
  enabled: bool = True
  steps: int = 300
  batch_size: int = 64
  lr: float = 3e-3
  warmup_steps: int = 20
  seq_bucket: int = 96
  guess_stage_steps: int = 0
  guess_stage_prob: float = 0.9

  def __post_init__(self):
    steps = checks.positive_int(self._root(), "sft.steps")
    warmup = self.warmup_steps
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < steps:
      raise ValueError(f"sft.warmup_steps={warmup!r} must be an int in [0, sft.steps={steps})")
    checks.positive_int(self._root(), "sft.batch_size")
    checks.number_in(self._root(), "sft.lr", 0.0, low_open=True)
    checks.positive_int(self._root(), "sft.seq_bucket")
    checks.non_negative_int(self._root(), "sft.guess_stage_steps")
    checks.number_in(self._root(), "sft.guess_stage_prob", 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class TrainSection(Section):
  """The run: steps, checkpoints, evaluation, logging and storage.

  ``eval_k`` > 1: every evaluation also draws that many samples per example
  (pass@j, mean@k); ``eval_greedy`` False skips the greedy pass. Every
  ``log_completions_every`` steps (0 = never) ``log_completions`` sampled
  completions go to completions.jsonl and TensorBoard. ``wandb_project``: '' = no
  Weights & Biases. ``export_every`` (0 = never): the policy as an HF folder under
  ``export_dir`` (default workdir/exports). ``initial_eval_dir``: a local folder
  that keeps the evaluation before RL under a key of the weights, settings, devices
  and code ('' = always evaluate). ``max_consecutive_skipped``: stop once this many
  learner updates in a row were non-finite (0 = never). ``checkpoint_dir``: '' =
  workdir/checkpoints, a gs:// path on pods. ``local_cache_dir``: local disk for
  gs:// inputs ('' = $SAGC_CACHE_DIR or ~/.cache/sagc_jax). ``metrics_sync_secs``:
  how often a gs:// metrics.jsonl is rewritten. ``stop_grace_s``: after SIGTERM /
  Ctrl-C the process ends this many seconds later (0 = no deadline;
  docs/reliability.md).

  ``time_budget_s`` (0 = none): the run ends at the first step boundary after its
  cumulative step time (``time_total_s`` summed: warm-up and evaluations excluded)
  reaches the budget, and checkpoints, evaluates and summarises there as at its last
  step; ``steps`` is then a cap. A time-boxed reservation, and the equal-time arms of a
  comparison (docs/results.md, "the best model per hour"). ``eval_points`` (needs a
  budget; 0 = none): also evaluate at the first step boundary after each of that many
  evenly spaced points of the budget, so that every arm is measured along one time
  axis."""

  NAME = "train"
  steps: int = 100
  checkpoint_every: int = 25
  keep_checkpoints: int = 3
  eval_every: int = 50
  log_every: int = 1
  eval_k: int = 0
  eval_greedy: bool = True
  log_completions_every: int = 10
  log_completions: int = 4
  wandb_project: str = ""
  export_every: int = 0
  export_dir: str = ""
  compilation_cache: bool = True
  compilation_cache_dir: str = ""
  initial_eval_dir: str = ""
  max_consecutive_skipped: int = 5
  checkpoint_dir: str = ""
  local_cache_dir: str = ""
  metrics_sync_secs: float = 30.0
  stop_grace_s: float = 25.0
  time_budget_s: float = 0.0
  eval_points: int = 0

  def __post_init__(self):
    root = self._root()
    self._bool("eval_greedy")
    checks.number_in(root, "train.time_budget_s", 0.0)
    self._int_at_least("eval_points", 0, "0 = only train.eval_every")
    if self.eval_points and not self.time_budget_s:
      raise ValueError(f"train.eval_points={self.eval_points} needs train.time_budget_s > 0 "
                       "(the points divide the budget)")
    for key in ("steps", "checkpoint_every", "keep_checkpoints", "eval_every", "log_every"):
      checks.positive_int(root, f"train.{key}")
    checks.number_in(root, "train.metrics_sync_secs", 0.0)
    checks.number_in(root, "train.stop_grace_s", 0.0)
    for key in ("eval_k", "log_completions_every", "log_completions", "export_every"):
      checks.non_negative_int(root, f"train.{key}")
    project = self._string("wandb_project", "'' = off")
    if project and importlib.util.find_spec("wandb") is None:
      raise ValueError(f"train.wandb_project={project!r} needs the wandb package, which is "
                       "not installed: pip install wandb (or set train.wandb_project='')")
    if self.eval_k == 1:
      raise ValueError("train.eval_k=1 must be 0 (off) or >= 2 (pass@k needs k samples; one "
                       "sample per example is eval_sampled_accuracy already)")
    self._int_at_least("max_consecutive_skipped", 0, "0 = never stop")
    for field in ("local_cache_dir", "export_dir", "initial_eval_dir"):
      self._string(field)
    self._local_folder("local_cache_dir",
                       "TFDS builds and the staging cache need a real filesystem")
    self._local_folder("initial_eval_dir", "it is read by the runs of one machine; '' = off")


# The typed sections in the order they are built and checked; ``learner`` (a
# ``LearnerConfig``, resolved from its preset) and ``seed`` complete a ``RunConfig``.
SECTIONS = (ModelSection, MeshSection, DataSection, RewardSection, ControllerSection,
            RolloutSection, TrainSection, SftSection)
