"""sagc_jax: JAX-native synchronous GRPO/DAPO with Straggler-Aware Group Control."""

__version__ = "0.1.0"
