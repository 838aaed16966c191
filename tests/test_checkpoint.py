"""Checkpoint restore never loses a run: damage is moved aside, mismatch touches nothing.

Real orbax checkpoints of small trees on local disk (the trainer-level cases are in
``test_trainer.py``).
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sagc_jax.runtime.checkpoint import Checkpointer, CheckpointMismatch
from sagc_jax.training.run_state import config_changes


def _params(width=4, value=1.0):
  return {"layers": {"0": {"kernel": jnp.full((3, width), value)}}, "norm": jnp.ones((3,))}


def _opt(width=4):
  return {"mu": jnp.zeros((3, width)), "count": jnp.zeros((), jnp.int32)}


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _saved(tmp_path, *params_per_step):
  ckpt = Checkpointer(tmp_path / "ck", log=lambda m: None)
  for step, params in enumerate(params_per_step, start=1):
    ckpt.save(step, params, _opt(params["layers"]["0"]["kernel"].shape[1]), {"step": step})
  ckpt.wait()
  return ckpt


def _entries(tmp_path):
  return sorted(p.name for p in (tmp_path / "ck").iterdir())


def test_shape_or_structure_mismatch_is_refused_and_nothing_is_moved(tmp_path):
  ckpt = _saved(tmp_path, _params(), _params())
  before = _entries(tmp_path)
  with pytest.raises(CheckpointMismatch, match=r"step 2 .* layers/0/kernel saved \(3, 4\) "
                                               r"vs run \(3, 5\)"):
    ckpt.restore_latest(_abstract(_params(width=5)), _abstract(_opt(width=5)))
  extra = dict(_params(), bias=jnp.zeros((4,)))
  with pytest.raises(CheckpointMismatch, match="not in the checkpoint: bias"):
    ckpt.restore_latest(_abstract(extra), _abstract(_opt()))
  assert _entries(tmp_path) == before and ckpt.all_steps() == [1, 2]
  step, params, _, meta = ckpt.restore_latest(_abstract(_params()), _abstract(_opt()))
  assert step == 2 and meta["step"] == 2


def test_non_finite_weights_are_damage_and_the_previous_step_is_used(tmp_path):
  messages = []
  ckpt = _saved(tmp_path, _params(value=2.0), _params(value=np.nan))
  ckpt.log = messages.append
  step, params, _, _ = ckpt.restore_latest(_abstract(_params()), _abstract(_opt()))
  assert step == 1 and float(params["layers"]["0"]["kernel"][0, 0]) == 2.0
  assert any("step 2" in m and "NaN or inf" in m for m in messages)
  assert [n for n in _entries(tmp_path) if n.startswith("corrupt-2-")]


def test_a_directory_whose_steps_were_all_moved_aside_is_never_started_over(tmp_path):
  ckpt = _saved(tmp_path, _params(value=np.inf))
  with pytest.raises(RuntimeError, match="none of the checkpoints"):
    ckpt.restore_latest(_abstract(_params()), _abstract(_opt()))
  # The next run finds no step at all, only the moved-aside one: still refused.
  again = Checkpointer(tmp_path / "ck", log=lambda m: None)
  with pytest.raises(RuntimeError, match=r"moved aside \(corrupt-1-\d+\); refusing to start over"):
    again.restore_latest(_abstract(_params()), _abstract(_opt()))
  # An empty directory is a fresh run.
  assert Checkpointer(tmp_path / "fresh", log=lambda m: None).restore_latest(
      _abstract(_params()), _abstract(_opt())) is None


def test_config_changes_names_every_changed_key():
  old = {"learner": {"lr": 1e-6, "clip_low": 0.2}, "seed": 0}
  new = {"learner": {"lr": 2e-6, "clip_low": 0.2, "fsdp": True}, "seed": 0}
  assert config_changes(old, new) == ["learner.fsdp: '<unset>' -> True",
                                      "learner.lr: 1e-06 -> 2e-06"]


_WRITE_FAILURE_SCRIPT = """
import os, shutil, sys, time
import jax.numpy as jnp
from sagc_jax.runtime.checkpoint import Checkpointer, CheckpointWriteError
ckpt = Checkpointer(sys.argv[1], log=print)
ckpt.save(1, {"w": jnp.ones((3,))}, {"m": jnp.ones((3,))}, {"step": 1})
ckpt.wait()
shutil.rmtree(sys.argv[1])
open(sys.argv[1], "w").write("the checkpoint directory is gone")   # writes now fail
ckpt.save(2, {"w": jnp.ones((3,))}, {"m": jnp.ones((3,))}, {"step": 2})
start = time.time()
while time.time() - start < 30:
  try:
    ckpt.check()                           # never blocks on a save in progress
  except CheckpointWriteError as err:
    print("ERROR", err, flush=True)
    ckpt.close()
    os._exit(3)                            # as sagc_jax.train does (orbax threads hang)
  time.sleep(0.05)
os._exit(4)
"""


def test_a_failed_background_save_is_raised_by_the_next_check_naming_the_path(tmp_path):
  """Before: an asynchronous write error surfaced only at the run's final wait, and
  the process then hung at exit on orbax's waiting threads."""
  target = tmp_path / "ck"
  proc = subprocess.run([sys.executable, "-c", _WRITE_FAILURE_SCRIPT, str(target)],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith("ERROR"))
  assert f"writing a checkpoint to {target} failed (NotADirectoryError" in line


def _noise_params(value):
  noise = np.random.default_rng(0).normal(size=(64, 256)).astype(np.float32)
  return {"layers": {"0": {"kernel": jnp.asarray(noise + value)}}, "norm": jnp.ones((3,))}


