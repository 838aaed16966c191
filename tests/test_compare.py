"""Comparison driver (arm matrix, run, skip, merge, report) and the analysis notebook."""

from __future__ import annotations

import csv
import json
import shutil
import os
import subprocess
import sys
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from sagc_jax.base import stats as tables
from sagc_jax.experiments import arms as arms_lib, compare
from sagc_jax.config import learner_config, preset, validate
from test_trainer import small_config

REPO = Path(__file__).resolve().parents[1]


def with_compare(config, algorithms):
  config.compare = ml_collections.ConfigDict(dict(algorithms=algorithms))
  return config


def test_arm_matrix_covers_every_static_g_and_sagc_per_algorithm():
  config = with_compare(preset("grpo", "sagc"), ("grpo", "dapo"))
  arms = arms_lib.arm_configs(config)
  assert sorted(arms) == sorted(f"{a}_{k}" for a in ("grpo", "dapo")
                                for k in ("static4", "static8", "static16", "sagc"))
  for name, arm in arms.items():
    validate(arm)
    assert "compare" not in arm
    assert arm.learner.algorithm == name.split("_")[0]
    assert arm.seed == config.seed                       # identical seeds / data order
    if "static" in name:
      assert arm.controller.kind == "static"
      assert arm.controller.static_g == int(name.split("static")[1])
    else:
      assert arm.controller.kind == "sagc"
  dapo, grpo = learner_config(arms["dapo_sagc"]), learner_config(arms["grpo_static4"])
  assert dapo.dynamic_sampling and dapo.kl_coef == 0 and dapo.clip_high == 0.28
  assert grpo.kl_coef > 0 and not grpo.dynamic_sampling


def test_a_time_budget_gives_every_arm_the_same_step_time_and_evaluation_points():
  config = with_compare(preset("grpo", "sagc"), ("grpo", "dapo"))
  config.train.steps = 300
  for name, arm in arms_lib.arm_configs(config).items():
    assert arm.train.time_budget_s == 0.0 and arm.train.eval_points == 0, name
  config.compare.update(dict(time_budget_s=30.0, eval_points=5, targets=(0.4, 0.6)))
  for name, arm in arms_lib.arm_configs(config).items():
    validate(arm)
    assert (arm.train.time_budget_s, arm.train.eval_points) == (30.0, 5), name
    assert arm.train.steps == 300 and arm.train.eval_every == 300     # the cap only
  assert arms_lib.compare_section(config).targets == (0.4, 0.6)
  for key, bad, match in (("time_budget_s", -1.0, "a number of seconds >= 0"),
                          ("time_budget_s", float("inf"), "a number of seconds >= 0"),
                          ("time_budget_s", float("nan"), "a number of seconds >= 0"),
                          ("eval_points", 0, "a positive int"),
                          ("seeds", 0, "a positive int"),
                          ("targets", (0.5, 1.5), r"accuracies in \(0, 1\]"),
                          ("targets", (0.5, 0.5), "repeats a target"),
                          ("algorithms", ("grpo", "ppo"), "distinct algorithms")):
    broken = config.copy_and_resolve_references()
    broken.compare[key] = bad
    with pytest.raises(ValueError, match=f"compare.{key}=.*{match}"):
      arms_lib.arm_configs(broken)


def test_an_unknown_compare_key_is_refused_by_name():
  config = with_compare(preset("grpo", "sagc"), ("grpo",))
  config.compare.time_budget = 30.0                     # for compare.time_budget_s
  with pytest.raises(ValueError, match=r"compare.time_budget is not a compare setting "
                                       r"\(allowed: .*time_budget_s"):
    arms_lib.run_configs(config)


def test_static_sizes_choose_the_static_arms():
  config = with_compare(preset("grpo", "sagc"), ("grpo",))
  config.compare.static_sizes = (4, 16)
  assert sorted(arms_lib.arm_configs(config)) == ["grpo_sagc", "grpo_static16", "grpo_static4"]
  for bad in ((4, 4), (1, 16), (4.0,)):
    config.compare.static_sizes = bad
    with pytest.raises(ValueError, match=r"compare.static_sizes=.*distinct ints >= 2"):
      arms_lib.arm_configs(config)


