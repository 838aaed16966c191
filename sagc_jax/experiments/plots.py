"""PNG plots of a training run: G and lambda, straggler events, reward vs time."""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from sagc_jax.experiments.machine import stamp
from sagc_jax.runtime.storage import run_path


def plot_run(history: Sequence[dict[str, Any]], eval_history: Sequence[dict[str, Any]],
             path: str | os.PathLike, title: str = "") -> None:
  """Four panels over RL steps: G (+lambda), straggler rate, reward/accuracy, seconds/step."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps = np.array([r["step"] for r in history])
  col = lambda key: np.array([r.get(key, np.nan) for r in history], float)
  fig, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
  axes[0].step(steps, col("g"), where="post", label="G")
  axes[0].set_ylabel("group size G")
  twin = axes[0].twinx()
  twin.plot(steps, col("lambda"), color="tab:red", lw=0.8, label="lambda")
  twin.set_ylabel("lambda", color="tab:red")
  axes[1].bar(steps, col("group_straggler_rate"), width=0.8, color="tab:orange",
              label="fraction of groups")
  hit = col("step_straggler") > 0
  axes[1].plot(steps[hit], np.full(hit.sum(), 1.02), "|", color="k",
               label="step with a straggler (S_t = 1)")
  axes[1].set_ylabel("straggler rate")
  axes[1].legend(fontsize=8)
  axes[2].plot(steps, col("reward_mean"), label="train reward")
  axes[2].plot(steps, col("accuracy"), label="train accuracy")
  if eval_history:
    steps_eval = [e["step"] for e in eval_history]
    if all("eval_accuracy" in e for e in eval_history):
      axes[2].plot(steps_eval, [e["eval_accuracy"] for e in eval_history], "o-",
                   label="held-out accuracy (greedy)")
    if all("eval_sampled_accuracy" in e for e in eval_history):
      axes[2].plot(steps_eval, [e["eval_sampled_accuracy"] for e in eval_history], "s-",
                   label="held-out accuracy (sampled)")
  axes[2].legend(fontsize=8)
  axes[3].plot(steps, col("time_rollout_s"), label="rollout")
  axes[3].plot(steps, col("time_learner_s"), label="learner")
  axes[3].plot(steps, col("time_total_s"), label="total")
  axes[3].set_ylabel("seconds / step")
  axes[3].set_xlabel("RL step")
  axes[3].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  stamp(fig)
  with run_path(path).open("wb") as f:         # local or gs://
    fig.savefig(f, format="png", dpi=100)
  plt.close(fig)


def plot_simulation(result: dict[str, Any], path: str | os.PathLike) -> None:
  """PNG of SAGC's G, lambda and posterior means, and every arm's running rate."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  trace = result["traces"]["sagc"]
  steps = np.arange(len(trace["g"]))
  fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
  axes[0].step(steps, trace["g"], where="post", lw=0.8)
  axes[0].set_ylabel("SAGC G")
  axes[0].set_yscale("log", base=2)
  axes[1].plot(steps, trace["lambda"], lw=0.8)
  axes[1].set_ylabel("lambda")
  for g in result["candidates"]:
    axes[2].plot(steps, trace[f"p_mean/G{g}"], lw=0.8, label=f"G={g}")
  axes[2].set_ylabel("posterior mean p(G)")
  axes[2].legend(loc="upper left", fontsize=8)
  delta = result["config"]["controller"]["delta"]
  for name, arm in result["traces"].items():
    running = np.cumsum(arm["straggler_rate"]) / (steps + 1)
    axes[3].plot(steps, running, lw=0.8, label=name)
  axes[3].axhline(delta, color="k", ls="--", lw=0.8, label="delta")
  axes[3].set_ylabel("running straggler rate")
  axes[3].set_xlabel("step")
  axes[3].legend(loc="upper left", fontsize=8, ncol=2)
  stamp(fig)
  fig.savefig(path, dpi=110)
  plt.close(fig)
