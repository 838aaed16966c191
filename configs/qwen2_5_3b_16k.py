"""TPU-pod preset at 16,384-token responses: GRPO + SAGC on Qwen2.5-3B, rollouts through
the refill sampler (paged KV cache, Pallas kernel; `sagc_jax.config.tpu_pod_long_preset`).

  python -m sagc_jax.train --config configs/qwen2_5_3b_16k.py \\
      --workdir gs://BUCKET/runs/qwen2_5_3b_16k \\
      --config.model.path=gs://BUCKET/models/Qwen2.5-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for a v5e:4x4 slice without a TPU: 128 decode slots, which the AOT tool's slot
search keeps (64 and 256 project slower rollouts or evict at the cap), and a pool of
7232 pages per 'data' shard. On v6e:4x4 add ``--config.rollout.kv_pages=0``:
the pool that holds every slot at the cap fits there. The figures (fit, pool,
projected rollout against its bound per length model, both slices) are in
docs/results.md (the "AOT: ..." sections):

  python -m sagc_jax.aot --config configs/qwen2_5_3b_16k.py --topology v5e:4x4 \
      --largest_only --config.rollout.kv_pages=0 --refill_slots_search=64,128,256
"""

from sagc_jax.config import tpu_pod_long_preset


def get_config():
  # The pool per 'data' shard is what `python -m sagc_jax.aot` sized for v5e:4x4 with
  # --config.rollout.kv_pages=0 (docs/scale.md).
  return tpu_pod_long_preset("configs/models/qwen2_5_3b.json", kv_pages=7232)
