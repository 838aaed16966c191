"""The training config schema: every key, its default and what it means.

Config files in ``configs/`` start from ``base_config()`` (or a preset of
``config.presets``) and override what they change; every key can be overridden on
the command line (``--config.learner.lr=1e-6``). ``config.validate`` checks a config
before any work is done. Imports no JAX.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from sagc_jax.rl.config import DERIVED_FIELDS, PRESET_FIELDS, LearnerConfig

DATASETS = ("synthetic", "word_problems", "gsm8k_local", "math_local", "jsonl", "parquet")
FILE_DATASETS = ("jsonl", "parquet")   # user prompt/answer files (sagc_jax.data.prompt_files)
REWARDS = ("exact_match", "math_verify")
DTYPES = ("float32", "bfloat16")
PAGED_KERNEL_CHOICES = ("xla", "pallas")   # rollout.paged_kernel (models.paged_cache)


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
  # (empty: the verifier's score), see sagc_jax.rewards.mix.
  c.reward = ml_collections.ConfigDict(dict(name="exact_match", format_weight=0.0, workers=0,
                                             fns=(), weights=(), timeout_s=10.0))

  c.controller = ml_collections.ConfigDict(dict(
      kind="sagc", candidates=(4, 8, 16), tau=2.0, delta=0.25, event="group", eta=1.0,
      lambda_max=50.0,
      forgetting=0.99, prior_alpha=1.0, prior_beta=1.0, seed=0, static_g=8,
      # None = the smallest candidate; a typed placeholder so that the command line
      # can set it (--config.controller.initial_g=8).
      initial_g=config_dict.placeholder(int),
      # kind="prompt_aware" / "per_prompt" only (docs/controllers.md): tail classes on
      # a prompt's past log(max/median)/log(tau), length classes in multiples of the
      # mean prompt length, the cells' prior weight (groups), prompts remembered
      # (least recently observed evicted), discount of a prompt's evidence per visit.
      tail_edges=(0.8, 1.25), length_edges=(1.0,), cell_prior_strength=2.0,
      history_size=20000, history_forgetting=0.7))

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
      # Refill decoding (sampling/refill.py, rollouts only): this many decode slots over
      # a paged KV cache, refilled from a queue of the step's rows (0 = off); tokens
      # per page; pages per layer pool (0 = every slot can hold a longest row); decode
      # steps between refills (0 = auto); decode attention over the pages: "xla" (every
      # backend) or "pallas" (the TPU kernel, which reads only the pages a row fills).
      refill_slots=0, page_size=16, kv_pages=0, refill_segment=0, paged_kernel="xla",
      # Score rows that have finished while the rest still decode (refill boundaries,
      # sub-calls; rewards/streaming.py): the step waits only for the last rows' scores.
      overlap_rewards=True,
      # Evaluation samplers segmented too (off: they run a few times per run, and the
      # fused sampler's one executable per shape compiles much faster).
      segmented_eval=False))

  # learner.algorithm names a preset (rl/config.py ALGORITHM_PRESETS): the objective
  # keys left at None here take its values when the config becomes a LearnerConfig
  # (config.validate.learner_config); a key set anywhere (file, Python, command line)
  # wins.
  c.learner = learner_section(lr=1e-4, weight_decay=0.0, algorithm="grpo")

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
      # False: evaluations skip the greedy pass (no eval_accuracy; on CPU a real model's
      # greedy pass costs as much as the sampled one).
      eval_greedy=True,
      # Every log_completions_every steps (0 = never), log_completions sampled
      # completions go to completions.jsonl and TensorBoard text (and W&B).
      log_completions_every=10, log_completions=4,
      # '' = no Weights & Biases; else the project (needs `pip install wandb`).
      wandb_project="",
      # Every export_every steps (0 = never) the policy is written as a Hugging Face
      # folder (transformers / vLLM) to <export_dir or workdir/exports>/step_<N>.
      export_every=0, export_dir="",
      compilation_cache=True, compilation_cache_dir="",
      # A local folder that keeps the evaluation before RL under a key of the weights,
      # the evaluation settings, devices and code; a run with the same key reuses it
      # instead of evaluating ('' = always evaluate; sagc_jax.compare sets
      # <workdir>/shared/initial_eval: its runs of a seed share one).
      initial_eval_dir="",
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
      metrics_sync_secs=30.0,
      # After SIGTERM / Ctrl-C, `python -m sagc_jax.train` ends the process this many
      # seconds later whatever it is doing (a Spot / preemptible VM gives ~30 s; 0 = no
      # deadline); docs/reliability.md says what is kept.
      stop_grace_s=25.0))
  return c


def learner_section(**changes) -> ml_collections.ConfigDict:
  """Every ``LearnerConfig`` setting a config file can set (all of them but
  ``DERIVED_FIELDS``), at the dataclass defaults plus ``changes``.

  The objective keys of the algorithm presets (``PRESET_FIELDS``) default to
  ``None``: "the preset's value". ``None`` defaults are typed placeholders, so that
  ``--config.learner.clip_c=3.0`` or ``--config.learner.clip_high=0.3`` works.
  """
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(LearnerConfig):
    if field.name in DERIVED_FIELDS:
      continue
    default = None if field.name in PRESET_FIELDS else field.default
    value = changes.pop(field.name, default)
    if value is None:
      value = config_dict.placeholder(float if field.default is None else type(field.default))
    section[field.name] = value
  if changes:
    raise ValueError(f"learner_section: unknown learner settings {sorted(changes)}")
  return section
