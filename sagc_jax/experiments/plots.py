"""PNG plots of a training run: G and lambda, straggler events, reward vs time.

Also the helpers the comparison plots share (``sagc_jax.experiments.compare``): line
styles that keep coinciding lines visible, a confidence band clipped to a rate's range,
a rolling share of steps at each G, and a legend placed outside the data.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from sagc_jax.experiments.machine import stamp
from sagc_jax.runtime.storage import run_path

# Lines that can coincide (a reward term equal to the reward, a binary reward equal to
# the accuracy, two arms with the same G trace) stay visible: the first is wide and
# translucent, each later one thinner, dashed differently and drawn above the earlier
# ones, so a line under another still shows around the dashes of the one on top.
LINE_STYLES = (
    {"ls": "-", "lw": 3.0, "alpha": 0.5},
    {"ls": "--", "lw": 1.6},
    {"ls": ":", "lw": 2.0},
    {"ls": "-.", "lw": 1.3},
    {"ls": (0, (6, 2, 1, 2, 1, 2)), "lw": 1.2},
    {"ls": (0, (1, 1)), "lw": 1.0},
)
ROLLING_WINDOW = 50    # steps in the simulator's rolling share of each G


def line_style(i: int) -> dict[str, Any]:
  """Keyword arguments for the ``i``-th of several lines that may coincide."""
  style = dict(LINE_STYLES[i % len(LINE_STYLES)])
  style["zorder"] = 2 + 0.01 * i
  return style


def outside_legend(ax, **kwargs) -> None:
  """The legend to the right of ``ax``, off the data (``stamp``'s tight layout makes
  room for it)."""
  handles, _ = ax.get_legend_handles_labels()
  if handles:
    kwargs.setdefault("fontsize", 8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def rate_band(mean: Any, half: Any, low: float = 0.0,
              high: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
  """(lower, upper) edge of ``mean +- half`` clipped to ``[low, high]``: a rate's
  confidence band never leaves [0, 1] (nan half-widths stay nan: no band)."""
  mean, half = np.asarray(mean, float), np.asarray(half, float)
  return np.clip(mean - half, low, high), np.clip(mean + half, low, high)


def rolling_share(g: Sequence[float], candidates: Sequence[int],
                  window: int = ROLLING_WINDOW) -> np.ndarray:
  """``[len(candidates), steps]``: at each step, the share of the last ``window``
  steps (fewer at the start) whose G was each candidate. Each value is in [0, 1];
  a column sums to 1 when every G is a candidate."""
  if window < 1:
    raise ValueError(f"window={window} must be >= 1")
  g = np.asarray(g, float)
  hits = (g[None, :] == np.asarray(candidates, float)[:, None]).astype(float)
  total = np.cumsum(hits, axis=1)
  before = np.zeros_like(total)
  before[:, window:] = total[:, :-window]
  return (total - before) / np.minimum(np.arange(1, g.size + 1), window)


def reward_terms(history: Sequence[dict[str, Any]]) -> list[str]:
  """The custom reward terms' keys (``reward/<name>``) in ``history``, first seen first;
  ``reward/errors`` is a count of failed calls, not a term."""
  keys: dict[str, None] = {}
  for row in history:
    keys.update((k, None) for k in row if k.startswith("reward/") and k != "reward/errors")
  return list(keys)


def plot_run(history: Sequence[dict[str, Any]], eval_history: Sequence[dict[str, Any]],
             path: str | os.PathLike, title: str = "") -> None:
  """Six panels over RL steps: G, lambda, straggler rate, reward (and each reward term),
  accuracy (train and held-out), seconds per step; legends to the right of the data."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps = np.array([r["step"] for r in history])
  col = lambda key: np.array([r.get(key, np.nan) for r in history], float)
  fig, axes = plt.subplots(6, 1, figsize=(10, 14), sharex=True)
  g = col("g")
  axes[0].step(steps, g, where="post", label="G")
  sizes = np.unique(g[np.isfinite(g)])
  if 0 < sizes.size <= 8:
    axes[0].set_yticks(sizes)
  axes[0].set_ylabel("group size G")
  axes[1].plot(steps, col("lambda"), color="tab:red", lw=1.0, label="lambda")
  axes[1].set_ylabel("lambda")

  axes[2].bar(steps, col("group_straggler_rate"), width=0.8, color="tab:orange",
              label="fraction of groups")
  hit = col("step_straggler") > 0
  axes[2].plot(steps[hit], np.full(hit.sum(), 1.04), "|", color="k", ms=8,
               label="step with a straggler\n(S_t = 1)")
  axes[2].set_ylim(0.0, 1.1)
  axes[2].set_ylabel("straggler rate")

  # Reward and accuracy have panels of their own (a 0/1 reward equals the accuracy);
  # the terms share the reward's panel in line styles that keep each one visible.
  axes[3].plot(steps, col("reward_mean"), label="train reward",
               **line_style(0))
  for i, key in enumerate(reward_terms(history), start=1):
    axes[3].plot(steps, col(key), label=f"term {key.split('/', 1)[1]}", **line_style(i))
  errors = np.nansum(col("reward/errors"))
  axes[3].set_ylabel("reward")
  outside_legend(axes[3], title=f"{errors:.0f} failed reward calls" if errors else None,
                 title_fontsize=8)

  axes[4].plot(steps, col("accuracy"), label="train accuracy",
               **line_style(0))
  for i, (key, label, marker) in enumerate(
      (("eval_accuracy", "held-out (greedy)", "o"),
       ("eval_sampled_accuracy", "held-out (sampled)", "s")), start=1):
    points = [e for e in eval_history if key in e]   # greedy eval can be off
    if points:
      axes[4].plot([e["step"] for e in points], [e[key] for e in points], marker=marker,
                   ms=5, label=label, **line_style(i))
  axes[4].set_ylabel("accuracy")

  axes[5].plot(steps, col("time_rollout_s"), label="rollout")
  axes[5].plot(steps, col("time_learner_s"), label="learner")
  axes[5].plot(steps, col("time_total_s"), label="total")
  axes[5].set_ylabel("seconds / step")
  axes[5].set_xlabel("RL step")
  for i in (0, 1, 2, 4, 5):
    outside_legend(axes[i])
  if title:
    fig.suptitle(title)
  stamp(fig)
  with run_path(path).open("wb") as f:         # local or gs://
    fig.savefig(f, format="png", dpi=100)
  plt.close(fig)


