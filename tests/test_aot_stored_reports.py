"""A stored AOT report stands in for a compile of the same digest (no libtpu needed)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sagc_jax.aot import report_key, sizing_table
from sagc_jax.aot.report_key import digest, find_stored

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
  return dict(digest=key, config=PRESET, topology=TOPOLOGY, model_config="qwen3_8b.json",
              num_layers=36, rollout=dict(max_new_tokens=16384), executables=[row],
              chip=dict(name="v6e", hbm_gib=32), compile_s_total=1.0,
              learner=dict(scan_layers=False), fits=fits,
              not_fitting=[] if fits else [row["name"]])


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
