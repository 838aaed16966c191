"""The statistics every report shares (``base/stats.py``), checked against scipy as an
independent reference and against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sp

from sagc_jax.base import stats


@pytest.mark.parametrize("n", [2, 5, 31, 32, 40, 100])
def test_mean_ci_is_a_student_t_interval_at_every_n(n):
  x = np.random.default_rng(n).normal(1.0, 0.3, n)
  t = round(float(sp.t.ppf(0.975, n - 1)), 3)
  mean, half, got_n = stats.mean_ci(list(x))
  assert got_n == n and mean == pytest.approx(x.mean())
  assert half == pytest.approx(t * x.std(ddof=1) / math.sqrt(n), rel=1e-12)
  if n == 40:      # beyond 31 values no longer the normal's 1.96
    assert half != pytest.approx(1.96 * x.std(ddof=1) / math.sqrt(n), rel=1e-3)


def test_mean_ci_keeps_only_finite_values():
  # 1 and 3: sd sqrt(2), half-width t_{0.975,1} * sqrt(2) / sqrt(2) = 12.706
  assert stats.mean_ci([1.0, None, float("nan"), float("inf"), 3.0]) == (2.0, 12.706, 2)
  mean, half, n = stats.mean_ci([0.5, float("nan")])
  assert (mean, n) == (0.5, 1) and math.isnan(half)
  assert all(math.isnan(v) for v in stats.mean_ci([None, float("nan")])[:2])
  assert stats.mean_ci([])[2] == 0


def test_paired_test_p_value_matches_scipy():
  rng = np.random.default_rng(3)
  for n in (2, 3, 8, 10):
    d = rng.normal(0.05, 0.1, n)
    test = stats.paired_test(list(d))
    assert test["n"] == n and test["mean"] == pytest.approx(d.mean())
    assert test["half_width"] == stats.mean_ci(d)[1]
    assert test["p"] == pytest.approx(sp.ttest_1samp(d, 0.0).pvalue, rel=1e-6)
  assert math.isnan(stats.paired_test([0.1, float("nan")])["p"])     # one finite value
  assert stats.paired_test([0.25] * 3)["p"] == 0.0                   # zero spread
  assert stats.paired_test([0.0] * 3)["p"] == 1.0


def test_holm_step_down_by_hand():
  # sorted 0.01, 0.03, 0.04, 0.5 -> 4 * 0.01 = 0.04, 3 * 0.03 = 0.09,
  # 2 * 0.04 = 0.08 raised to 0.09 (monotone), 1 * 0.5 = 0.5
  assert stats.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
  # nan is not counted in the family and stays nan; adjusted p is capped at 1
  adjusted = stats.holm([0.4, float("nan"), 0.02])
  assert adjusted[0] == pytest.approx(0.4) and adjusted[2] == pytest.approx(0.04)
  assert math.isnan(adjusted[1])
  assert stats.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_the_verdict_rule_by_hand():
  assert stats.interval_side((0.5, 0.2, 3), 0.0) == "above"
  assert stats.interval_side((-0.5, 0.2, 3), 0.0) == "below"
  assert stats.interval_side((0.1, 0.2, 3), 0.0) is None
  assert stats.interval_side((0.2, 0.2, 3), 0.0) is None          # touching is not excluding
  assert stats.interval_side((0.9, 0.05, 3), 1.0) == "below"
  assert stats.interval_side((0.5, float("nan"), 1), 0.0) is None  # no interval
  assert (stats.too_few((0.5, float("nan"), 1)), stats.too_few((math.nan,) * 2 + (0,))) == (
      "?", "n/a")
  assert stats.too_few((0.5, 0.2, 2)) is None
  verdicts = [stats.paired_verdict(s, 0.0, better) for s, better in (
      ((0.5, 0.2, 3), "above"), ((0.5, 0.2, 3), "below"), ((0.1, 0.2, 3), "above"),
      ((-0.5, 0.2, 3), None), ((0.5, math.nan, 1), "above"))]
  assert verdicts == ["better", "worse", "not resolved", "lower", "?"]


def _t_interval(values):
  """Mean and 95% Student-t half-width, re-derived here (t quantiles for n = 2, 3)."""
  x = np.asarray(values, float)
  t = {2: 12.706, 3: 4.303}[x.size]
  return x.mean(), t * x.std(ddof=1) / np.sqrt(x.size)


def test_paired_markdown_pairs_seeds_and_gives_a_verdict_per_side():
  rows = [{"arm": "base", "seed": s, "acc": a, "time": t}
          for s, a, t in ((0, 0.50, 100.0), (1, 0.55, 110.0), (2, 0.60, 90.0))]
  rows += [{"arm": "up", "seed": s, "acc": a, "time": t}
           for s, a, t in ((0, 0.60, 90.0), (1, 0.66, 100.0), (2, 0.72, 80.0))]
  rows += [{"arm": "partial", "seed": s, "acc": a, "time": t}     # seed 2 missing, 1 nan
           for s, a, t in ((0, 0.51, float("nan")), (1, 0.54, 120.0))]
  quantities = [stats.Paired("acc", "accuracy, arm - base", "difference", "above"),
                stats.Paired("time", "time, arm / base", "ratio", "below"),
                stats.Paired("acc", "accuracy, no side", "difference", None)]
  table = stats.paired_markdown(rows, [("up", "up", "base"), ("partial", "partial", "base")],
                                quantities)
  lines = table.splitlines()
  assert lines[0] == "| quantity | up | verdict | partial | verdict |"
  mean, half = _t_interval([0.10, 0.11, 0.12])
  assert lines[2].startswith(f"| accuracy, arm - base | {mean:+.3f} ± {half:.3f} | better |")
  mean2, half2 = _t_interval([0.01, -0.01])
  assert lines[2].endswith(f"| {mean2:+.3f} ± {half2:.3f} (2 of 3 seeds) | not resolved |")
  mean, half = _t_interval([90 / 100, 100 / 110, 80 / 90])
  assert f"| time, arm / base | {mean:.3f} ± {half:.3f} | better |" in lines[3]
  assert lines[3].endswith(f"| {120 / 110:.3f} (1 of 3 seeds) | ? |")   # the nan seed left out
  assert "| higher |" in lines[4]
  worse = stats.paired_markdown(rows, [("base", "base", "up")], quantities[:1])
  assert worse.splitlines()[2].endswith("| worse |")
  assert stats.paired_markdown(rows, [("x", "missing", "base")], quantities[:1]) \
      .splitlines()[2] == "| accuracy, arm - base | – | n/a |"


def test_geometric_ratio_of_the_inverse_pair_is_the_inverse():
  ratios = [1.5, 2.0, 0.8, 1.25]
  there, back = stats.geometric_ratio(ratios), stats.geometric_ratio([1 / r for r in ratios])
  assert there["ratio"] == pytest.approx(math.prod(ratios) ** (1 / 4))
  assert there["n"] == back["n"] == 4
  assert back["ratio"] == pytest.approx(1 / there["ratio"])
  assert (back["low"], back["high"]) == (pytest.approx(1 / there["high"]),
                                         pytest.approx(1 / there["low"]))
  # The interval is the t-interval of the log ratios, exponentiated.
  mean, half, _ = stats.mean_ci(np.log(ratios))
  assert there["low"] == pytest.approx(math.exp(mean - half))
  assert stats.geometric_ratio([0.0, float("nan"), 2.0])["n"] == 1      # positive, finite


def test_equivalence_test_is_two_one_sided_t_tests():
  rng = np.random.default_rng(7)
  for margin, shift in ((0.05, 0.0), (0.05, 0.04), (0.02, 0.0)):
    d = rng.normal(shift, 0.03, 8)
    got = stats.equivalence_test(list(d), margin)
    lower = sp.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = sp.ttest_1samp(d, margin, alternative="less").pvalue
    assert got["p"] == pytest.approx(max(lower, upper), rel=1e-9)
    # The 90% interval lies inside the margin exactly when p < 0.05.
    inside = -margin < got["low"] and got["high"] < margin
    assert inside == (got["p"] < 0.05)
  assert stats.equivalence_test([0.01] * 3, 0.02)["p"] == 0.0
  assert math.isnan(stats.equivalence_test([0.01], 0.02)["p"])


@pytest.mark.parametrize("p_holm, tost_p, verdict", [
    (0.001, 0.9, "resolved"), (0.047, 0.9, "borderline"), (0.01, 0.0, "borderline"),
    (0.2, 0.01, "equivalent"), (0.2, 0.2, "not resolved"), (float("nan"), 0.2, "not resolved")])
def test_pair_verdict_marks_borderline_and_says_equivalent_only_within_a_margin(
    p_holm, tost_p, verdict):
  assert stats.pair_verdict(p_holm, {"p": tost_p, "n": 8}) == verdict
  # Equivalence needs three values, and reads the family-adjusted TOST p where given.
  assert stats.pair_verdict(0.2, {"p": 0.01, "n": 2}) == "not resolved"
  assert stats.pair_verdict(0.2, {"p": 0.01, "p_holm": 0.06, "n": 8}) == "not resolved"