def plot_simulation(result: dict[str, Any], path: str | os.PathLike) -> None:
  """PNG of SAGC's rolling share of each G, lambda and posterior means, and every arm's
  running straggler rate."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  trace = result["traces"]["sagc"]
  steps = np.arange(len(trace["g"]))
  candidates = result["candidates"]
  window = min(ROLLING_WINDOW, max(len(steps), 1))
  fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
  # A raw G trace over 1,000 steps is a solid block: show how often each G was chosen.
  for i, (g, share) in enumerate(zip(candidates, rolling_share(trace["g"], candidates,
                                                               window))):
    axes[0].plot(steps, share, label=f"G={g}", **line_style(i))
  axes[0].set_ylim(-0.03, 1.03)
  axes[0].set_ylabel(f"SAGC: share of the\nlast {window} steps at G")
  axes[1].plot(steps, trace["lambda"], color="tab:red", lw=0.8, label="lambda")
  axes[1].set_ylabel("lambda")
  for i, g in enumerate(candidates):
    axes[2].plot(steps, trace[f"p_mean/G{g}"], label=f"G={g}", **line_style(i))
  axes[2].set_ylabel("posterior mean p(G)")
  delta = result["config"]["controller"]["delta"]
  for i, (name, arm) in enumerate(result["traces"].items()):
    running = np.cumsum(arm["straggler_rate"]) / (steps + 1)
    axes[3].plot(steps, running, label=name, **line_style(i))
  axes[3].axhline(delta, color="k", ls="--", lw=0.8, label="delta")
  axes[3].set_ylabel("running straggler rate")
  axes[3].set_xlabel("step")
  for ax in axes:
    outside_legend(ax)
  stamp(fig)
  fig.savefig(path, dpi=110)
  plt.close(fig)
