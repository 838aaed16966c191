"""TPU-pod preset: GRPO + SAGC on Qwen2.5-3B with GSM8K files.

See ``sagc_jax.config.tpu_pod_preset`` for the scale (512 rollouts per step, G in
{4, 8, 16}, 2048-token responses, bf16, 4-way model parallel). Needs an HF
checkpoint folder and the GSM8K files (train.jsonl / test.jsonl), local or in a bucket
(gs:// folders are copied once per host into the local cache, train.local_cache_dir):

  python -m sagc_jax.train --config configs/qwen2_5_3b.py --workdir gs://BUCKET/runs/qwen2_5_3b \\
      --config.model.path=gs://BUCKET/models/Qwen2.5-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k

Sized for a v5e:4x4 slice without a TPU (every executable fits; projected per
worst-case RL step 101.1 s, 14.0 h for 500 steps, from XLA's cost analysis + the splash
kernel's analytic cost; 32.8 s, 4.6 h with the decode step's estimated HBM traffic,
which XLA's byte count overstates; rooflines, not measurements):

  python -m sagc_jax.aot --config configs/qwen2_5_3b.py --topology v5e:4x4 --largest_only

Switch algorithm / controller with ``--config.learner.algorithm=dapo`` (DAPO's preset,
as in configs/dapo_sagc.py) or ``--config.controller.kind=static``.
"""

from sagc_jax.config import tpu_pod_preset


def get_config():
  c = tpu_pod_preset()
  c.model.config_json = "configs/models/qwen2_5_3b.json"   # sizes `python -m sagc_jax.aot`
  return c