def test_contextual_kinds_add_arms_beside_sagc():
  config = with_compare(preset("grpo", "sagc"), ("grpo", "dapo"))
  config.compare.static_sizes = (16,)
  config.compare.contextual = ("prompt_aware", "per_prompt")
  arms = arms_lib.arm_configs(config)
  assert sorted(arms) == sorted(f"{a}_{k}" for a in ("grpo", "dapo")
                                for k in ("static16", "sagc", "prompt_aware", "per_prompt"))
  assert arms["dapo_per_prompt"].controller.kind == "per_prompt"
  for arm in arms.values():
    validate(arm)
  for bad in (("sagc",), ("static",), ("per_prompt", "per_prompt")):
    config.compare.contextual = bad
    with pytest.raises(ValueError, match=r"compare.contextual=.*distinct kinds"):
      arms_lib.arm_configs(config)


def test_kinds_add_arms_by_name_or_import_path_and_unknown_kinds_are_named():
  """compare.kinds: any controller kind, a user's by "module:Class" (its arm is
  "<algorithm>_module.Class"); a kind also in compare.contextual is one arm."""
  user = "sagc_jax.control.sagc:SAGCController"        # an import path to a kind
  config = with_compare(preset("grpo", "sagc"), ("grpo",))
  config.compare.static_sizes = (16,)
  config.compare.contextual = ("prompt_aware",)
  config.compare.kinds = ("per_prompt", "prompt_aware", user)
  arms = arms_lib.arm_configs(config)
  assert list(arms) == ["grpo_static16", "grpo_sagc", "grpo_prompt_aware", "grpo_per_prompt",
                        "grpo_sagc_jax.control.sagc.SAGCController"]
  assert arms["grpo_sagc_jax.control.sagc.SAGCController"].controller.kind == user
  for arm in arms.values():
    validate(arm)
  for bad, match in ((("magic",), "is not one of"), (("no_such_module:Cls",), "cannot import"),
                     (("sagc_jax.control.sagc:Nothing",), "has no 'Nothing'")):
    config.compare.kinds = bad
    with pytest.raises(ValueError, match=rf"compare.kinds=.*{match}"):
      arms_lib.arm_configs(config)


def test_real_model_comparison_config_has_eighteen_valid_runs():
  namespace = {}
  exec((REPO / "configs" / "compare_smollm2_cpu.py").read_text(), namespace)
  runs = arms_lib.run_configs(namespace["get_config"]())
  assert sorted({arms_lib.split_run_name(n)[0] for n in runs}) == sorted(
      f"{a}_{k}" for a in ("grpo", "dapo") for k in ("static4", "static16", "sagc"))
  assert len(runs) == 18
  for arm in runs.values():
    validate(arm)
    assert arm.model.path == "smollm2-135m-instruct" and arm.rollout.max_new_tokens == 512


def test_arms_run_the_recipes_and_grpo_keeps_the_files_kl():
  config = with_compare(preset("grpo", "sagc"), ("grpo", "dapo"))
  config.learner.kl_coef = 0.01
  config.learner.clip_high = 0.3           # tuned for one algorithm: not shared
  arms = arms_lib.arm_configs(config)
  grpo, dapo = learner_config(arms["grpo_sagc"]), learner_config(arms["dapo_sagc"])
  assert (grpo.kl_coef, grpo.clip_high) == (0.01, 0.2)
  assert (dapo.kl_coef, dapo.clip_high) == (0.0, 0.28)
  with pytest.raises(ValueError, match="unknown arm"):
    arms_lib.select_arms(arms, "grpo_sagc,ppo_sagc")


def test_every_arm_runs_once_per_seed_with_seed_dependent_data_and_sampling():
  config = with_compare(preset("grpo", "sagc"), ("grpo",))
  config.compare.seeds = 3
  runs = arms_lib.run_configs(config)
  assert len(runs) == 4 * 3
  for name, run in runs.items():
    arm, k = arms_lib.split_run_name(name)
    assert run.seed == config.seed + k and 0 <= k < 3
    assert run.controller.kind == ("sagc" if arm.endswith("sagc") else "static")
  assert sorted(arms_lib.select_arms(runs, "grpo_sagc")) == [
      "grpo_sagc_seed0", "grpo_sagc_seed1", "grpo_sagc_seed2"]
  assert list(arms_lib.select_arms(runs, "grpo_static4_seed1")) == ["grpo_static4_seed1"]
  assert arms_lib.split_run_name("grpo_sagc") == ("grpo_sagc", 0)
  config.compare.seeds = 0
  with pytest.raises(ValueError, match="compare.seeds=0 must be a positive int"):
    arms_lib.run_configs(config)


