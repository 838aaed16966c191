"""TPU-pod preset at 16,384-token responses: GRPO + SAGC on Qwen2.5-3B, rollouts through
the refill sampler (paged KV cache, Pallas kernel; `sagc_jax.config.tpu_pod_16k_preset`).

  python -m sagc_jax.train --config configs/qwen2_5_3b_16k.py \\
      --workdir gs://BUCKET/runs/qwen2_5_3b_16k \\
      --config.model.path=gs://BUCKET/models/Qwen2.5-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for v5e:4x4 and v6e:4x4 slices without a TPU; the figures (fit, pool, projected
rollout against its bound per length model) are in docs/scale.md:

  python -m sagc_jax.aot --config configs/qwen2_5_3b_16k.py --topology v5e:4x4 --largest_only
"""

from sagc_jax.config import tpu_pod_16k_preset


def get_config():
  c = tpu_pod_16k_preset()
  c.model.config_json = "configs/models/qwen2_5_3b.json"   # sizes `python -m sagc_jax.aot`
  # Pages per 'data' shard's pool: what `python -m sagc_jax.aot` sized for v5e:4x4 with
  # --config.rollout.kv_pages=0 (docs/scale.md). With 0 a run takes the no-eviction pool
  # (every slot at the cap), which does not fit a 16 GiB chip.
  c.rollout.kv_pages = 7232
  return c
