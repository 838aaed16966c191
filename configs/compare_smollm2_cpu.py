"""GRPO and DAPO x {static G = 4, static G = 16, SAGC} x 3 seeds on SmolLM2-135M-Instruct, CPU.

The real-model comparison: ``configs/smollm2_cpu.py``'s model, task and 512-token
responses, with every arm made short enough for 18 runs on two CPU cores: 16
rollouts per step, 5 steps, a sampled evaluation on 64 held-out problems before and
after. All arms start from the same policy (the imported checkpoint) and seed k gives
every arm the same prompts. Five steps measure straggler rates, wall-clock and
lengths; held-out accuracy on 64 problems after 5 steps cannot separate the arms
(its 95% interval is about +-0.1), and the report says so by its intervals. DAPO's
dynamic sampling may draw up to 3 rounds per step where every group of a prompt
fails alike, so its arms take longer.

Run: python -m sagc_jax.compare --config configs/compare_smollm2_cpu.py --workdir runs/compare_smollm2
"""

import ml_collections

from sagc_jax.config import smollm2_cpu_config


def get_config():
  c = smollm2_cpu_config()
  c.data.eval_examples = 64
  c.rollout.rollouts_per_step = 16
  c.train.update(dict(steps=5, checkpoint_every=5, eval_every=5, log_completions_every=0))
  c.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo"), seeds=3,
                                             static_sizes=(4, 16)))
  return c
