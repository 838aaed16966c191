"""Experiments on top of training: the seeded comparison of GRPO/DAPO with and without
SAGC, the paper's claims checked on its results, the figure jobs, plots and the
machine stamp every figure carries."""