def test_confidence_intervals_use_student_t():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(0)
  for n in (2, 3, 5, 12, 31, 40):
    x = rng.normal(3.0, 2.0, n)
    mean, half, count = tables.mean_ci(list(x) + [float("nan")])
    t = stats.t.ppf(0.975, n - 1)          # at every n (base.stats: no normal 1.96 cut-off)
    assert count == n and mean == pytest.approx(x.mean())
    assert half == pytest.approx(t * x.std(ddof=1) / np.sqrt(n), rel=1e-3)
  assert tables.mean_ci([0.5])[2] == 1 and np.isnan(tables.mean_ci([0.5])[1])
  assert tables.mean_ci([])[2] == 0


def test_window_means_give_the_start_and_end_trend():
  rows = [{"response_len_mean": float(i)} for i in range(1, 13)] + [{"other": 1.0}]
  assert compare.window_mean(rows, "response_len_mean", "start") == 3.0     # 1..5
  assert compare.window_mean(rows, "response_len_mean", "end") == 10.0      # 8..12
  assert compare.window_mean(rows[:2], "response_len_mean", "end") == 1.5
  assert np.isnan(compare.window_mean(rows, "group_max_over_median", "start"))


def test_report_over_seeds_gives_mean_and_ci_per_arm(tmp_path):
  for seed in range(3):
    for algorithm, kind, g in [("grpo", "static", 4), ("grpo", "static", 16),
                               ("grpo", "sagc", None)]:
      fake_arm(tmp_path, f"{algorithm}_{kind}{g or ''}_seed{seed}", algorithm, kind, g,
               steps=12, seed=seed * 10 + (g or 0))
  (tmp_path / "compare.json").write_text(json.dumps({"seeds": 3, "targets": [0.5]}))
  rows = compare.report(tmp_path, log=lambda m: None)
  assert len(rows) == 9 and {r["seed"] for r in rows} == {0, 1, 2}
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert len(table) == 9 and set(table[0]) == set(compare.RESULT_COLUMNS)
  # results.md: per arm, the mean and Student-t half-width over its 3 seeds.
  wall = np.array([r["wall_clock_s"] for r in rows if r["arm"] == "grpo_sagc"])
  half = 4.303 * wall.std(ddof=1) / np.sqrt(3)
  sagc_line = next(line for line in (tmp_path / "results.md").read_text().splitlines()
                   if line.startswith("| grpo_sagc | 3 |"))
  assert f"| {wall.mean():.1f} ± {half:.1f} |" in sagc_line and half > 0
  # Without a budget the horizon is the shortest run's step time (static 4's 12 x 1.5 s);
  # the fake runs are evaluated once, at their end (0.5, from 0.4 before RL).
  per_hour = json.loads((tmp_path / "per_hour.json").read_text())
  assert per_hour["horizon_s"] == pytest.approx(12 * 1.5)
  static4 = [r for r in rows if r["arm"] == "grpo_static4"]
  assert all(r["mean_sampled_accuracy_over_h"] == pytest.approx(0.45) for r in static4)
  assert "## The best model per hour" in (tmp_path / "results.md").read_text()
  assert (tmp_path / "learning.png").read_bytes()[:4] == b"\x89PNG"
  for r in rows:       # speedups are against the same seed's largest static G
    if r["arm"] == "grpo_static16":
      assert r["speedup_vs_largest_static"] == pytest.approx(1.0)
  text = (tmp_path / "results.md").read_text()
  assert "| grpo_sagc | 3 |" in text and " ± " in text
  for name in ("g_lambda.png", "stragglers.png", "reward_vs_time.png", "posterior.png"):
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
  # A folder from before seeds ("grpo_sagc") is seed 0: next to grpo_sagc_seed0 it is
  # refused, not counted twice.
  fake_arm(tmp_path, "grpo_sagc", "grpo", "sagc", None, steps=12, seed=99)
  with pytest.raises(ValueError, match="grpo_sagc and grpo_sagc_seed0 are both seed 0"):
    compare.load_comparison(tmp_path)


