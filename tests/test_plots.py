"""The plots: bands of a rate stay in [0, 1], the simulator's rolling share of each G,
and every plot function writes a PNG in which each line is drawn and no legend covers
the data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sagc_jax.experiments.plots import (plot_comparison, plot_run, plot_simulation, rate_band,
                                        reward_terms, rolling_share)

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = (4, 8, 16)


@pytest.fixture
def figures(monkeypatch):
  """The figures the plot functions close, kept open to be inspected."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  kept = []
  monkeypatch.setattr(plt, "close", kept.append)
  yield kept
  monkeypatch.undo()
  for fig in kept:
    plt.close(fig)


def assert_legends_outside_the_data(fig):
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  for ax in fig.axes:
    legend = ax.get_legend()
    if legend is not None:
      assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def history(steps=30, seed=0):
  rng = np.random.default_rng(seed)
  rows = []
  for s in range(1, steps + 1):
    acc = float(np.clip(0.2 + 0.02 * s + 0.05 * rng.standard_normal(), 0, 1))
    rows.append({"step": s, "g": CANDIDATES[s // 7 % 3], "lambda": 1 + np.sin(s / 5),
                 "group_straggler_rate": 0.3 * rng.random(), "step_straggler": float(s % 4 == 0),
                 "straggler_rate": 0.3 * rng.random(),
                 "reward_mean": acc, "accuracy": acc, "reward/math_verify": acc,
                 "reward/length_penalty": -0.1, "reward/errors": 2.0,
                 "time_rollout_s": 3.0, "time_learner_s": 1.0, "time_total_s": 4.5,
                 **{f"p_mean/G{g}": 0.01 * g for g in CANDIDATES}})
  return rows


def test_rate_band_is_clipped_to_zero_one():
  low, high = rate_band([0.02, 0.5, 0.98, 0.3], [0.2, 0.1, 0.3, float("nan")])
  np.testing.assert_allclose(low[:3], [0.0, 0.4, 0.68])
  np.testing.assert_allclose(high[:3], [0.22, 0.6, 1.0])
  assert np.isnan(low[3]) and np.isnan(high[3])        # one seed: no band
  low, high = rate_band([-1.0, 2.0], [0.5, 0.5], -np.inf, np.inf)     # unclipped
  np.testing.assert_allclose([low, high], [[-1.5, 1.5], [-0.5, 2.5]])


def test_rolling_share_is_a_share_of_the_last_window_steps():
  g = [4, 4, 8, 16, 16, 16, 4]
  share = rolling_share(g, CANDIDATES, window=3)
  assert share.shape == (3, len(g))
  assert ((share >= 0) & (share <= 1)).all()
  np.testing.assert_allclose(share.sum(axis=0), 1.0)
  np.testing.assert_allclose(share[:, 0], [1, 0, 0])          # one step so far
  np.testing.assert_allclose(share[:, 2], [2 / 3, 1 / 3, 0])
  np.testing.assert_allclose(share[:, 6], [1 / 3, 0, 2 / 3])  # steps 4..6: 16, 16, 4
  np.testing.assert_allclose(rolling_share(g, CANDIDATES, window=1)[2], np.equal(g, 16))
  long = np.random.default_rng(0).choice(CANDIDATES, 1000)
  np.testing.assert_allclose(rolling_share(long, CANDIDATES).sum(axis=0), 1.0)
  assert rolling_share([4, 2], CANDIDATES, window=2).sum(axis=0).tolist() == [1.0, 0.5]
  with pytest.raises(ValueError, match="window=0"):
    rolling_share(g, CANDIDATES, window=0)


def test_reward_terms_leave_out_the_error_count():
  assert reward_terms(history(3)) == ["reward/math_verify", "reward/length_penalty"]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy_eval", "sampled_eval_only"])
def test_plot_run_draws_each_reward_term_and_both_reward_and_accuracy(tmp_path, figures,
                                                                       greedy):
  evals = [{"step": s, "eval_sampled_accuracy": 0.3 + 0.01 * s,
            **({"eval_accuracy": 0.35} if greedy else {})} for s in (0, 15, 30)]
  plot_run(history(), evals, tmp_path / "run.png", title="t")
  assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
  (fig,) = figures
  labels = {ax.get_ylabel(): [line.get_label() for line in ax.get_lines()] for ax in fig.axes}
  assert labels["reward"] == ["train reward", "term math_verify", "term length_penalty"]
  assert labels["accuracy"][0] == "train accuracy"
  assert ("held-out (greedy)" in labels["accuracy"]) == greedy
  assert "held-out (sampled)" in labels["accuracy"]
  # Reward and accuracy coincide here (a 0/1 reward): they sit on separate panels, and
  # a term equal to the reward is drawn in another line style on top of it.
  reward_ax = next(ax for ax in fig.axes if ax.get_ylabel() == "reward")
  first, second = reward_ax.get_lines()[:2]
  assert first.get_linestyle() != second.get_linestyle()
  assert second.get_zorder() > first.get_zorder()
  assert_legends_outside_the_data(fig)


def comparison_arms():
  arms = []
  for algorithm in ("grpo", "dapo"):
    for seed in range(3):
      for variant, kind in (("sagc", "sagc"), ("static4", "static"), ("static16", "static")):
        rows = history(20, seed + 10 * (algorithm == "dapo"))
        if variant == "static4":       # a rate near 0 with seed spread: the band would dip
          for r in rows:
            r["straggler_rate"] = 0.3 if r["step"] == 1 and seed == 0 else 0.0
        arms.append({"name": f"{algorithm}_{variant}_seed{seed}", "rows": rows,
                     "config": {"learner": {"algorithm": algorithm},
                                "controller": {"kind": kind, "delta": 0.2, "event": "group"}}})
  return arms


def test_plot_comparison_clips_rate_bands_and_separates_the_g_lines(tmp_path, figures):
  paths = plot_comparison(comparison_arms(), tmp_path)
  assert [p.name for p in paths] == ["g_lambda.png", "stragglers.png", "reward_vs_time.png",
                                     "posterior.png"]
  assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
  g_lambda, stragglers, _, _ = figures
  # One G panel per SAGC arm (their G lines coincide), then lambda for both.
  assert [[line.get_label() for line in ax.get_lines()] for ax in g_lambda.axes] == [
      ["grpo_sagc_seed0"], ["dapo_sagc_seed0"], ["grpo_sagc_seed0", "dapo_sagc_seed0"]]
  assert [ax.get_title() for ax in stragglers.axes] == ["grpo", "dapo"]
  bands = [c for ax in stragglers.axes for c in ax.collections]
  assert len(bands) == 6
  lows = []
  for band in bands:
    y = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert y.min() >= 0.0 and y.max() <= 1.0
    lows.append(y.min())
  assert min(lows) == 0.0            # static4's band (mean 0.1 +- 0.43 at step 1) was cut
  for fig in figures:
    assert_legends_outside_the_data(fig)


def test_plot_simulation_shows_a_rolling_share_of_each_g(tmp_path, figures):
  from sagc_jax.config import controller_settings
  from sagc_jax.replay.entry_points import simulate

  namespace = {}
  exec((REPO / "configs" / "simulate.py").read_text(), namespace)
  config = namespace["get_config"]()
  config.sim.steps = 120
  plot_simulation(simulate(config, controller_settings(config.controller)), tmp_path / "sim.png")
  assert (tmp_path / "sim.png").read_bytes()[:4] == b"\x89PNG"
  (fig,) = figures
  shares = np.array([line.get_ydata() for line in fig.axes[0].get_lines()])
  assert [line.get_label() for line in fig.axes[0].get_lines()] == ["G=4", "G=8", "G=16"]
  assert ((shares >= 0) & (shares <= 1)).all()
  np.testing.assert_allclose(shares.sum(axis=0), 1.0)
  assert_legends_outside_the_data(fig)
