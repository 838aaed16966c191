"""PNG plots of a training run (G and lambda, straggler events, reward vs time), of a
simulation and of a comparison's runs (``sagc_jax.experiments.compare``).

Their shared helpers: line styles that keep coinciding lines visible, a confidence
band clipped to a rate's range, a rolling share of steps at each G, and a legend
placed outside the data.
"""

from __future__ import annotations

import os
from pathlib import Path
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


def _pyplot():
  """matplotlib's pyplot on the file-only backend (imported when a plot is made)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(fig, target, machine: dict[str, Any] | None = None, dpi: int = 100, **options):
  """Stamps ``fig`` with the machine, writes it to ``target`` (a path or an open file)
  and closes it; returns ``target``."""
  stamp(fig, machine)
  fig.savefig(target, dpi=dpi, **options)
  _pyplot().close(fig)
  return target


def _mean_band(ax, x, curves, k: int, label: str, low: float = -np.inf,
               high: float = np.inf) -> None:
  """The mean of ``curves`` (one per seed, cut to the shortest) over ``x`` in colour and
  line style ``k``, with a 95% t band clipped to [low, high] when there are several."""
  from sagc_jax.base.stats import mean_ci

  n = min(len(c) for c in curves)
  stats = [mean_ci([c[i] for c in curves]) for i in range(n)]
  mean = np.array([m for m, _, _ in stats])
  ax.plot(x[:n], mean, color=f"C{k}", label=f"{label} (n={len(curves)})", **line_style(k))
  if len(curves) > 1:
    lower, upper = rate_band(mean, np.array([h for _, h, _ in stats]), low, high)
    ax.fill_between(x[:n], lower, upper, color=f"C{k}", alpha=0.15, lw=0)


def trailing_mean(x: Sequence[float], window: int = 5) -> np.ndarray:
  """The ``window``-step trailing means of ``x`` (``x`` itself when shorter)."""
  x = np.asarray(x, float)
  return x if len(x) < window else np.convolve(x, np.ones(window) / window, mode="valid")


def running_mean(x: Sequence[float]) -> np.ndarray:
  """The mean of ``x`` up to each step (a running rate)."""
  return np.cumsum(x) / np.arange(1, len(x) + 1)


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
  plt = _pyplot()

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
  axes[3].plot(steps, col("reward_mean"), label="train reward", **line_style(0))
  for i, key in enumerate(reward_terms(history), start=1):
    axes[3].plot(steps, col(key), label=f"term {key.split('/', 1)[1]}", **line_style(i))
  errors = np.nansum(col("reward/errors"))
  axes[3].set_ylabel("reward")
  outside_legend(axes[3], title=f"{errors:.0f} failed reward calls" if errors else None,
                 title_fontsize=8)

  axes[4].plot(steps, col("accuracy"), label="train accuracy", **line_style(0))
  for i, (key, label, marker) in enumerate(
      (("eval_accuracy", "held-out (greedy)", "o"),
       ("eval_sampled_accuracy", "held-out (sampled)", "s")), start=1):
    points = [e for e in eval_history if key in e]   # greedy eval can be off
    if points:
      axes[4].plot([e["step"] for e in points], [e[key] for e in points], marker=marker,
                   ms=5, label=label, **line_style(i))
  axes[4].set_ylabel("accuracy")

  for part in ("rollout", "learner", "total"):
    axes[5].plot(steps, col(f"time_{part}_s"), label=part)
  axes[5].set_ylabel("seconds / step")
  axes[5].set_xlabel("RL step")
  for i in (0, 1, 2, 4, 5):
    outside_legend(axes[i])
  if title:
    fig.suptitle(title)
  with run_path(path).open("wb") as f:         # local or gs://
    _save(fig, f, format="png")


def plot_simulation(result: dict[str, Any], path: str | os.PathLike) -> None:
  """PNG of SAGC's rolling share of each G, lambda and posterior means, and every arm's
  running straggler rate."""
  plt = _pyplot()

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
    axes[3].plot(steps, running_mean(arm["straggler_rate"]), label=name, **line_style(i))
  axes[3].axhline(delta, color="k", ls="--", lw=0.8, label="delta")
  axes[3].set_ylabel("running straggler rate")
  axes[3].set_xlabel("step")
  for ax in axes:
    outside_legend(ax)
  _save(fig, path, dpi=110)


def plot_comparison(arms: Sequence[dict[str, Any]], workdir: Path,
                    machine: dict[str, Any] | None = None) -> list[Path]:
  """Writes the four comparison plots; returns their paths."""
  from sagc_jax.experiments.arms import split_run_name

  plt = _pyplot()
  paths = []
  by_arm: dict[str, list[dict[str, Any]]] = {}
  for arm in arms:
    by_arm.setdefault(split_run_name(arm["name"])[0], []).append(arm)
  # G, lambda and the posterior are per-run traces: the first seed of each SAGC arm.
  sagc = [runs[0] for runs in by_arm.values() if runs[0]["config"]["controller"]["kind"] == "sagc"]

  # One G panel per SAGC arm: GRPO's and DAPO's G traces often coincide, and on one
  # panel DAPO's hid GRPO's. Lambda shares a panel, in line styles that keep both visible.
  fig, axes = plt.subplots(len(sagc) + 1, 1, figsize=(10, 2.2 * len(sagc) + 3), sharex=True,
                           squeeze=False)
  axes = axes[:, 0]
  for i, arm in enumerate(sagc):
    steps = [r["step"] for r in arm["rows"]]
    axes[i].step(steps, [r["g"] for r in arm["rows"]], where="post", color=f"C{i}",
                 label=arm["name"])
    axes[i].set_ylabel("G")
    axes[-1].plot(steps, [r["lambda"] for r in arm["rows"]], color=f"C{i}", label=arm["name"],
                  **line_style(i))
  axes[-1].set_ylabel("lambda")
  axes[-1].set_xlabel("step")
  for ax in axes:
    outside_legend(ax)
  paths.append(_save(fig, workdir / "g_lambda.png", machine))

  def algorithm(name):
    return (by_arm[name][0]["config"].get("learner") or {}).get("algorithm") or \
        name.split("_")[0]

  # One panel per algorithm (its arms of one G would overlap the other's); each variant
  # (static G, SAGC) keeps its colour and line style in every panel.
  algorithms = list(dict.fromkeys(algorithm(n) for n in by_arm))
  variants = list(dict.fromkeys(n.removeprefix(algorithm(n) + "_") for n in by_arm))

  def panels(ylabel):
    fig, axes = plt.subplots(len(algorithms), 1, figsize=(10, 3.2 * len(algorithms) + 0.6),
                             sharex=True, sharey=True, squeeze=False)
    for alg, ax in zip(algorithms, axes[:, 0]):
      ax.set_title(alg, fontsize=9)
      ax.set_ylabel(ylabel)
    return fig, dict(zip(algorithms, axes[:, 0]))

  def band(axes, name, x, curves, low=-np.inf, high=np.inf):
    """``_mean_band`` of arm ``name`` on its algorithm's panel, in its variant's style."""
    k = variants.index(name.removeprefix(algorithm(name) + "_"))
    _mean_band(axes[algorithm(name)], x, curves, k, name, low, high)

  events = sorted({a["config"]["controller"].get("event", "group") for a in arms})
  unit = {"group": "straggling groups / groups", "step": "steps with a straggler / steps"}
  fig, axes = panels("running straggler rate\n(" + "; ".join(unit[e] for e in events) + ")")
  for name, runs in by_arm.items():
    curves = [running_mean([r["straggler_rate"] for r in run["rows"]]) for run in runs]
    # A rate: its band is clipped to [0, 1].
    band(axes, name, np.arange(1, max(len(c) for c in curves) + 1), curves, 0.0, 1.0)
  for ax in axes.values():
    for delta in sorted({a["config"]["controller"]["delta"] for a in arms}):
      ax.axhline(delta, color="k", ls="--", lw=0.8, label=f"delta = {delta}")
    ax.set_ylim(-0.02, None)
    outside_legend(ax, fontsize=7)
  ax.set_xlabel("step")
  paths.append(_save(fig, workdir / "stragglers.png", machine))

  fig, axes = panels("train reward (5-step mean)")
  for name, runs in by_arm.items():
    n = min(len(run["rows"]) for run in runs)
    clock = np.mean([np.cumsum([r["time_total_s"] for r in run["rows"][:n]]) for run in runs],
                    axis=0)
    rewards = [trailing_mean([r["reward_mean"] for r in run["rows"][:n]]) for run in runs]
    # Not clipped: a custom reward term (a penalty) can make the reward negative.
    band(axes, name, clock[n - len(rewards[0]):], rewards)
  for ax in axes.values():
    outside_legend(ax, fontsize=7)
  ax.set_xlabel("wall-clock s (cumulative step time, mean over seeds)")
  paths.append(_save(fig, workdir / "reward_vs_time.png", machine))

  fig, axes = plt.subplots(max(len(sagc), 1), 1, figsize=(10, 3 * max(len(sagc), 1)),
                           squeeze=False)
  for ax, arm in zip(axes[:, 0], sagc):
    keys = sorted((k for k in arm["rows"][0] if k.startswith("p_mean/G")),
                  key=lambda k: int(k.split("G")[-1]))
    for i, key in enumerate(keys):
      ax.plot([r["step"] for r in arm["rows"]], [r[key] for r in arm["rows"]],
              label=key.split("/")[1], **line_style(i))
    ax.set_title(arm["name"], fontsize=9)
    ax.set_ylabel("posterior mean p(G)")
    outside_legend(ax)
  paths.append(_save(fig, workdir / "posterior.png", machine))
  return paths


def plot_learning(rows: Sequence[dict[str, Any]], horizon: float, workdir: Path,
                  machine: dict[str, Any] | None = None) -> Path:
  """``learning.png``: held-out sampled accuracy against cumulative step time (left,
  the horizon H marked) and against steps (right), one row of panels per algorithm;
  per arm the mean over seeds of the curves linear between evaluations, with a 95%
  t band (``per_hour.learning_rows``)."""
  plt = _pyplot()
  runs: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = {}
  for row in rows:
    runs.setdefault((row["algorithm"], row["arm"]), {}).setdefault(
        int(row["seed"]), []).append(row)
  algorithms = list(dict.fromkeys(a for a, _ in runs))
  variants = list(dict.fromkeys(arm.removeprefix(a + "_") for a, arm in runs))
  fig, axes = plt.subplots(len(algorithms), 2, figsize=(12, 3.4 * len(algorithms) + 0.6),
                           sharey=True, squeeze=False)
  for (algorithm, arm), seeds in runs.items():
    k = variants.index(arm.removeprefix(algorithm + "_"))
    row_axes = axes[algorithms.index(algorithm)]
    for ax, key in zip(row_axes, ("step_time_s", "step")):
      curves = [sorted(points, key=lambda r: r[key]) for points in seeds.values()]
      end = min(c[-1][key] for c in curves)
      grid = np.linspace(0.0, end, 100)
      ys = [np.interp(grid, [r[key] for r in c], [r["sampled_accuracy"] for r in c])
            for c in curves]
      _mean_band(ax, grid, ys, k, arm, 0.0, 1.0)
    row_axes[0].set_title(f"{algorithm}: against step time", fontsize=9)
    row_axes[1].set_title(f"{algorithm}: against steps", fontsize=9)
    row_axes[0].set_ylabel("held-out sampled accuracy")
  for ax in axes[:, 0]:
    ax.axvline(horizon, color="k", ls="--", lw=0.8, label=f"H = {horizon:.0f} s")
  for ax in axes[:, 1]:
    outside_legend(ax, fontsize=7)
  axes[-1, 0].set_xlabel("cumulative step time s")
  axes[-1, 1].set_xlabel("step")
  return _save(fig, workdir / "learning.png", machine)


def plot_calibration(report: dict[str, Any], path: str | os.PathLike) -> None:
  """PNG of a calibration: the group straggler probability per G against tau (the run's
  and any recommended tau marked), and each replayed arm's step time against the
  largest static G's, with its 95% interval over replicates."""
  plt = _pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
  curve = report["tau_curve"]
  for i, g in enumerate(report["candidates"]):
    left.plot(curve["tau"], curve[f"G{g}"], label=f"G={g}", **line_style(i))
  left.axvline(report["tau"], color="k", ls="--", lw=0.8, label=f"run's tau {report['tau']:g}")
  rec = report["recommended"]
  if "tau" in rec:
    left.axvline(rec["tau"], color="tab:red", ls=":", lw=1.2,
                 label=f"recommended tau {rec['tau']:g}")
  left.set_xlabel("tau")
  left.set_ylabel("P(a group straggles)")
  left.set_ylim(-0.02, 1.02)
  outside_legend(left)
  replay = report["replay"]
  vs = f"step_s_vs_{replay['reference']}"
  arms = sorted(replay["arms"].items(), key=lambda kv: kv[1][vs])
  y = np.arange(len(arms))
  mean = np.array([a[vs] for _, a in arms])
  err = np.array([[a[vs] - a[vs + "_low"], a[vs + "_high"] - a[vs]] for _, a in arms]).T
  right.errorbar(mean, y, xerr=err, fmt="o", ms=3, color="tab:blue")
  right.axvline(1.0, color="k", lw=0.8)
  right.set_yticks(y, [name for name, _ in arms], fontsize=6)
  right.set_xlabel(f"step time / {replay['reference']}'s "
                   f"({report['cost_model']}, {report['algorithm']})")
  fig.tight_layout()
  _save(fig, path, dpi=110)
