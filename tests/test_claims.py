"""The paper's claims table: paired per-seed statistics and verdicts on rows whose
answers are known by construction (re-derived here with numpy, t_{0.975,2} = 4.303)."""

from __future__ import annotations

import numpy as np
import pytest

from sagc_jax.experiments import claims

T2 = 4.303     # Student-t 97.5% quantile, 2 degrees of freedom (3 seeds)


def run_row(algorithm, controller, g, seed, **values):
  return {"algorithm": algorithm, "controller": controller,
          "static_g": g if controller == "static" else "", "seed": seed, **values}


def rows_for(algorithm, sagc, static4, static16):
  rows = []
  for seed in range(3):
    rows.append(run_row(algorithm, "sagc", None, seed, **{k: v[seed] for k, v in sagc.items()}))
    rows.append(run_row(algorithm, "static", 4, seed, **{k: v[seed] for k, v in static4.items()}))
    rows.append(run_row(algorithm, "static", 16, seed,
                        **{k: v[seed] for k, v in static16.items()}))
  return rows


SAGC = dict(step_straggler_rate=[0.40, 0.50, 0.45], group_straggler_rate=[0.30, 0.20, 0.40],
            seconds_per_step=[0.80, 0.82, 0.78], final_reward=[0.50, 0.52, 0.48],
            eval_sampled_accuracy_end=[0.30, 0.31, 0.29], p_largest_end=[0.9, 0.8, 0.85],
            p_smallest_end=[0.1, 0.2, 0.15], response_len_mean=[30.0, 31.0, 29.0],
            mean_sampled_accuracy_over_h=[0.30, 0.31, 0.29])
STATIC16 = dict(step_straggler_rate=[0.99, 0.98, 1.0], group_straggler_rate=[0.10, 0.50, 0.20],
                seconds_per_step=[1.00, 1.04, 0.96], final_reward=[0.51, 0.49, 0.50],
                eval_sampled_accuracy_end=[0.50, 0.52, 0.48], p_largest_end=[0.5] * 3,
                p_smallest_end=[0.5] * 3, response_len_mean=[20.0, 21.0, 19.0],
                mean_sampled_accuracy_over_h=[0.40, 0.42, 0.38])
STATIC4 = dict(STATIC16, seconds_per_step=[0.40, 0.40, 0.40], final_reward=[0.40, 0.41, 0.39],
               eval_sampled_accuracy_end=[0.20, 0.21, 0.19],
               mean_sampled_accuracy_over_h=[0.20, 0.36, 0.29])


def by_key(entries):
  return {e["claim"].key: e for e in entries}


def test_each_claim_is_a_seed_paired_statistic_with_the_right_verdict():
  table = claims.claims_table(rows_for("grpo", SAGC, STATIC4, STATIC16))
  got = by_key(table["grpo"])
  # step rate: SAGC - static16 per seed = -0.59, -0.48, -0.55 -> clearly below 0
  diff = np.array([0.40, 0.50, 0.45]) - np.array([0.99, 0.98, 1.0])
  mean, half, n = got["step_straggler_rate"]["stat"]
  assert n == 3 and mean == pytest.approx(diff.mean())
  assert half == pytest.approx(T2 * diff.std(ddof=1) / np.sqrt(3))
  assert got["step_straggler_rate"]["verdict"] == "✓"
  # group rate: differences +0.2, -0.3, +0.2: the interval straddles 0 -> not shown
  assert got["group_straggler_rate"]["verdict"] == "✗"
  # step time: per-seed speedup static16 / SAGC = 1.25, 1.268, 1.231 -> above 1
  speedup = np.array([1.00, 1.04, 0.96]) / np.array([0.80, 0.82, 0.78])
  assert got["seconds_per_step"]["stat"][0] == pytest.approx(speedup.mean())
  assert got["seconds_per_step"]["verdict"] == "✓"
  # reward: best static is G=16 (0.50 ± 4.303 * 0.01 / sqrt 3); SAGC 0.50 is within it
  assert got["final_reward"]["verdict"] == "✓" and "G=16" in got["final_reward"]["detail"]
  # accuracy: SAGC 0.30 is far below the best static's 0.50 ± 0.05
  assert got["eval_sampled_accuracy_end"]["verdict"] == "✗"
  assert got["posterior_gap"]["stat"][0] == pytest.approx(0.7)
  assert got["posterior_gap"]["verdict"] == "✓"
  # equal wall-clock accuracy, against every static G: 0.10 below static 16 in every
  # seed -> ✗; against static 4 the differences +0.10, -0.05, 0.00 -> not shown lower, ✓
  per_hour = {e["claim"].against: e for e in table["grpo"]
              if e["claim"].key == "mean_sampled_accuracy_over_h"}
  assert sorted(per_hour) == [4, 16]
  assert per_hour[16]["stat"][0] == pytest.approx(-0.10)
  assert per_hour[16]["verdict"] == "✗" and per_hour[16]["detail"] == "vs static G=16"
  diff = np.array([0.10, -0.05, 0.00])
  assert per_hour[4]["stat"][0] == pytest.approx(diff.mean())
  assert per_hour[4]["stat"][1] == pytest.approx(T2 * diff.std(ddof=1) / np.sqrt(3))
  assert per_hour[4]["verdict"] == "✓"
  # length: SAGC is 10 tokens longer in every seed -> "shorter or equal" fails
  assert got["response_len_mean"]["stat"][0] == pytest.approx(10.0)
  assert got["response_len_mean"]["verdict"] == "✗"


