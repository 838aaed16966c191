"""TPU-pod preset at 32,768-token responses (thinking-model lengths): GRPO + SAGC on
Qwen2.5-3B through the refill sampler (`sagc_jax.config.tpu_pod_long_preset`).

  python -m sagc_jax.train --config configs/qwen2_5_3b_32k.py \\
      --workdir gs://BUCKET/runs/qwen2_5_3b_32k \\
      --config.model.path=gs://BUCKET/models/Qwen2.5-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for a v6e:4x4 slice without a TPU (docs/scale.md, "Sizing a slice"):

  python -m sagc_jax.aot --config configs/qwen2_5_3b_32k.py --topology v6e:4x4 \\
      --largest_only --out configs/aot/qwen2_5_3b_32k_v6e-4x4.json
"""

from sagc_jax.config import tpu_pod_long_preset


def get_config():
  return tpu_pod_long_preset("configs/models/qwen2_5_3b.json", kv_pages=0, refill_slots=128,
                             response_tokens=32768)