def test_claims_md_pairs_each_contextual_arm_with_sagc_of_its_seed(tmp_path):
  """compare.contextual arms: claims.md gets a section comparing each with SAGC of its
  algorithm and seed (mean of the per-seed differences, re-derived here)."""
  for seed in range(3):
    for name, kind, g in [("static16", "static", 16), ("sagc", "sagc", None),
                          ("per_prompt", "sagc", None)]:
      fake_arm(tmp_path, f"grpo_{name}_seed{seed}", "grpo", kind, g, steps=12,
               seed=seed * 10 + len(name))
    config_file = tmp_path / "arms" / f"grpo_per_prompt_seed{seed}" / "config.json"
    config = json.loads(config_file.read_text())
    config["controller"]["kind"] = "per_prompt"
    config_file.write_text(json.dumps(config))
  rows = compare.report(tmp_path, log=lambda m: None)
  text = (tmp_path / "claims.md").read_text()
  assert "## Contextual controllers against SAGC" in text
  assert "| quantity | grpo per_prompt | verdict |" in text
  by = {(r["arm"], r["seed"]): r for r in rows}
  diffs = [by[("grpo_per_prompt", s)]["mean_g"] - by[("grpo_sagc", s)]["mean_g"]
           for s in range(3)]
  half = 4.303 * np.std(diffs, ddof=1) / np.sqrt(3)
  assert f"| mean G, arm - SAGC | {np.mean(diffs):+.2f} ± {half:.2f} |" in text
  # Without contextual arms, claims.md has no such section.
  for seed in range(3):
    shutil.rmtree(tmp_path / "arms" / f"grpo_per_prompt_seed{seed}")
  compare.report(tmp_path, log=lambda m: None)
  assert "Contextual" not in (tmp_path / "claims.md").read_text()


def test_compare_runs_arms_skips_finished_ones_and_reports(tmp_path, shared):
  config = with_compare(small_config(shared, steps=2), ("grpo",))
  arms = arms_lib.arm_configs(config)
  assert sorted(arms) == ["grpo_sagc", "grpo_static2", "grpo_static4"]
  messages = []
  arms_lib.run_arms(config, tmp_path, arms, log=messages.append)
  policy = (tmp_path / "shared" / "sft_model").absolute()
  for name in arms:
    run_config = json.loads((tmp_path / "arms" / name / "config.json").read_text())
    assert run_config["model"]["path"] == str(policy)     # one shared warm start
  # The first run evaluates before RL; the others read its kept evaluation.
  assert len(list((tmp_path / "shared" / "initial_eval").glob("*.json"))) == 1
  before = [json.loads((tmp_path / "arms" / name / "metrics.jsonl").read_text().split("\n")[0])
            for name in arms]
  assert sorted(row.get("eval_reused", 0.0) for row in before) == [0.0, 1.0, 1.0]
  assert len({row["eval_sampled_accuracy"] for row in before}) == 1
  arms_lib.run_arms(config, tmp_path, arms, log=messages.append)
  assert sum("finished earlier, skipped" in m for m in messages) == 3
  # compare.json records each run once (the skipped ones add nothing): its place in
  # the order, its start and end, and the load average at both.
  runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
  assert sorted(runs) == sorted(arms)
  for name, (stretch,) in runs.items():
    assert stretch["order"] == list(arms).index(name)
    assert stretch["ended"] >= stretch["started"] and stretch["load_end"] >= 0
  rows = compare.report(tmp_path, log=messages.append)
  by_arm = {r["arm"]: r for r in rows}
  assert by_arm["grpo_static4"]["speedup_vs_largest_static"] == pytest.approx(1.0)
  assert by_arm["grpo_static2"]["mean_g"] == 2 and by_arm["grpo_static4"]["mean_g"] == 4
  with open(tmp_path / "results.csv", encoding="utf-8") as f:
    table = list(csv.DictReader(f))
  assert [r["arm"] for r in table] == sorted(arms) and set(table[0]) == set(
      compare.RESULT_COLUMNS)
  for row in table:            # both straggler events, each a rate in [0, 1]
    assert 0 <= float(row["group_straggler_rate"]) <= 1
    assert 0 <= float(row["step_straggler_rate"]) <= 1
    assert float(row["step_straggler_rate"]) >= float(row["group_straggler_rate"])
  assert "| grpo_sagc |" in (tmp_path / "results.md").read_text()
  for name in ("g_lambda.png", "stragglers.png", "reward_vs_time.png", "posterior.png"):
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.compare", f"--workdir={tmp_path}",
                         "--merge_only"], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "grpo_static2" in proc.stdout
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.compare", "--workdir=gs://b/cmp",
                         "--merge_only"], capture_output=True, text=True, timeout=300,
                        cwd=tmp_path)
  assert proc.returncode == 2 and "needs a local folder" in proc.stderr
  assert not (tmp_path / "gs:").exists()


