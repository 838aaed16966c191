"""The training config schema: defaults (``base_config``) and start-up validation.

Config files in ``configs/`` start from ``base_config()`` and override what
their preset changes; every key can be overridden on the command line
(``--config.learner.lr=1e-6``). ``validate`` runs before any work and raises
``ValueError`` naming the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
from ml_collections import config_dict

from sagc_jax import config_checks as checks
from sagc_jax.controller import controller_from_config
from sagc_jax.rl.learner import ALGORITHM_PRESETS, DERIVED_FIELDS, LearnerConfig
from sagc_jax.sampling.sampler import SamplingParams
from sagc_jax.runtime.storage import is_remote

ROLLOUT_MODES = ("hold_prompts", "hold_rollouts")
DATASETS = ("synthetic", "gsm8k_local", "math_local", "jsonl", "parquet")
FILE_DATASETS = ("jsonl", "parquet")   # user prompt/answer files (sagc_jax.data.prompt_files)
REWARDS = ("exact_match", "math_verify")
DTYPES = ("float32", "bfloat16")


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by every preset (a small GRPO + SAGC run on the built-in task)."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  # Policy: an HF checkpoint folder, or '' for the built-in tiny model (random init,
  # then the supervised warm start below).
  # config_json: an HF config.json (e.g. configs/models/llama3_2_3b.json) that sizes the
  # model for `python -m sagc_jax.aot` when model.path is not on this host.
  c.model = ml_collections.ConfigDict(dict(
      path="", dtype="float32", tiny_family="llama", init_seed=0, init_std=0.02,
      require_path=False, config_json=""))
  # Mesh axes ('data', 'model'); -1 = all remaining devices.
  c.mesh = ml_collections.ConfigDict(dict(shape=(-1, 1), axes=("data", "model")))

  c.data = ml_collections.ConfigDict(dict(
      name="synthetic", data_dir="", manual_dir="", eval_split="test", eval_examples=200,
      use_chat_template=False,
      # name='jsonl' / 'parquet': your own prompt/answer records. files / eval_files: glob
      # patterns of the train / 'test' split's files, relative to manual_dir if set (else
      # to the directory the run starts in, then recorded in config.json as manual_dir);
      # no eval_files: eval_split must be part of train ('train[:200]').
      # prompt_template: '' = the prompt as is, else every '{prompt}' in it is replaced
      # by the prompt (sagc_jax.data.prompt_files).
      files=(), eval_files=(), prompt_field="prompt", answer_field="answer",
      prompt_template="",
      # Settings of the built-in task (sagc_jax.data.synthetic.SyntheticConfig).
      synthetic=ml_collections.ConfigDict(dict(
          max_operand=9, min_ops=1, max_ops=3, allow_mul=False, recheck_prob=0.35,
          max_rechecks=6, modulus=0, guess_prob=0.0, num_train=20000, num_test=500, seed=0))))
  # name: the task's verifier (accuracy); fns / weights: the training reward's terms
  # (empty: the verifier's score), see sagc_jax.reward_mix.
  c.reward = ml_collections.ConfigDict(dict(name="exact_match", format_weight=0.0, workers=0,
                                             fns=(), weights=(), timeout_s=10.0))

  c.controller = ml_collections.ConfigDict(dict(
      kind="sagc", candidates=(4, 8, 16), tau=2.0, delta=0.25, event="group", eta=1.0,
      lambda_max=50.0,
      forgetting=0.99, prior_alpha=1.0, prior_beta=1.0, seed=0, static_g=8,
      # None = the smallest candidate; a typed placeholder so that the command line
      # can set it (--config.controller.initial_g=8).
      initial_g=config_dict.placeholder(int)))

  c.rollout = ml_collections.ConfigDict(dict(
      mode="hold_prompts", prompts_per_step=8, rollouts_per_step=64, max_new_tokens=64,
      temperature=1.0, top_p=1.0, top_k=0, prompt_buckets=(32,), response_buckets=(64,),
      eval_batch=64,
      # Split larger rollout / eval batches into sequential sampler calls of at most
      # this many rows (whole groups; 0 = never): bounds the KV cache of one call.
      max_rows_per_call=0,
      # Segmented decoding (sampling/segmented.py): tokens per segment (-1 = auto,
      # about 8 span buckets; 0 = the fused sampler); compaction of the running rows
      # between segments, down to min_compact_rows.
      decode_segment=-1, compaction=True, min_compact_rows=8,
      # Evaluation samplers segmented too (off: they run a few times per run, and the
      # fused sampler's one executable per shape compiles much faster).
      segmented_eval=False))

  c.learner = learner_section(lr=1e-4, weight_decay=0.0)
  apply_algorithm(c, "grpo")

  # Supervised warm start on the task's reference solutions (built-in task only);
  # cached in the workdir, so a resumed run does not repeat it.
  c.sft = ml_collections.ConfigDict(dict(
      enabled=True, steps=300, batch_size=64, lr=3e-3, warmup_steps=20, seq_bucket=96,
      # Optional second stage: this many more steps on the same examples with
      # guess_stage_prob of the solutions reduced to their answer line (a policy that
      # can write the work but rarely does; 0 = no second stage).
      guess_stage_steps=0, guess_stage_prob=0.9))

  c.train = ml_collections.ConfigDict(dict(
      steps=100, checkpoint_every=25, keep_checkpoints=3, eval_every=50, log_every=1,
      # > 1: every evaluation also draws eval_k samples per example (pass@j, mean@k).
      eval_k=0,
      # Every log_completions_every steps (0 = never), log_completions sampled
      # completions go to completions.jsonl and TensorBoard text (and W&B).
      log_completions_every=10, log_completions=4,
      # '' = no Weights & Biases; else the project (needs `pip install wandb`).
      wandb_project="",
      # Every export_every steps (0 = never) the policy is written as a Hugging Face
      # folder (transformers / vLLM) to <export_dir or workdir/exports>/step_<N>.
      export_every=0, export_dir="",
      compilation_cache=True, compilation_cache_dir="",
      # Stop (without checkpointing the step) once this many learner updates in a row
      # were skipped as non-finite: checkpointing on would rotate the good ones out.
      # 0 = never stop.
      max_consecutive_skipped=5,
      # '' = <workdir>/checkpoints; a gs:// path on TPU pods (shared by every host).
      checkpoint_dir="",
      # Local disk for gs:// inputs (model.path, data.manual_dir: copied once per host)
      # and a gs:// workdir's rebuildable local files ('' = $SAGC_CACHE_DIR or
      # ~/.cache/sagc_jax).
      local_cache_dir="",
      # A gs:// metrics.jsonl is rewritten at most this often (and at every checkpoint).
      metrics_sync_secs=30.0))
  return c


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
  from sagc_jax.reward_mix import check_reward_config
  check_reward_config(config.reward)

  controller_from_config(config)          # raises "controller: ..." on bad settings

  mode = checks.one_of(config, "rollout.mode", ROLLOUT_MODES)
  candidates = tuple(config.controller.candidates) if config.controller.kind == "sagc" \
      else (config.controller.static_g,)
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
  for key in ("rollout.compaction", "rollout.segmented_eval"):
    if not isinstance(checks.lookup(config, key), bool):
      raise ValueError(f"{key}={checks.lookup(config, key)!r} must be True or False")
  checks.positive_int(config, "rollout.min_compact_rows")
  for key in ("steps", "checkpoint_every", "keep_checkpoints", "eval_every", "log_every"):
    checks.positive_int(config, f"train.{key}")
  checks.number_in(config, "train.metrics_sync_secs", 0.0)
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
              "train.export_dir"):
    value = checks.lookup(config, key)
    if not isinstance(value, str):
      raise ValueError(f"{key}={value!r} must be a string (a folder path; '' for the default)")
  for key in ("data.data_dir", "train.local_cache_dir"):
    if is_remote(checks.lookup(config, key)):
      raise ValueError(f"{key}={checks.lookup(config, key)!r} must be a local folder "
                       "(TFDS builds and the staging cache need a real filesystem)")
  learner = learner_config(config)        # raises "learner.<key>=..." on bad settings
  for g in candidates:
    rows = checks.prompts_per_round(config.rollout, g) * g
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
  """The ``LearnerConfig`` of a training config (preset from ``learner.algorithm``)."""
  values = config.learner.to_dict()
  values["max_response_len"] = config.rollout.max_new_tokens
  values["temperature"] = config.rollout.temperature or 1.0
  # The schedule counts optimizer updates: mini_batches x epochs per RL step.
  values.setdefault("total_steps", config.train.steps * config.learner.mini_batches
                    * config.learner.epochs)
  return LearnerConfig.from_dict(values)


def preset(algorithm: str, controller: str) -> ml_collections.ConfigDict:
  """``base_config()`` switched to GRPO or DAPO and to SAGC or a static G.

  GRPO keeps the base learner (k3 KL to a frozen reference, symmetric clip,
  seq-mean-token-mean). DAPO: clip-higher 0.28, token-mean, no KL, dynamic
  sampling and a soft overlong buffer of a quarter of the response budget.
  """
  if controller not in ("sagc", "static"):
    raise ValueError(f"preset controller={controller!r}: must be 'sagc' or 'static'")
  c = base_config()
  c.controller.kind = controller
  apply_algorithm(c, algorithm)
  return c


def apply_algorithm(config: ml_collections.ConfigDict, algorithm: str) -> None:
  """Switches ``config.learner`` to the GRPO or DAPO settings (in place).

  The objective settings come from ``ALGORITHM_PRESETS`` (``rl/learner.py``, the one
  place they are written), with two config-level rules: GRPO keeps a KL coefficient
  the config already set below the preset's (the TPU preset's 0.001 survives the
  comparison's per-arm switch), and DAPO's soft overlong buffer is a quarter of
  ``rollout.max_new_tokens``.
  """
  if algorithm not in ALGORITHM_PRESETS:
    raise ValueError(f"learner.algorithm={algorithm!r} is not one of "
                     f"{tuple(ALGORITHM_PRESETS)}")
  kl_before = config.learner.get("kl_coef")
  config.learner.update(ALGORITHM_PRESETS[algorithm])
  if algorithm == "grpo" and kl_before and kl_before < config.learner.kl_coef:
    config.learner.kl_coef = kl_before
  if algorithm == "dapo":
    config.learner.overlong_buffer = max(config.rollout.max_new_tokens // 4, 1)


def learner_section(**changes) -> ml_collections.ConfigDict:
  """Every ``LearnerConfig`` setting a config file can set (all of them but
  ``DERIVED_FIELDS``), at the dataclass defaults plus ``changes``; ``None`` defaults
  become typed placeholders, so that ``--config.learner.clip_c=3.0`` works."""
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(LearnerConfig):
    if field.name in DERIVED_FIELDS:
      continue
    value = changes.pop(field.name, field.default)
    section[field.name] = config_dict.placeholder(float) if value is None else value
  if changes:
    raise ValueError(f"learner_section: unknown learner settings {sorted(changes)}")
  return section


def tpu_pod_preset() -> ml_collections.ConfigDict:
  """GRPO + SAGC at the SAGC paper's scale on a Cloud TPU pod (3B policy, GSM8K).

  G in {4, 8, 16}, 512 rollouts per step, responses up to 2048 tokens,
  bfloat16 parameters sharded 4-way on 'model' (heads / MLP) and data-parallel
  over the remaining chips, math-verify rewards in 8 worker processes. The
  model folder and the GSM8K files must be given (``model.path``,
  ``data.manual_dir``).

  Memory: float32 master weights and Adam moments sharded FSDP-style, per-layer
  remat, the fused splash attention kernel (TPU only; ``attention="blocked"``
  elsewhere), 256-position log-prob chunks, 4 minibatches x 4 interleaved
  microbatches; rollouts in sampler calls of 256 rows. Sized with
  ``python -m sagc_jax.aot --config configs/<preset>.py --topology v5e:4x4
  --largest_only`` (2-core CPU host, no TPU): every executable fits 16 GiB
  chips with the run's resident state counted (largest: the train step, 12.6 GiB
  Llama-3.2-3B / 12.5 GiB Qwen2.5-3B). Projected from XLA's cost analysis plus the
  kernel's analytic cost (rooflines, not measurements): one RL step at the worst
  case (every response 2048 tokens) 82.1 s Llama-3.2-3B / 101.1 s Qwen2.5-3B,
  i.e. 11.4 h / 14.0 h for the 500 steps; decoding dominates (68 s / 85 s per step).
  With the decode step's HBM traffic estimated from the compiled program instead of
  XLA's byte count (which also counts on-chip reads): 46.9 s / 32.8 s per step,
  6.5 h / 4.6 h.
  """
  c = preset("grpo", "sagc")
  c.model.update(dict(path="", dtype="bfloat16", require_path=True))
  c.mesh.update(dict(shape=(-1, 4), axes=("data", "model")))
  c.data.update(dict(name="gsm8k_local", manual_dir="", eval_examples=1319,
                     use_chat_template=True))
  c.reward.update(dict(name="math_verify", workers=8))
  c.rollout.update(dict(mode="hold_rollouts", rollouts_per_step=512, max_new_tokens=2048,
                        temperature=1.0, prompt_buckets=(256, 512),
                        response_buckets=(512, 1024, 2048), eval_batch=256,
                        max_rows_per_call=256))
  c.controller.update(dict(candidates=(4, 8, 16), tau=2.0, delta=0.2))
  c.learner.update(dict(lr=1e-6, warmup_steps=10, weight_decay=0.01, kl_coef=0.001,
                        mini_batches=4, grad_accum=4, remat="full", attention="splash",
                        attention_block=512, logits_chunk=256, fsdp=True))
  c.sft.enabled = False
  c.train.update(dict(steps=500, checkpoint_every=20, eval_every=50))
  return c


def tiny_cpu_config() -> ml_collections.ConfigDict:
  """The CPU default: GRPO + SAGC on the built-in tiny model (about 5 min, 2 cores).

  A ~0.8M-parameter character-level Llama, warm-started on the synthetic task's
  one- and two-step problems, then 60 GRPO steps with 8 prompts per step (rows =
  8 G) while SAGC picks G in {4, 8, 16}. Responses are ~20 tokens, so a group
  straggles when its longest response is 1.8x its median; a short run needs
  fast forgetting (posterior evidence half-life ~14 steps).
  """
  c = preset("grpo", "sagc")
  c.data.synthetic.update(dict(max_ops=2))
  c.data.eval_examples = 384
  c.rollout.update(dict(mode="hold_prompts", prompts_per_step=8, max_new_tokens=64,
                        prompt_buckets=(16,), response_buckets=(64,), eval_batch=128,
                        temperature=1.0))
  c.controller.update(dict(candidates=(4, 8, 16), tau=1.8, delta=0.25, forgetting=0.95))
  c.learner.update(dict(lr=1e-4, warmup_steps=10, kl_coef=0.01, mini_batches=2))
  c.sft.update(dict(steps=250, batch_size=64, lr=5e-3, warmup_steps=20, seq_bucket=64))
  c.train.update(dict(steps=60, checkpoint_every=20, eval_every=30))
  return c
