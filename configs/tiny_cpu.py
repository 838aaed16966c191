"""The CPU default (README command 1): GRPO + SAGC on the built-in tiny model.

A ~0.8M-parameter character-level Llama is built offline, warm-started with a
short supervised stage on the synthetic arithmetic task (cached in the
workdir), then trained with GRPO while SAGC picks G in {4, 8, 16} every step.
Sized for about five minutes on two CPU cores.

Run: python -m sagc_jax.train --config configs/tiny_cpu.py --workdir runs/tiny_cpu
"""

from sagc_jax.config import preset


def get_config():
  c = preset("grpo", "sagc")
  c.rollout.update(dict(mode="hold_prompts", prompts_per_step=8, max_new_tokens=48,
                        prompt_buckets=(16,), response_buckets=(48,), eval_batch=100,
                        temperature=1.0))
  c.controller.update(dict(candidates=(4, 8, 16), tau=1.6, delta=0.25))
  c.learner.update(dict(lr=2e-4, kl_coef=0.01, mini_batches=2))
  c.sft.update(dict(steps=400, batch_size=64, lr=3e-3, seq_bucket=64))
  c.train.update(dict(steps=60, checkpoint_every=20, eval_every=20))
  c.data.eval_examples = 200
  return c
