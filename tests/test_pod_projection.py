"""The pod projection's table (``experiments.pod_projection``), rebuilt from a hand-made
report folder: ratios and orders computed here by hand."""

import json

from sagc_jax.experiments.pod_projection import projection_markdown


def _arm(step_s, rollout_s):
  return {"step_s": step_s, "rollout_s": rollout_s}


def test_the_table_gives_each_step_part_s_ratio_and_the_static_order(tmp_path):
  # 20 steps. G4: 160 s of rollout (8 a step) in 10 s steps, so 2 s of learner.
  # G16: 600 s of rollout (30 a step) in 36 s steps, so 6 s of learner.
  # Ratios G16 / G4: rollout 30 / 8 = 3.75, learner 6 / 2 = 3.00.
  # Per measure, (mean, 95% half-width) of each arm per hour, best first. Intervals
  # that overlap make a "≈": utility's G8 [9, 11] and G4 [8.5, 10.5]; informative_rows'
  # G4 [65, 75] and G8 [62, 66].
  values = {
      "utility": {"sagc_tau2_delta0.1": (12, 1), "static_G8": (10, 1), "static_G4": (9.5, 1),
                  "static_G16": (5, 1)},
      "informative_groups": {"static_G4": (30, 2), "static_G8": (25, 2),
                             "sagc_tau2_delta0.1": (24, 2), "static_G16": (20, 2)},
      "informative_rows": {"static_G16": (90, 5), "sagc_tau2_delta0.1": (80, 5),
                           "static_G4": (70, 5), "static_G8": (64, 2)},
      "advantage_mass": {"static_G16": (9, 1), "static_G8": (6, 1), "static_G4": (3, 1),
                         "sagc_tau2_delta0.1": (1, 1)}}
  report = {
      "projection": {"trace": "configs/traces/t_before.jsonl", "cost": "configs/aot/pod.json",
                     "budget": "hold_prompts:128"},
      "rollout": {"mode": "hold_prompts", "prompts_per_step": 128, "rollouts_per_step": 512},
      "algorithm": "grpo", "validated": ["utility"],
      "replay": {"steps": 20, "replicates": 3,
                 "arms": {"static_G4": _arm(10.0, 160.0), "static_G8": _arm(20.0, 300.0),
                          "static_G16": _arm(36.0, 600.0)}},
      "signals": {m: {"ranking": list(arms), "arms": {a: {"mean": mean, "half_width": half}
                                                      for a, (mean, half) in arms.items()}}
                  for m, arms in values.items()}}
  (tmp_path / "combo").mkdir()
  (tmp_path / "combo" / "report.json").write_text(json.dumps(report))
  table = projection_markdown(tmp_path)
  row = next(line for line in table.splitlines() if line.startswith("| t_before"))
  assert row == ("| t_before | pod | hold_prompts (128 prompts) | 8.0 / 30.0 (x3.75) | "
                 "2.0 / 6.0 (x3.00) | 8 ≈ 4 > 16 | 4 > 8 > 16 | 16 > 4 ≈ 8 | 16 > 8 > 4 |")
  assert "3 x 20, grpo" in table and "(configs/signal_checks.json): utility." in table
