"""One training run: its inputs (data, policy, rewards), the compiled parts built from
the config (``build``), one RL step (``step``), the loop with checkpoints and metrics
(``loop``), held-out evaluation, the supervised warm start and the HF export."""
