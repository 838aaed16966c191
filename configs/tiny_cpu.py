"""The CPU default (README command 1): GRPO + SAGC on the built-in tiny model, in the
SAGC paper's regime: longer reasoning pays and RL discovers it.

A ~0.8M-parameter character-level Llama is built offline and warm-started on the
synthetic task's mod-10 variant (``data.synthetic.modulus=10``, 2-4 operations):
every scratchpad line is a digit fact, and the answer of several operations cannot be
had without them (a running sum mod 10 is the classic task a small transformer fails
to do in one shot). The warm start has the skill but rarely uses it: 800 supervised
steps on data where 20% of the solutions are answer-only (enough written work to
learn it robustly: with 50% the loss plateau broke late or not at all, depending on
the data order; at 20% it breaks near step 200 and the loss is flat from ~600), then
100 steps where 85% are (``sft.guess_stage_*``). Then 60 GRPO
steps while SAGC picks G in {4, 8, 16}: RL raises the share of responses that write
their work, so held-out accuracy and response lengths grow, and the within-group
max/median ratio and the straggler rate rise while a growing minority of each group
works, then fall once most responses work; SAGC's G follows. ``learner.lr=1e-5``
keeps the first of those phases long enough to see. The warm start is cached
(``~/.cache/sagc_jax/warm_starts``), so a rerun, a second workdir and the paper-regime
comparison of the same seed (``configs/compare_paper_regime_cpu.py``, built on this
file) reuse it. Measured: docs/results.md, "The main job, three seeds". The quick
task of ``sagc_jax.config.tiny_cpu_config`` (one- and two-step problems, the base of
the tests' configs) did not show learning in 60 steps.

Run: python -m sagc_jax.train --config configs/tiny_cpu.py --workdir runs/tiny_cpu
"""

from sagc_jax.config import tiny_cpu_config


def get_config():
  c = tiny_cpu_config()
  c.data.synthetic.update(dict(min_ops=2, max_ops=4, modulus=10, guess_prob=0.2,
                               max_rechecks=3))
  c.sft.update(dict(steps=800, lr=1e-3, guess_stage_steps=100, guess_stage_prob=0.85))
  c.learner.update(dict(lr=1e-5, warmup_steps=0))
  return c
