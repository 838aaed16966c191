"""The SAGC paper's regime on CPU: longer reasoning pays and RL discovers it.

{GRPO, DAPO} x {static G = 4, 8, 16, SAGC} x 3 seeds of 40 RL steps from one shared
warm start, on the synthetic task's mod-10 variant (``data.synthetic.modulus=10``,
2-4 operations): every scratchpad line is a digit fact, while the answer of several
operations cannot be had without them (a running sum mod 10 is the classic task a
small transformer fails to do in one shot). The warm start has the skill but rarely
uses it: 1000 supervised steps on data where 20% of the solutions are answer-only
(enough written work to learn it robustly: with 50% the loss plateau broke late or
not at all, depending on the data order), then 100 steps where 85% are
(``sft.guess_stage_*``). Measured in one trial run (docs/results.md, "The paper's
regime on CPU"): written-out solutions were right ~67% of the time and
answer-only guesses ~13% (chance); 12% of sampled responses wrote the work. RL then
raises the share that works, so held-out accuracy and response lengths grow, and
the within-group max/median ratio and the straggler rate rise while a growing
minority of each group works (the paper's regime), then fall once most responses
work. ``learner.lr=1e-5`` keeps most of the 40 steps in the first phase.

Run: python -m sagc_jax.compare --config configs/compare_paper_regime_cpu.py \
  --workdir runs/compare_paper
"""

import ml_collections

from sagc_jax.config import tiny_cpu_config


def get_config():
  c = tiny_cpu_config()
  c.data.synthetic.update(dict(min_ops=2, max_ops=4, modulus=10, guess_prob=0.2,
                               max_rechecks=3))
  c.sft.update(dict(steps=1000, lr=1e-3, guess_stage_steps=100, guess_stage_prob=0.85))
  c.learner.update(dict(lr=1e-5, warmup_steps=0))
  c.train.update(dict(steps=40, eval_every=40, checkpoint_every=20))
  c.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo"), seeds=3,
                                             reward_target=0.6))
  return c
