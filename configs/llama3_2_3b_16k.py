"""TPU-pod preset at 16,384-token responses: GRPO + SAGC on Llama-3.2-3B, rollouts through
the refill sampler (paged KV cache, Pallas kernel; `sagc_jax.config.tpu_pod_16k_preset`).

  python -m sagc_jax.train --config configs/llama3_2_3b_16k.py \\
      --workdir gs://BUCKET/runs/llama3_2_3b_16k \\
      --config.model.path=gs://BUCKET/models/Llama-3.2-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for a v5e:4x4 slice without a TPU. On v6e:4x4 add --config.rollout.kv_pages=0:
the pool that holds every slot at the cap fits there. The figures (fit, pool,
projected rollout against its bound per length model, both slices) are in
docs/scale.md:

  python -m sagc_jax.aot --config configs/llama3_2_3b_16k.py --topology v5e:4x4 --largest_only
"""

from sagc_jax.config import tpu_pod_16k_preset


def get_config():
  # The pool per 'data' shard is what `python -m sagc_jax.aot` sized for v5e:4x4 with
  # --config.rollout.kv_pages=0 (docs/scale.md).
  return tpu_pod_16k_preset("configs/models/llama3_2_3b.json", kv_pages=5688)
