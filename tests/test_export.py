"""HF export of a trained run: transformers loads it, its logits equal the checkpoint's
policy, and exporting reads the run without writing to it."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import hf_fixtures as hf
from sagc_jax.training.export import export
from sagc_jax.models import from_pretrained
from sagc_jax.training.loop import Trainer
from test_trainer import run, small_config

torch = pytest.importorskip("torch")


def test_export_loads_in_transformers_with_the_checkpoint_logits(shared, tmp_path):
  config = small_config(shared, steps=2)
  config.train.export_every = 2                 # and one written during training
  workdir = tmp_path / "run"
  run(config, workdir)
  before = {str(p): p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}

  out = tmp_path / "export"
  result = export(str(workdir), str(out), log=lambda m: None)
  assert result["step"] == 2
  assert {"config.json", "model.safetensors", "generation_config.json",
          "tokenizer.json", "tokenizer_config.json"} <= set(result["files"])
  after = {str(p): p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
  assert after == before                                   # the run was only read
  umask = os.umask(0)
  os.umask(umask)                                          # modes of a plain open/mkdir
  assert out.stat().st_mode & 0o777 == 0o777 & ~umask
  assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o666 & ~umask}

  # Reference: the policy as the trainer restores it from the same checkpoint.
  trainer = Trainer(config, workdir, log=lambda m: None)
  try:
    assert trainer.step == 2
    ids = np.array([[3, 17, 42, 9, 5, 28, 11, 60]], np.int64)
    ours = np.asarray(trainer.model(jnp.asarray(ids)), np.float32)
  finally:
    trainer.close()
  from transformers import AutoModelForCausalLM, AutoTokenizer

  reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
  np.testing.assert_allclose(hf.hf_logits(reloaded, ids), ours, atol=2e-4, rtol=1e-4)
  start, _ = from_pretrained(workdir / "sft_model")      # RL changed the weights
  assert np.abs(np.asarray(start(jnp.asarray(ids))) - ours).max() > 1e-4
  tokenizer = AutoTokenizer.from_pretrained(str(out))
  assert tokenizer("1 + 2 =")["input_ids"]
  generation = json.loads((out / "generation_config.json").read_text())
  assert generation["eos_token_id"] is not None

  # train.export_every wrote the same policy while training: same files, same tensors.
  from safetensors.numpy import load_file
  during = workdir / "exports" / "step_2"
  assert sorted(p.name for p in during.iterdir()) == result["files"]
  trained, exported = load_file(during / "model.safetensors"), load_file(out / "model.safetensors")
  assert trained.keys() == exported.keys()
  for name in trained:
    np.testing.assert_array_equal(trained[name], exported[name])
  assert (during / "config.json").read_text() == (out / "config.json").read_text()

  with pytest.raises(ValueError, match="exists already"):
    export(str(workdir), str(out))
  with pytest.raises(ValueError, match="step 7 is not among the checkpoints"):
    export(str(workdir), str(tmp_path / "other"), step=7)

  # A damaged step asked for by number: one ValueError naming it (export prints it as
  # one line), nothing moved. 4 KiB of its params data overwritten with other bytes of
  # the file: it then fails to decode or decodes to values its checksums refuse.
  data = max((p for p in (workdir / "checkpoints" / "2" / "params").rglob("*")
              if p.is_file()), key=lambda p: p.stat().st_size)
  raw = bytearray(data.read_bytes())
  middle = len(raw) // 2
  raw[middle:middle + 4096] = raw[max(middle - 8192, 0):max(middle - 8192, 0) + 4096]
  data.write_bytes(bytes(raw))
  entries = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  with pytest.raises(ValueError, match=r"checkpoint step 2 in .* cannot be used \(\w+: "):
    export(str(workdir), str(tmp_path / "damaged"), step=2)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == entries


def test_export_folder_is_checked_at_start_up_and_stale_partials_are_removed(shared,
                                                                            tmp_path):
  """An unwritable train.export_dir is refused before anything is built (not at the
  first export, steps later); a kill -9 during an export leaves a hidden partial
  folder, which the next start removes."""
  config = small_config(shared, steps=2)
  config.train.export_every = 2
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  config.train.export_dir = str(blocker / "exports")
  with pytest.raises(ValueError, match=r"train.export_dir .*a_file/exports cannot be created"):
    Trainer(config, tmp_path / "refused", log=lambda m: None)
  # Refused before any run file was written (the lock is released, nothing else made).
  assert sorted(p.name for p in (tmp_path / "refused").iterdir()) == []
  config.train.export_dir = ""
  stale = tmp_path / "run" / "exports" / ".step_2.partial-x1y2"
  (stale / "export").mkdir(parents=True)
  (stale / "export" / "model.safetensors").write_bytes(b"\0" * 64)
  messages = []
  Trainer(config, tmp_path / "run", log=messages.append).close()
  assert not stale.exists()
  assert any(f"removed {stale}" in m for m in messages)
