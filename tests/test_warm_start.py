"""Warm start: the guess stage (``sft.guess_stage_*``) that gives the paper-regime
comparison a policy which can write its work but rarely does."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np

from sagc_jax.config import tiny_cpu_config
from sagc_jax.data import load_split
from sagc_jax.data.synthetic import SyntheticConfig, draw_example
from sagc_jax.models import from_pretrained, load_tokenizer
from sagc_jax.training.warm_start import SFT_MARKER, answer_only, prepare_policy


def test_answer_only_reduces_the_given_share_and_keeps_the_rest():
  examples = [draw_example(SyntheticConfig(), "train", i) for i in range(2000)]
  lazy = answer_only(examples, 0.75, seed=0)
  assert lazy == answer_only(examples, 0.75, seed=0) != answer_only(examples, 0.75, seed=1)
  reduced = 0
  for before, after in zip(examples, lazy):
    assert (after["prompt"], after["answer"]) == (before["prompt"], before["answer"])
    if after["solution"] != before["solution"]:
      reduced += 1
      assert after["solution"] == f"answer {before['answer']}\n"
  assert abs(reduced / len(examples) - 0.75) < 0.03
  assert answer_only(examples, 0.0, seed=0) == examples


def _first_token_prob_of_answer(folder, prompts) -> float:
  """Mean probability that the solution starts with 'a' (of "answer"), from the logits."""
  model, _ = from_pretrained(folder, dtype=jnp.float32)
  tokenizer = load_tokenizer(folder)
  a_id = tokenizer("a", add_special_tokens=False)["input_ids"][0]
  probs = []
  for prompt in prompts:
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    logits = np.asarray(model(jnp.asarray([ids]))[0, -1], np.float64)
    p = np.exp(logits - logits.max())
    probs.append(p[a_id] / p.sum())
  return float(np.mean(probs))


def test_guess_stage_makes_answer_only_solutions_the_likely_start(tmp_path):
  config = tiny_cpu_config()
  config.data.synthetic.update(dict(num_train=400, num_test=40, max_ops=1))
  config.sft.update(dict(steps=30, batch_size=16, seq_bucket=48, warmup_steps=2))
  train = load_split("synthetic", "train", str(tmp_path / "tfds"), None,
                     config=config.data.synthetic.to_dict())
  prompts = [draw_example(SyntheticConfig(**config.data.synthetic.to_dict()), "test", i)
             ["prompt"] for i in range(20)]
  plain = prepare_policy(config, tmp_path / "plain", train, log=lambda m: None)
  config.sft.update(dict(guess_stage_steps=30, guess_stage_prob=0.95))
  staged = prepare_policy(config, tmp_path / "staged", train, log=lambda m: None)
  assert json.loads((staged / SFT_MARKER).read_text())["guess_stage_steps"] == 30
  # Without the stage no solution starts with "answer" (the data always writes the
  # work); after 30 steps on 95% answer-only solutions most responses would.
  assert _first_token_prob_of_answer(plain, prompts) < 0.1
  assert _first_token_prob_of_answer(staged, prompts) > 0.5


def _small_warm_start(tmp_path, steps: int):
  """A tiny model's warm start of ``steps`` steps on 100 one-step problems, and its data."""
  config = tiny_cpu_config()
  config.data.synthetic.update(dict(num_train=100, num_test=20, max_ops=1))
  config.sft.update(dict(steps=steps, batch_size=8, seq_bucket=48, warmup_steps=1))
  train = load_split("synthetic", "train", str(tmp_path / "tfds"), None,
                     config=config.data.synthetic.to_dict())
  return config, train


def test_a_full_disk_while_saving_the_warm_start_leaves_no_partial_folder(tmp_path,
                                                                           monkeypatch):
  """ENOSPC in the middle of writing the weights: one error naming the folder, no
  ``sft_model.tmp*`` left behind, and a stale one of a killed run is removed by the
  next warm start, which then succeeds."""
  import errno

  import pytest

  from sagc_jax.training import warm_start

  config, train = _small_warm_start(tmp_path, steps=2)
  workdir = tmp_path / "run"
  real_save = warm_start.save_pretrained

  def full_disk(model, cfg, folder):
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)      # half-written
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(warm_start, "save_pretrained", full_disk)
  with pytest.raises(OSError, match=r"saving the fine-tuned policy to .*sft_model\.tmp\d+ "
                     r"failed \(No space left on device\); the partial folder was removed"):
    prepare_policy(config, workdir, train, log=lambda m: None)
  assert not list(workdir.glob("sft_model*"))
  (workdir / "sft_model.tmp1").mkdir()                 # what a kill -9 would leave
  monkeypatch.setattr(warm_start, "save_pretrained", real_save)
  folder = prepare_policy(config, workdir, train, log=lambda m: None)
  assert (folder / SFT_MARKER).exists()
  assert [p.name for p in workdir.glob("sft_model*")] == ["sft_model"]


