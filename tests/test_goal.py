"""experiments.goal: a primary arm's pre-stated goal on a hand-made per_hour report."""

import pytest

from sagc_jax.experiments.goal import check_goal, goal_markdown


def _pair(first, second, mean, half, p):
  return {"first": first, "second": second,
          "mean_accuracy_over_h": {"mean": mean, "half_width": half, "n": 8, "p": p}}


def test_the_goal_on_a_hand_made_report():
  arms = [{"arm": f"grpo_{a}", "algorithm": "grpo", "mean_accuracy_over_h": [m, 0.01, 8]}
          for a, m in (("new", 0.50), ("static4", 0.48), ("static8", 0.45), ("sagc", 0.40))]
  pairs = [_pair("grpo_new", "grpo_static4", 0.02, 0.04, 0.04),
           # stored in the other order: the check flips it to new - static8 = +0.05
           _pair("grpo_static8", "grpo_new", -0.05, 0.02, 0.001),
           _pair("grpo_sagc", "grpo_new", -0.10, 0.03, 0.0001)]
  report = {"arms": arms, "pairs": {"grpo": {"pairs": pairs}}}
  result = check_goal(report, primary="new", family=["static4", "static8"], also=["sagc"])
  grpo = result["clocks"]["wall"]["grpo"]
  assert grpo["best"] == "static4"
  assert grpo["family"]["static8"]["mean"] == pytest.approx(0.05)
  # Holm over two: 0.001 x 2, then max(0.002, 0.04 x 1).
  assert [grpo["family"][a]["p_holm"] for a in ("static4", "static8")] == pytest.approx(
      [0.04, 0.002])
  assert grpo["not_worse"]                        # 0.02 - 0.04 = -0.02 >= -0.03
  assert grpo["better_than_every"]
  assert grpo["beats"] == {"sagc": True}
  pairs[0]["mean_accuracy_over_h"].update(half_width=0.06, p=0.3)   # now -0.04: worse
  result = check_goal(report, primary="new", family=["static4", "static8"], also=["sagc"])
  grpo = result["clocks"]["wall"]["grpo"]
  assert not grpo["not_worse"] and not grpo["better_than_every"]
  assert "| grpo | static4 | no | no | yes |" in goal_markdown(result)
