"""TPU-pod preset at 16,384-token responses: GRPO + SAGC on Llama-3.2-3B, rollouts through
the refill sampler (paged KV cache, Pallas kernel; `sagc_jax.config.tpu_pod_long_preset`).

  python -m sagc_jax.train --config configs/llama3_2_3b_16k.py \\
      --workdir gs://BUCKET/runs/llama3_2_3b_16k \\
      --config.model.path=gs://BUCKET/models/Llama-3.2-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for a v5e:4x4 slice without a TPU: 64 decode slots and a pool of 4225 pages
per 'data' shard, which holds every slot at the cap, so nothing is ever evicted. The
AOT tool's slot search chose them: with 128 slots the pool that fits evicts when
responses run to the cap (1.40x the bound), although natural lengths decode faster
(337 s instead of 468 s projected; ``--config.rollout.refill_slots=128
--config.rollout.kv_pages=5688``). On v6e:4x4 use ``--config.rollout.refill_slots=128
--config.rollout.kv_pages=0``: the no-eviction pool of 128 slots fits there. The
figures (fit, pool, projected rollout against its bound per length model, both
slices) are in docs/results.md (the "AOT: ..." sections):

  python -m sagc_jax.aot --config configs/llama3_2_3b_16k.py --topology v5e:4x4 \
      --largest_only --config.rollout.kv_pages=0 --refill_slots_search=64,128,256
"""

from sagc_jax.config import tpu_pod_long_preset


def get_config():
  # The slots and the pool per 'data' shard are what `python -m sagc_jax.aot` chose for
  # v5e:4x4 with --config.rollout.kv_pages=0 --refill_slots_search=64,128,256
  # (docs/scale.md, docs/results.md).
  return tpu_pod_long_preset("configs/models/llama3_2_3b.json", kv_pages=4225,
                            refill_slots=64)
