"""The paper's regime with another modulus: answers mod 7 instead of mod 10.

A second workload for checking the replay's learning measures against learning
(docs/results.md, "The replay's learning measures against learning"): everything is
configs/compare_paper_regime_cpu.py's (task, warm start recipe, H = 30 s of step
time, 8 evaluation points, targets) except ``data.synthetic.modulus=7``. Its pilot
(README command 1 with that override) learns; 2-5 operations did not (docs/results.md).
5 seeds.

Run: python -m sagc_jax.compare --config configs/compare_paper_regime_mod7_cpu.py \
  --workdir runs/compare_mod7
"""

import pathlib
import runpy


def get_config():
  here = pathlib.Path(__file__).with_name("compare_paper_regime_cpu.py")
  c = runpy.run_path(str(here))["get_config"]()
  c.data.synthetic.modulus = 7
  c.compare.seeds = 5
  return c
