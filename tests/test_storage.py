"""gs:// everywhere: run files, metrics, TensorBoard, checkpoints and staged inputs in a
bucket served by a local GCS emulator (tests/gcs_emulator.py), and exact resume from it."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
from etils import epath

from gcs_emulator import BUCKET, environment, gcs_emulator
from sagc_jax.runtime import storage
from sagc_jax.config import validate
from sagc_jax.training.export import export
from sagc_jax.experiments.plots import plot_run
from sagc_jax.runtime.metrics import deterministic_view, load_history
from test_trainer import run, small_config


@pytest.fixture(scope="module")
def gcs():
  with gcs_emulator() as env, environment(env):
    yield f"gs://{BUCKET}"


def upload(local_dir, remote):
  for path in sorted(local_dir.rglob("*")):
    if path.is_file():
      target = epath.Path(remote) / path.relative_to(local_dir).as_posix()
      target.write_bytes(path.read_bytes())


def test_run_path_keeps_buckets_and_makes_local_paths_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(storage.run_path("gs://b/run")) == "gs://b/run"
  assert storage.run_path("runs/x") == tmp_path / "runs" / "x"
  assert storage.local_mirror("gs://b/run/a", tmp_path) == tmp_path / "runs/gs/b/run/a"
  assert storage.local_mirror("runs/x", tmp_path / "cache") == tmp_path / "runs" / "x"


def test_stage_copies_once_reuses_and_recopies_a_changed_source(gcs, tmp_path):
  src = tmp_path / "model"
  (src / "sub").mkdir(parents=True)
  (src / "config.json").write_text('{"a": 1}')
  (src / "sub" / "weights.bin").write_bytes(os.urandom(3000))
  upload(src, f"{gcs}/stage/model")
  logs = []
  local = storage.stage(f"{gcs}/stage/model", tmp_path / "cache", logs.append, what="model.path")
  assert local.startswith(str(tmp_path / "cache" / "staged" / "gs" / BUCKET))
  for rel in ("config.json", "sub/weights.bin"):
    assert (epath.Path(local) / rel).read_bytes() == (src / rel).read_bytes()
  assert "copied 2 files" in logs[-1]
  assert storage.stage(f"{gcs}/stage/model", tmp_path / "cache", logs.append) == local
  assert "reusing the local copy" in logs[-1]
  epath.Path(f"{gcs}/stage/model/config.json").write_text('{"a": 22}')
  storage.stage(f"{gcs}/stage/model", tmp_path / "cache", logs.append)
  assert "source changed" in logs[-2] and json.loads(
      (epath.Path(local) / "config.json").read_text()) == {"a": 22}
  assert storage.stage(str(src), tmp_path / "cache") == str(src)       # local: untouched
  with pytest.raises(FileNotFoundError, match="model.path gs://.*/nope does not exist"):
    storage.stage(f"{gcs}/nope", tmp_path / "cache", what="model.path")


def test_metrics_in_a_bucket_are_rewritten_whole_and_survive_truncation(gcs):
  from sagc_jax.runtime.metrics import MetricsWriter, read_jsonl

  workdir = f"{gcs}/metrics_run"
  writer = MetricsWriter(workdir, 5, tensorboard=False, sync_secs=3600,
                         stream=open(os.devnull, "w"))
  for step in (1, 2, 3):
    writer.write({"step": step, "x": step * 1.5})
  assert not epath.Path(f"{workdir}/metrics.jsonl").exists()       # throttled: not yet synced
  writer.flush()
  assert [r["step"] for r in read_jsonl(f"{workdir}/metrics.jsonl")] == [1, 2, 3]
  writer.close()
  again = MetricsWriter(workdir, 5, tensorboard=False, sync_secs=0, stream=open(os.devnull, "w"))
  again.truncate_after(2)                                          # a resume from step 2
  again.write({"step": 3, "x": -1.0})
  assert read_jsonl(f"{workdir}/metrics.jsonl") == [
      {"step": 1, "x": 1.5}, {"step": 2, "x": 3.0}, {"step": 3, "x": -1.0}]
  again.close()


def test_remote_tfds_or_cache_folders_are_refused_naming_the_key(shared):
  for key in ("data_dir", "local_cache_dir"):
    config = small_config(shared)
    section = config.data if key == "data_dir" else config.train
    section[key] = "gs://b/x"
    with pytest.raises(ValueError, match=f"{key}='gs://b/x' must be a local folder"):
      validate(config)


def test_main_job_with_a_gs_workdir_and_gs_model_resumes_exactly(gcs, shared, tmp_path):
  """The tiny main job, workdir and policy in the bucket: killed after step 2,
  resumed to step 4, it matches an uninterrupted local run bit for bit."""
  config = small_config(shared, steps=4)
  straight = tmp_path / "straight"
  _, straight_params, _ = run(config, straight)

  upload(straight / "sft_model", f"{gcs}/policy")
  remote = f"{gcs}/runs/tiny"
  config.model.path = f"{gcs}/policy"
  config.train.local_cache_dir = str(tmp_path / "cache")
  config.train.metrics_sync_secs = 3600.0          # rows reach the bucket at checkpoints
  run(config, remote, max_steps=2)                 # "preempted" after step 2
  assert [r["step"] for r in load_history(remote)] == [1, 2]
  _, resumed_params, trainer = run(config, remote)
  assert trainer.step == 4
  for a, b in zip(jax.tree.leaves(straight_params), jax.tree.leaves(resumed_params)):
    np.testing.assert_array_equal(a, b)
  assert [deterministic_view(r) for r in load_history(remote)] == \
      [deterministic_view(r) for r in load_history(straight)]

  bucket = epath.Path(remote)
  assert json.loads((bucket / "summary.json").read_text())["steps"] == 4
  assert json.loads((bucket / "config.json").read_text())["model"]["path"] == f"{gcs}/policy"
  assert sorted(int(p.name) for p in (bucket / "checkpoints").iterdir()
                if p.name.isdigit()) == [2, 4]
  assert list((bucket / "tensorboard").glob("events.out.tfevents.*"))
  plot_run(trainer.history, trainer.eval_history, bucket / "run.png")
  assert (bucket / "run.png").read_bytes()[:4] == b"\x89PNG"
  assert not (tmp_path / "gs:").exists() and not os.path.exists("gs:")
  staged = tmp_path / "cache" / "staged" / "gs" / BUCKET / "policy"
  assert (staged / storage.STAGED_MARKER).exists()

  # The launcher's export action: the newest checkpoint as an HF folder in the bucket.
  from transformers import AutoConfig
  export(remote, f"{remote}/export", log=lambda m: None)
  exported = storage.stage(f"{remote}/export", tmp_path / "cache")
  assert AutoConfig.from_pretrained(exported).num_hidden_layers == \
      json.loads((staged / "config.json").read_text())["num_hidden_layers"]
  assert {"model.safetensors", "tokenizer.json", "generation_config.json"} <= \
      {p.name for p in (bucket / "export").iterdir()}
  shutil.rmtree(tmp_path / "cache")


def test_jax_compilation_cache_works_in_a_bucket(gcs):
  """A gs:// workdir keeps its compilation cache in the bucket (<workdir>/jax_cache), so a
  slice recreated after a preemption reuses the programs instead of recompiling."""
  import subprocess
  import sys

  script = ("import jax, jax.numpy as jnp\n"
            f"jax.config.update('jax_compilation_cache_dir', '{gcs}/cache_probe')\n"
            "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)\n"
            "print(float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).sum()))\n")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  names = [p.name for p in epath.Path(f"{gcs}/cache_probe").iterdir()]
  assert any(name.startswith("jit__lambda") for name in names), names
