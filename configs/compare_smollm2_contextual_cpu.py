"""The real-model comparison (``compare_smollm2_cpu.py``) with the contextual
controllers (docs/controllers.md) beside SAGC and static G = 16, GRPO only:

GRPO x {static 16, SAGC, prompt_aware, per_prompt} x 3 seeds of 5 RL steps of 16
rollouts on SmolLM2-135M-Instruct, 512-token responses, a sampled evaluation on 64
held-out word problems before and after. 80 prompt slots a run, so no prompt recurs
within a run: the contextual kinds see the prompts' token lengths, never a prompt's
own history. DAPO is left out to fit 12 runs on two CPU cores (its extra sampling
rounds double a run's time); ``compare_smollm2_cpu.py`` has its SAGC and static arms.

Run: python -m sagc_jax.compare --config configs/compare_smollm2_contextual_cpu.py \\
  --workdir runs/compare_smollm2_contextual
"""

import pathlib
import runpy


def get_config():
  base = runpy.run_path(str(pathlib.Path(__file__).with_name("compare_smollm2_cpu.py")))
  c = base["get_config"]()
  c.compare.algorithms = ("grpo",)
  c.compare.static_sizes = (16,)
  c.compare.contextual = ("prompt_aware", "per_prompt")
  return c