def test_verdicts_need_two_seeds_and_missing_values_are_not_applicable():
  one_seed = [r for r in rows_for("sim", SAGC, STATIC4, STATIC16) if r["seed"] == 0]
  got = by_key(claims.claims_table(one_seed)["sim"])
  assert got["step_straggler_rate"]["verdict"] == "?"
  no_reward = [{k: v for k, v in r.items() if k not in ("final_reward",
                                                       "eval_sampled_accuracy_end")}
               for r in rows_for("sim", SAGC, STATIC4, STATIC16)]
  got = by_key(claims.claims_table(no_reward)["sim"])
  assert got["final_reward"]["verdict"] == "n/a"
  assert got["step_straggler_rate"]["verdict"] == "✓"


def test_markdown_has_one_row_per_claim_and_a_column_pair_per_group():
  rows = rows_for("grpo", SAGC, STATIC4, STATIC16) + rows_for("dapo", SAGC, STATIC4, STATIC16)
  text = claims.claims_markdown(rows)
  lines = text.splitlines()
  assert lines[0] == "| claim | grpo, 3 seeds | ✓/✗ | dapo, 3 seeds | ✓/✗ |"
  assert len(lines) == 2 + len(claims.CLAIMS) + 2      # + equal wall-clock vs G = 4, 16
  assert "not below static G=4 |" in text and "not below static G=16 |" in text
  assert "1.25 ± " in text and "x (vs static G=16)" in text


def test_adaptation_orders_workloads_by_straggler_rate_and_pairs_seeds():
  def workload(rate, sagc_g):
    rows = []
    for seed, g in enumerate(sagc_g):
      rows.append(run_row("grpo", "static", 16, seed, group_straggler_rate=rate, mean_g=16.0))
      rows.append(run_row("grpo", "sagc", None, seed, group_straggler_rate=rate / 2,
                          mean_g=g))
    return rows
  # The wild workload straggles more at G=16; SAGC should use smaller G there.
  text = claims.adaptation_table({"wild": workload(0.8, [6.0, 7.0, 8.0]),
                                  "calm": workload(0.3, [14.0, 13.0, 15.0])})
  line = text.splitlines()[2]
  assert line.startswith("| grpo | calm: 0.300, G 14.00; wild: 0.800, G 7.00 |")
  diff = np.array([14.0, 13.0, 15.0]) - np.array([6.0, 7.0, 8.0])
  assert f"{diff.mean():+.2f} ± {T2 * diff.std(ddof=1) / np.sqrt(3):.2f}" in line
  assert line.endswith("| ✓ |")
  # Had SAGC not adapted (the same G in both), the claim fails.
  flat = claims.adaptation_table({"wild": workload(0.8, [10.0, 11.0, 12.0]),
                                  "calm": workload(0.3, [11.0, 10.0, 12.0])})
  assert flat.splitlines()[2].endswith("| ✗ |")
  with pytest.raises(ValueError, match="exactly two workloads"):
    claims.adaptation_table({"one": workload(0.5, [8.0])})