def test_finite_garbage_in_the_newest_step_fails_its_checksum_and_the_previous_is_used(tmp_path):
  """Step 2's files hold other finite values than the ones its checksums were taken
  of (what bytes changed on disk after the save look like to a reader: orbax writes
  ``kernel + 7`` under step 2's checksums of ``kernel + 2``). The step is moved aside
  and step 1 restored, naming the array; the finiteness check alone passed it."""
  from sagc_jax.runtime.checkpoint import tree_checksums

  opt = _opt()
  ckpt = Checkpointer(tmp_path / "ck", log=lambda m: None)
  ckpt.save(1, _noise_params(1.0), opt, {"step": 1})
  ckpt.wait()
  ckpt._manager.save(2, force=True, args=ocp.args.Composite(
      params=ocp.args.StandardSave(_noise_params(7.0)), opt_state=ocp.args.StandardSave(opt),
      meta=ocp.args.JsonSave({"step": 2, "checksums": {
          "params": tree_checksums(_noise_params(2.0)), "opt_state": tree_checksums(opt)}})))
  ckpt.wait()
  messages = []
  reader = Checkpointer(tmp_path / "ck", log=messages.append)
  step, params, _, meta = reader.restore_latest(_abstract(_noise_params(0.0)), _abstract(opt))
  assert step == 1 and "checksums" not in meta
  np.testing.assert_array_equal(params["layers"]["0"]["kernel"],
                                _noise_params(1.0)["layers"]["0"]["kernel"])
  assert any("step 2" in m and "content checksum of params/layers/0/kernel differs" in m
             for m in messages), messages
  assert [n for n in _entries(tmp_path) if n.startswith("corrupt-2-")]


def test_4_kib_overwritten_in_the_newest_params_file_falls_back_to_the_previous_step(tmp_path):
  """The fault as it happens: 4 KiB in the middle of the newest step's largest params
  data file overwritten in place (size unchanged). Whether it then fails to decode or
  decodes to other values, the step is moved aside and step 1 restored intact."""
  ckpt = Checkpointer(tmp_path / "ck", log=lambda m: None)
  for step in (1, 2):
    ckpt.save(step, _noise_params(float(step)), _opt(), {"step": step})
  ckpt.wait()
  data = max((p for p in (tmp_path / "ck" / "2" / "params").rglob("*") if p.is_file()),
             key=lambda p: p.stat().st_size)
  raw = bytearray(data.read_bytes())
  middle = len(raw) // 2
  raw[middle:middle + 4096] = raw[middle - 8192:middle - 4096]      # other real bytes
  data.write_bytes(bytes(raw))
  messages = []
  step, params, _, _ = Checkpointer(tmp_path / "ck", log=messages.append).restore_latest(
      _abstract(_noise_params(0.0)), _abstract(_opt()))
  assert step == 1
  np.testing.assert_array_equal(params["layers"]["0"]["kernel"],
                                _noise_params(1.0)["layers"]["0"]["kernel"])
  # One line; unless the data no longer decodes at all, it names the damaged array
  # (checksums come before the finiteness check, which cannot name one).
  assert len(messages) == 1, messages
  assert ("the content checksum of params/" in messages[0]
          or "NaN or inf" not in messages[0]), messages


def test_a_save_cut_short_leaves_no_temporary_folder_after_the_next_start(tmp_path):
  """A kill or the stop deadline during a save leaves ``<step>.orbax-checkpoint-tmp``:
  the next writer removes it at start, whether or not that step is saved again."""
  _saved(tmp_path, _params()).close()
  partial = tmp_path / "ck" / "9.orbax-checkpoint-tmp"
  (partial / "params").mkdir(parents=True)
  (partial / "params" / "data").write_bytes(b"\0" * 100)
  ckpt = Checkpointer(tmp_path / "ck", log=lambda m: None)
  step, _, _, _ = ckpt.restore_latest(_abstract(_params()), _abstract(_opt()))
  ckpt.close()
  assert step == 1 and not partial.exists() and _entries(tmp_path) == ["1"]


def test_checksums_are_position_weighted_and_equal_across_shardings():
  from sagc_jax.runtime.checkpoint import tree_checksums

  x = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8)
  swapped = x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])          # same values, moved
  assert tree_checksums(x) != tree_checksums(swapped)
  assert tree_checksums(x.astype(jnp.bfloat16)) != tree_checksums(x)
  if jax.device_count() >= 8:
    mesh = jax.make_mesh((8,), ("data",))
    sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    assert tree_checksums(sharded) == tree_checksums(x)


def test_the_verified_step_is_kept_however_many_newer_steps_rotate(tmp_path):
  ckpt = Checkpointer(tmp_path / "ck", max_to_keep=2, log=lambda m: None)
  for step in (1, 2, 3):
    ckpt.save(step, _params(value=float(step)), _opt(), {"step": step})
  ckpt.wait()
  assert ckpt.all_steps() == [2, 3]                   # plain rotation
  resumed = Checkpointer(tmp_path / "ck", max_to_keep=2, log=lambda m: None)
  step, _, _, _ = resumed.restore_latest(_abstract(_params()), _abstract(_opt()))
  assert step == 3 and resumed.verified_step == 3     # restored with matching checksums
  for step in (4, 5, 6):
    resumed.save(step, _params(value=float(step)), _opt(), {"step": step})
  resumed.wait()
  assert resumed.all_steps() == [3, 5, 6]             # step 3 stays until one verifies
  again = Checkpointer(tmp_path / "ck", max_to_keep=2, log=lambda m: None)
  assert again.restore_latest(_abstract(_params()), _abstract(_opt()))[0] == 6
  again.save(7, _params(value=7.0), _opt(), {"step": 7})
  again.wait()
  assert again.all_steps() == [6, 7]
