"""TPU-pod preset at 16,384-token responses for an 8B policy: GRPO + SAGC on Qwen3-8B
through the refill sampler (`sagc_jax.config.tpu_pod_long_preset`).

  python -m sagc_jax.train --config configs/qwen3_8b_16k.py \\
      --workdir gs://BUCKET/runs/qwen3_8b_16k \\
      --config.model.path=gs://BUCKET/models/Qwen3-8B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for a v6e:4x4 slice without a TPU: 128 decode slots (32 per 'data' lane) and
the pool of pages per lane that fits under 90% of a 32 GiB chip, which the AOT tool's
slot search chose over 64 slots (docs/scale.md, "Sizing a slice"; docs/results.md,
"AOT: the sizing table"):

  python -m sagc_jax.aot --config configs/qwen3_8b_16k.py --topology v6e:4x4 \\
      --largest_only --only samplers --config.rollout.kv_pages=0 --refill_slots_search=64,128

On a v5p slice of 16 chips (95 GiB each) add ``--config.rollout.kv_pages=0``: the
pool that holds every slot at the cap.
"""

from sagc_jax.config import tpu_pod_long_preset


def get_config():
  # The slots and the pool per 'data' shard are what `python -m sagc_jax.aot` chose for
  # v6e:4x4 with the command above.
  return tpu_pod_long_preset("configs/models/qwen3_8b.json", kv_pages=7999, refill_slots=128)
