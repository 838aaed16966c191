"""The CPU default (README command 1): GRPO + SAGC on the built-in tiny model.

A ~0.8M-parameter character-level Llama is built offline, warm-started with a
short supervised stage on the synthetic arithmetic task (cached in the
workdir), then trained with GRPO for 60 steps while SAGC picks G in {4, 8, 16}
every step. About five minutes on two CPU cores. Settings and their reasons:
``sagc_jax.config.tiny_cpu_config``.

Run: python -m sagc_jax.train --config configs/tiny_cpu.py --workdir runs/tiny_cpu
"""

from sagc_jax.config import tiny_cpu_config


def get_config():
  return tiny_cpu_config()
