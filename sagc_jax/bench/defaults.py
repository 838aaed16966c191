"""The real-model benchmarks' defaults, in a module without JAX so that
``python -m sagc_jax.bench --help`` starts at once."""

GROUP = 4                          # rows per prompt
TEMPERATURE = 0.7                  # as configs/smollm2_cpu.py samples
DEFAULT_ROWS = (8, 32, 64)
DEFAULT_MAX_NEW_TOKENS = 512
