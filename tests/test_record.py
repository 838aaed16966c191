"""A comparison's run order and its record, compare.json (``experiments/record.py``): the
order is random within a seed and fixed by it, the record is never overwritten by other
settings, and a refused command writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import ml_collections
import pytest

from sagc_jax.config import preset
from sagc_jax.config.compare import CompareSection
from sagc_jax.experiments import arms as arms_lib, record

REPO = Path(__file__).resolve().parents[1]


def comparison(seeds):
  config = preset("grpo", "sagc")
  config.compare = ml_collections.ConfigDict(dict(algorithms=("grpo", "dapo"), seeds=seeds))
  return config


def test_arms_run_in_an_order_drawn_from_their_seed():
  runs = list(arms_lib.run_configs(comparison(seeds=4)))
  per_seed = [[arms_lib.split_run_name(n)[0] for n in runs if n.endswith(f"_seed{k}")]
              for k in range(4)]
  # Seed by seed, each seed's 8 arms once, in orders that differ between seeds.
  assert [n.rsplit("_seed", 1)[1] for n in runs] == [str(k) for k in range(4) for _ in range(8)]
  assert all(sorted(order) == sorted(per_seed[0]) for order in per_seed)
  assert len({tuple(order) for order in per_seed}) == 4
  # The same seed gives the same order (a resumed comparison keeps it); the base seed
  # moves every seed's order.
  assert list(arms_lib.run_configs(comparison(seeds=4))) == runs
  assert list(arms_lib.run_configs(comparison(seeds=2))) == runs[:16]
  other = comparison(seeds=1)
  other.seed += 1
  assert list(arms_lib.run_configs(other)) == [n.replace("_seed1", "_seed0") for n in runs[8:16]]


def test_a_record_with_other_settings_is_refused_by_name_and_kept(tmp_path):
  settings = record.record_settings(CompareSection(seeds=2, time_budget_s=30.0, targets=(0.6,)))
  record.open_record(tmp_path, settings, {"host": "a"})
  record.record_run(tmp_path, "grpo_sagc_seed0", 0, 1000.0, 0.5)
  before = (tmp_path / "compare.json").read_text()
  changed = dict(settings, time_budget_s=60.0, targets=[0.5, 0.7])
  with pytest.raises(ValueError, match=r"time_budget_s: recorded 30.0, now 60.0; targets: "
                     r"recorded \[0.6\], now \[0.5, 0.7\]"):
    record.open_record(tmp_path, changed, {"host": "b"})
  assert (tmp_path / "compare.json").read_text() == before
  # More seeds extend it; the machine and the runs stay.
  record.open_record(tmp_path, dict(settings, seeds=4), {"host": "b"})
  kept = record.load_record(tmp_path)
  assert (kept["seeds"], kept["machine"], list(kept["runs"])) == (4, {"host": "a"},
                                                                  ["grpo_sagc_seed0"])
  stretch = kept["runs"]["grpo_sagc_seed0"][0]
  assert stretch["started"] == 1000.0 and stretch["ended"] > 1000.0
  assert stretch["load_start"] == 0.5 and stretch["load_end"] >= 0.0
  # A record that predates a setting takes it without complaint.
  old = {k: v for k, v in kept.items() if k != "priced_cost"}
  (tmp_path / "compare.json").write_text(json.dumps(old))
  record.open_record(tmp_path, dict(settings, seeds=4), {})
  assert record.load_record(tmp_path)["priced_cost"] == "fit"
  (tmp_path / "compare.json").write_text('{"seeds": ')
  with pytest.raises(ValueError, match=r"compare.json is not valid JSON"):
    record.load_record(tmp_path)


def test_a_refused_comparison_writes_nothing_and_merge_only_names_what_it_ignores(commands,
                                                                                 tmp_path):
  """The probe's loss: a finished comparison given a new budget, points and targets and
  one bad arm setting. The arm is refused before compare.json is touched; a new
  workdir is not even created; --merge_only says it ignores its --config options.
  (``python -m sagc_jax.compare`` in the warm command server: ``commands``.)"""

  def run_compare(*args, cwd):
    return commands.run("sagc_jax.compare", *args, cwd=cwd)

  config = str(REPO / "configs" / "compare_tiny_cpu.py")
  workdir = tmp_path / "finished"
  workdir.mkdir()
  recorded = json.dumps({"seeds": 2, "time_budget_s": 10.0, "eval_points": 3,
                         "targets": [0.5], "equivalence_margin": 0.02, "priced_cost": "fit"})
  (workdir / "compare.json").write_text(recorded)
  bad_arm = ["--config.compare.time_budget_s=20", "--config.compare.eval_points=5",
             "--config.compare.targets=(0.6,)", "--config.controller.tau=0.5"]
  proc = run_compare(f"--config={config}", f"--workdir={workdir}", *bad_arm, cwd=tmp_path)
  assert proc.returncode == 2 and "tau" in proc.stderr, proc.stderr
  assert (workdir / "compare.json").read_text() == recorded
  # Good arms, other settings: refused by name, the record kept.
  proc = run_compare(f"--config={config}", f"--workdir={workdir}", *bad_arm[:3], cwd=tmp_path)
  assert proc.returncode == 2 and "time_budget_s: recorded 10.0, now 20.0" in proc.stderr
  assert (workdir / "compare.json").read_text() == recorded
  fresh = tmp_path / "fresh"
  proc = run_compare(f"--config={config}", f"--workdir={fresh}", bad_arm[-1], cwd=tmp_path)
  assert proc.returncode == 2 and not fresh.exists()
  proc = run_compare(f"--workdir={workdir}", "--merge_only", f"--config={config}",
                     "--config.compare.targets=(0.6,)", cwd=tmp_path)
  assert ("--merge_only ignores --config, --config.compare.targets" in proc.stdout
          + proc.stderr), proc.stderr
