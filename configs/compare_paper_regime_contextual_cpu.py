"""The paper's regime on CPU (``compare_paper_regime_cpu.py``) with the contextual
controllers (docs/controllers.md) beside SAGC and static G = 16:

{GRPO, DAPO} x {static 16, SAGC, prompt_aware, per_prompt} with that file's seeds and
time budget, from one shared warm start. A run meets a few thousand prompts at most out
of 20,000, so prompts rarely recur: the contextual kinds see mostly the prompts' token
lengths, not a prompt's history.

Run: python -m sagc_jax.compare --config configs/compare_paper_regime_contextual_cpu.py \\
  --workdir runs/compare_paper_contextual
"""

import pathlib
import runpy


def get_config():
  base = runpy.run_path(str(pathlib.Path(__file__).with_name("compare_paper_regime_cpu.py")))
  c = base["get_config"]()
  c.compare.static_sizes = (16,)
  c.compare.contextual = ("prompt_aware", "per_prompt")
  return c
