"""Full-scale comparison on Cloud TPU: {GRPO, DAPO} x {static G = 4, 8, 16, SAGC}.

The TPU-pod preset (``sagc_jax.config.tpu_pod_preset``: 3B policy, GSM8K, 512
rollouts per step). Run one arm per slice and merge:

  python -m sagc_jax.compare --config configs/compare_tpu.py --workdir W --arms grpo_sagc \\
      --config.model.path=gs://BUCKET/models/Qwen2.5-3B --config.data.manual_dir=gs://BUCKET/data/gsm8k
  ... (one call per arm, e.g. through launch/tpu_pod.sh with a different --name)
  python -m sagc_jax.compare --workdir W --merge_only
"""

import ml_collections

from sagc_jax.config import tpu_pod_preset


def get_config():
  c = tpu_pod_preset()
  c.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo"), seeds=1,
                                             time_budget_s=0.0, eval_points=8, targets=()))
  return c