def test_a_full_disk_while_copying_the_cached_warm_start_is_one_sentence(tmp_path,
                                                                       monkeypatch):
  """ENOSPC injected into the copy of a cached warm start into the workdir: one
  sentence naming the disk's mount point and the space the copy needed (not shutil's
  list of per-file errors), and no temporary folder left in the workdir."""
  import errno
  import os
  import shutil

  import pytest

  from sagc_jax.runtime.storage import DiskFullError

  config, train = _small_warm_start(tmp_path, steps=2)
  cache = tmp_path / "cache"
  prepare_policy(config, tmp_path / "first", train, log=lambda m: None, cache=cache)
  real_copy = shutil.copyfile

  def full_disk(src, dst, **kwargs):          # what copytree's copy2 calls per file
    if os.fspath(src).endswith(".safetensors"):
      raise OSError(errno.ENOSPC, "No space left on device", dst)
    return real_copy(src, dst, **kwargs)
  monkeypatch.setattr(shutil, "copyfile", full_disk)
  workdir = tmp_path / "run"
  with pytest.raises(DiskFullError) as raised:
    prepare_policy(config, workdir, train, log=lambda m: None, cache=cache)
  message = str(raised.value)
  mount = workdir
  while not os.path.ismount(mount):
    mount = mount.parent
  assert message.startswith(f"the disk at {mount} is full: copying ")
  assert " MiB and " in message and "MiB are free" in message
  assert "\n" not in message and "[" not in message and "Errno" not in message
  assert not list(workdir.glob("sft_model*"))


def test_a_warm_start_with_the_same_settings_is_copied_from_the_cache(tmp_path):
  """The main job's warm start serves a later comparison or workdir with the same
  model, data, sft settings and seed: the same weights, copied, not fine-tuned again;
  any of those settings changed fine-tunes anew."""
  from sagc_jax.training.warm_start import warm_start_key

  config, train = _small_warm_start(tmp_path, steps=3)
  cache = tmp_path / "cache"
  said = []
  first = prepare_policy(config, tmp_path / "main", train, log=said.append, cache=cache)
  assert any(m.startswith("supervised warm start: 3 steps") for m in said)
  kept = cache / "warm_starts" / warm_start_key(config)
  assert (kept / SFT_MARKER).exists() and not list(kept.parent.glob("*.tmp*"))

  said.clear()
  second = prepare_policy(config, tmp_path / "compare" / "shared", train, log=said.append,
                          cache=cache)
  assert not any(m.startswith("supervised warm start:") for m in said), said
  assert any("copied from" in m and str(kept) in m for m in said), said
  assert ((first / "model.safetensors").read_bytes()
          == (second / "model.safetensors").read_bytes())

  for change in (("sft", "steps", 4), ("seed", None, 1), ("synthetic", "max_ops", 2)):
    other = config.copy_and_resolve_references()
    section, key, value = change
    if section == "seed":
      other.seed = value
    elif section == "sft":
      other.sft[key] = value
    else:
      other.data.synthetic[key] = value
    assert warm_start_key(other) != warm_start_key(config), change


def test_the_warm_start_prints_progress_at_least_every_ten_seconds(tmp_path, monkeypatch):
  """A progress line at the first and the last step and whenever 10 s passed since the
  previous one (not every 50 steps: under load those were 50-80 s apart)."""
  from sagc_jax.models import build_tiny_checkpoint
  from sagc_jax.training import sft

  model, _ = from_pretrained(build_tiny_checkpoint(tmp_path / "tiny", seed=0))
  import types

  clock = iter(np.arange(0.0, 1000.0, 3.0))          # every reading is 3 s later
  monkeypatch.setattr(sft, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
  rng = np.random.default_rng(0)
  ids = rng.integers(3, 20, (8, 12)).astype(np.int32)
  mask = np.ones_like(ids, bool)
  lines = []
  sft.supervised_finetune(model, ids, mask, mask, steps=12, batch_size=4, lr=1e-3,
                          warmup_steps=1, seed=0, log=lines.append)
  steps = [int(line.split()[2].split("/")[0]) for line in lines]
  assert steps[0] == 1 and steps[-1] == 12 and 3 <= len(lines) < 12, lines
  assert all("eta" in line and "steps/s" in line for line in lines)


def test_a_workdir_on_a_full_tmpfs_is_refused_in_one_line(commands, tmp_path):
  """The train command on a small tmpfs workdir whose free space holds the tiny model
  once but not twice: the copy of the cached warm start fails, and the command says so
  in one line (exit 2) naming the disk, with no temporary folder left. Needs root and
  tmpfs (skipped elsewhere)."""
  from small_disk import tmpfs, train as train_command

  from sagc_jax.training.warm_start import warm_start_key

  config, train = _small_warm_start(tmp_path, steps=2)
  cache = tmp_path / "cache"
  prepare_policy(config, tmp_path / "first", train, log=lambda m: None, cache=cache)
  kept = cache / "warm_starts" / warm_start_key(config)
  size = sum(p.stat().st_size for p in kept.rglob("*") if p.is_file())
  with tmpfs(tmp_path / "small", "12m", free=size + (1 << 19)) as small:
    proc = train_command(commands, tmp_path, small / "run", cache,
                         f"c.data.data_dir = {str(tmp_path / 'tfds')!r}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[-1].startswith(f"error: the disk at {small} is full: copying {kept}"), lines
    assert "Traceback" not in proc.stderr
    assert not list((small / "run").glob("sft_model*"))