def fake_arm(root: Path, name: str, algorithm: str, kind: str, g: int | None, steps: int,
             seed: int) -> None:
  """A generated arm directory with the files a finished run leaves (no training)."""
  rng = np.random.default_rng(seed)
  config = preset(algorithm, kind)
  if g is not None:
    config.controller.static_g = g
  arm = root / "arms" / name
  arm.mkdir(parents=True)
  (arm / "config.json").write_text(config.to_json_best_effort())
  rows = []
  for step in range(1, steps + 1):
    used = g or int(rng.choice([4, 8, 16]))
    row = {"step": step, "g": used, "log2_g": float(np.log2(used)),
           "lambda": float(rng.uniform(0, 3)) if kind == "sagc" else 0.0,
           "straggler_rate": float(rng.uniform(0, 0.5)), "time_total_s": 1.0 + used / 8,
           "time_rollout_s": used / 10, "time_reward_s": 0.01, "time_learner_s": 0.5,
           "reward_mean": float(step / steps), "accuracy": float(step / steps),
           "response_len_mean": 20.0, "new_compilations": 0.0}
    row.update({f"p_mean/G{c}": float(rng.uniform(0, 1)) for c in (4, 8, 16)})
    if step == steps:
      row.update(eval_accuracy=0.5, eval_sampled_accuracy=0.5)
    rows.append(row)
  before = {"step": 0, "eval_accuracy": 0.4, "eval_sampled_accuracy": 0.4}
  (arm / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [before] + rows))
  (arm / "summary.json").write_text(json.dumps({"steps": steps, "eval_accuracy_start": 0.4}))


def test_analysis_notebook_executes_headless(tmp_path):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  for i, (algorithm, kind, g) in enumerate([("grpo", "static", 4), ("grpo", "static", 16),
                                            ("grpo", "sagc", None), ("dapo", "sagc", None)]):
    fake_arm(tmp_path, f"{algorithm}_{kind}{g or ''}", algorithm, kind, g, steps=12, seed=i)
  started = tmp_path / "arms" / "dapo_static8"          # an arm still before its first step
  started.mkdir()
  (started / "config.json").write_text(preset("dapo", "static").to_json_best_effort())
  (started / "metrics.jsonl").write_text("")
  assert len(compare.load_comparison(tmp_path)) == 4
  notebook = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
  os.environ["SAGC_COMPARE_DIR"] = str(tmp_path)
  try:
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
  finally:
    del os.environ["SAGC_COMPARE_DIR"]
  text = json.dumps([cell.get("outputs", []) for cell in notebook.cells])
  assert "4 arm(s)" in text and "grpo_sagc" in text and "image/png" in text
  assert not any(out.get("output_type") == "error" for cell in notebook.cells
                 for out in cell.get("outputs", []))


def test_sigterm_stops_the_whole_comparison_after_a_checkpoint(shared, tmp_path):
  from test_trainer import sigterm_after_steps, write_config_file

  config_file = write_config_file(
      tmp_path / "cfg.py", shared, 200, "import ml_collections",
      "c.compare = ml_collections.ConfigDict(dict(algorithms=('grpo',)))",
      "c.train.checkpoint_every = 100")
  workdir = tmp_path / "cmp"
  proc = subprocess.Popen([sys.executable, "-m", "sagc_jax.compare", f"--config={config_file}",
                           f"--workdir={workdir}"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  first = workdir / "arms" / "grpo_static2_seed0"
  output = sigterm_after_steps(proc, first, steps=2)
  assert "stopped by SIGTERM" in output
  summary = json.loads((first / "summary.json").read_text())
  assert summary["preempted"] and summary["steps"] < 200
  assert not (workdir / "arms" / "grpo_static4_seed0").exists()   # no next run was started
