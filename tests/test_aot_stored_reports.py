"""A stored AOT report stands in for a compile of the same digest (no libtpu needed),
once its checksum and peaks are checked; an ``aot:`` cost report names a missing field."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sagc_jax.aot import report_key, sizing_table
from sagc_jax.aot.__main__ import stored_report
from sagc_jax.aot.report_key import check_stored, checksum, digest, find_stored, with_checksum
from sagc_jax.replay.costs import CompiledStepCost

REPO = Path(__file__).resolve().parents[1]
PRESET = "configs/qwen3_8b_16k.py"
TOPOLOGY = "v6e:4x4"


def _preset():
  spec = importlib.util.spec_from_file_location("preset", REPO / PRESET)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _stored(key: str, fits: bool) -> dict:
  """The fields the tool prints of a report (the rest of a real one is not read)."""
  row = dict(name="learner_train[rows=4]", compile_s=1.0, peak_gib=20.0 if fits else 31.0,
             hbm_gib=32, flops=1e12, bytes=1e9, roofline_ms=1.0, fits=fits)
  return with_checksum(dict(
      digest=key, config=PRESET, topology=TOPOLOGY, devices=16, model_config="qwen3_8b.json",
      num_layers=36, rollout=dict(max_new_tokens=16384), executables=[row],
      chip=dict(name="v6e", hbm_gib=32), compile_s_total=1.0,
      learner=dict(scan_layers=False), fits=fits, not_fitting=[] if fits else [row["name"]]))


def _aot(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
  cmd = [sys.executable, "-m", "sagc_jax.aot", "--config", str(REPO / PRESET), "--topology",
         TOPOLOGY, "--largest_only", "--out", str(tmp_path / "out.json"), *flags]
  return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.parametrize("fits", [True, False])
def test_a_stored_report_of_the_same_digest_is_read_instead_of_compiling(tmp_path, fits):
  stored = tmp_path / "configs_aot"
  stored.mkdir()
  (stored / "other.json").write_text(json.dumps(_stored("0" * 64, True)))
  report = _stored(digest(_preset(), TOPOLOGY, largest_only=True), fits)
  (stored / "qwen3_8b_16k_v6e-4x4.json").write_text(json.dumps(report))
  proc = _aot(tmp_path, "--reuse", str(stored))
  assert proc.returncode == (0 if fits else 1), proc.stdout[-2000:] + proc.stderr[-2000:]
  assert "reusing" in proc.stdout and "qwen3_8b_16k_v6e-4x4.json" in proc.stdout
  assert "compiling" not in proc.stdout
  assert json.loads((tmp_path / "out.json").read_text()) == report
  verdict = next(line for line in proc.stdout.splitlines() if line.startswith("fits:"))
  assert verdict == ("fits: yes" if fits else "fits: NO: learner_train[rows=4]")


def test_the_digest_follows_what_is_compiled_and_nothing_else(tmp_path, monkeypatch):
  config = _preset()
  key = digest(config, TOPOLOGY, largest_only=True)
  # Where a run reads and writes compiles nothing.
  moved = _preset()
  moved.model.path = "gs://bucket/models/Qwen3-8B"
  moved.data.manual_dir = "gs://bucket/data/gsm8k"
  moved.train.checkpoint_dir = "gs://bucket/ckpt"
  assert digest(moved, TOPOLOGY, largest_only=True) == key
  # The config, the topology, the scope and the model each change it.
  slots = _preset()
  slots.rollout.refill_slots = 64
  changed = [digest(slots, TOPOLOGY, largest_only=True),
             digest(config, "v5p:2x2x4", largest_only=True),
             digest(config, TOPOLOGY, largest_only=False),
             digest(config, TOPOLOGY, largest_only=True, only="learner"),
             digest(config, TOPOLOGY, largest_only=True,
                    model_config=str(REPO / "configs/models/qwen2_5_7b.json"))]
  assert len({key, *changed}) == 1 + len(changed)
  # So does the code the programs come from.
  copy = tmp_path / "repo"
  for source in report_key.PROGRAM_SOURCES + ("configs/models",):
    (copy / source).parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if (REPO / source).is_dir() else shutil.copy)(REPO / source,
                                                                   copy / source)
  monkeypatch.setattr(report_key, "REPO_ROOT", copy)
  assert digest(config, TOPOLOGY, largest_only=True) == key
  layers = copy / "sagc_jax/models/layers.py"
  layers.write_text(layers.read_text() + "\n# a change\n")
  assert digest(config, TOPOLOGY, largest_only=True) != key
  assert find_stored(tmp_path, key) is None


def test_reuse_of_a_missing_folder_is_refused_by_name(tmp_path):
  proc = _aot(tmp_path, "--reuse", str(tmp_path / "nowhere"))
  assert proc.returncode == 2 and "--reuse=" in proc.stderr and "nowhere" in proc.stderr


STORED = sorted((REPO / "configs/aot").glob("*.json"))


@pytest.mark.parametrize("path", STORED, ids=[p.stem for p in STORED])
def test_each_stored_report_fits_and_covers_the_learner_and_the_samplers(path):
  report = json.loads(path.read_text())
  assert report["checksum"] == checksum(report)
  check_stored(path, report, log=pytest.fail)     # no warning, nothing refused
  config = Path(report["config"])
  assert path.name == f"{config.stem}_{report['topology'].replace(':', '_')}.json"
  assert (REPO / config).is_file() and report["digest"] and report["largest_only"]
  assert report["num_layers"] > 0 and report["rollout"]["max_new_tokens"] >= 16384
  assert report["fits"] and not report["not_fitting"]
  names = [e["name"] for e in report["executables"] if not e.get("probe")]
  for kind in ("learner_sync", "learner_apply", "learner_train[", "learner_ref[",
               "sampler_refill_segment[", "sampler_refill_prefill[", "eval_greedy[",
               "eval_sampled["):
    assert any(n.startswith(kind) for n in names), (kind, names)
  hbm = report["chip"]["hbm_gib"]
  assert all(e["peak_gib"] <= 0.9 * hbm for e in report["executables"] if not e.get("probe"))
  assert report["projected_rollout_s"] > 0 and report["projected_learner_s"] > 0


def test_the_sizing_table_in_the_docs_is_the_stored_reports():
  assert len(STORED) >= 7
  table = sizing_table.table(REPO / "configs/aot")
  assert table in (REPO / "docs/scale.md").read_text()


# ------------------------------------------------ stored reports that cannot be trusted
COMMITTED = REPO / "configs/aot/qwen3_8b_16k_v6e_4x4.json"      # v6e: 32 GiB per chip


def _edited(folder: Path, *, keep_checksum: bool, peak: float = 45.0) -> tuple[Path, dict]:
  """The committed report with its largest executable edited to peak at ``peak`` GiB,
  still saying it fits, written under ``folder``."""
  report = json.loads(COMMITTED.read_text())
  row = max(report["executables"], key=lambda e: e["peak_gib"] or 0)
  assert row["fits"] and report["fits"]
  row["peak_gib"] = peak
  if not keep_checksum:
    del report["checksum"]
  folder.mkdir(exist_ok=True)
  path = folder / COMMITTED.name
  path.write_text(json.dumps(report, indent=1))
  return path, report


def test_reuse_refuses_a_report_edited_after_it_was_written(tmp_path, capsys):
  """A report edited to a 45 GiB peak on a 32 GiB chip, still saying it fits, was
  reused and passed the pre-flight (exit 0)."""
  path, report = _edited(tmp_path / "stored", keep_checksum=True)
  with pytest.raises(ValueError, match=rf"^stored report {re.escape(str(path))}: its content "
                     r"was edited after it was written \(checksum [0-9a-f]{12} recorded"):
    stored_report(str(path.parent), report["digest"])
  assert "reusing" not in capsys.readouterr().out


def test_reuse_checks_the_peaks_of_a_report_without_a_checksum(tmp_path, capsys):
  """An older report (no checksum) is reused with a warning, its peaks still checked
  against the chip's HBM by the compile's fits rule."""
  path, report = _edited(tmp_path / "stored", keep_checksum=False)
  with pytest.raises(ValueError, match=rf"^stored report {re.escape(str(path))}: \S+ says it "
                     r"fits but peaks at 45\.00 GiB, over 90% of the v6e's 32 GiB HBM"):
    stored_report(str(path.parent), report["digest"])
  assert f"warning: {path} has no checksum" in capsys.readouterr().out
  # Unedited, it is reused (with the warning); one that says it fits while an
  # executable does not is refused.
  path, report = _edited(tmp_path / "stored", keep_checksum=False, peak=20.0)
  assert stored_report(str(path.parent), report["digest"]) == report
  assert f"warning: {path} has no checksum" in capsys.readouterr().out
  report["executables"][0]["fits"] = False
  with pytest.raises(ValueError, match=rf"^stored report .* says it fits but "
                     rf"{re.escape(report['executables'][0]['name'])} does not"):
    check_stored(path, report, log=lambda m: None)


def test_reuse_names_a_truncated_report_and_keeps_going(tmp_path, capsys):
  """A truncated report in the --reuse folder was skipped without a word."""
  folder = tmp_path / "stored"
  folder.mkdir()
  path = Path(shutil.copy(COMMITTED, folder))
  (folder / "a_truncated.json").write_text(COMMITTED.read_text()[:500])
  report = json.loads(COMMITTED.read_text())
  assert stored_report(str(folder), report["digest"]) == report
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith(f"skipping {folder / 'a_truncated.json'} is not valid JSON (")
  assert out[1].startswith(f"reusing {path}")


AOT_COST_FIELDS = ["rollout.mode", "rollout.rollouts_per_step", "rollout.prompts_per_step",
                   "rollout.max_new_tokens", "rollout.prompt_buckets", "rollout.group_sizes",
                   "rollout.dynamic_max_rounds", "refill.slots", "refill.lanes",
                   "refill.segment_ms", "refill.kv_ms_per_key", "refill.prefill_ms",
                   "generate_ms"]


@pytest.mark.parametrize("field", AOT_COST_FIELDS)
def test_an_aot_cost_report_without_a_nested_field_is_refused_naming_it(tmp_path, field):
  """``simulate --cost aot:REPORT.json`` ended in a KeyError traceback."""
  report = json.loads(COMMITTED.read_text())
  if field == "generate_ms":          # a fused (dense) sampler's report: no refill
    report["refill"] = None
  section, _, name = field.rpartition(".")
  del (report[section] if section else report)[name]
  path = tmp_path / "report.json"
  path.write_text(json.dumps(report))
  with pytest.raises(ValueError, match=rf"^AOT report {re.escape(str(path))} lacks "
                     rf"{re.escape(field)}: write it again"):
    CompiledStepCost.load(path)


def test_an_aot_cost_report_without_a_refill_sampler_loads(tmp_path):
  report = json.loads(COMMITTED.read_text())
  for refill in (None, "absent"):
    if refill is None:
      report["refill"] = None
    else:
      del report["refill"]
    (tmp_path / "dense.json").write_text(json.dumps(report))
    assert CompiledStepCost.load(tmp_path / "dense.json").report == report
