"""The sampler benchmark's FLOP accounting counts the matmuls the model really has; the
real-model option of ``bench sampler`` / ``bench learner`` runs end to end."""

import json
import os
import subprocess

import jax
import numpy as np
import pytest
from flax import nnx

from sagc_jax.bench.sampler import _gflop_per_token, _projection_shapes, small_config
from sagc_jax.models import init_model, tiny_config


@pytest.mark.parametrize("make_config", [tiny_config, small_config])
def test_projection_shapes_are_the_models_matrices(make_config):
  """Every 2-D parameter is multiplied once per token, except an untied input
  embedding (a lookup); a tied one is the output head and is counted once."""
  cfg = make_config()
  state = nnx.state(init_model(cfg, seed=0))
  matrices = sum(x.size for x in jax.tree.leaves(state) if x.ndim == 2)
  lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
  weights = sum(a * b for a, b in _projection_shapes(cfg))
  assert weights == matrices - lookup
  assert _gflop_per_token(cfg, context=0) == pytest.approx(2 * weights / 1e9)
  # Attention adds q.k and p.v over the context: 4 FLOPs per head dim per slot.
  extra = _gflop_per_token(cfg, context=100) - _gflop_per_token(cfg, context=0)
  assert extra == pytest.approx(4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 100 / 1e9)


# ----------------------------------------------------------------- real-model option
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
  """The built-in tiny Llama as an HF folder (character tokenizer, no chat template:
  the prompts are the word problems' plain text)."""
  from sagc_jax.models import build_tiny_checkpoint

  return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_hf") / "model", seed=0)


def _bench(args, out):
  from sagc_jax.bench.__main__ import main

  assert main([*args, "--rows", "4", "--max_new_tokens", "16", "--out", str(out)]) == 0
  return json.loads(out.read_text())


def test_real_model_sampler_reports_natural_rollouts_of_both_stacks(tiny_folder, tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  r = _bench(["sampler", "--model", str(tiny_folder)], tmp_path / "sampler.json")
  assert r["benchmark"] == "sampler" and r["kind"] == "real_model_sampler"
  assert r["chat_template"] is False and r["max_new_tokens"] == 16 and r["group"] == 4
  (row,) = r["rows_table"]
  assert row["rows"] == 4 and row["prompts"] == 1 and row["prompt_bucket"] >= 128
  for side in (row["ours"], row["hf"]):
    assert side["tokens_per_s"] > 0 and side["generated_tokens"] > 0 and side["seconds"] > 0
    assert 1 <= side["length"]["max"] <= 16 and 0 <= side["length"]["cut_share"] <= 1
  assert row["speedup"] > 0 and row["wall_ratio"] > 0
  assert row["compiles_after_warmup"] == 0 == r["compiles_after_warmup"]


def test_real_model_learner_reports_both_layouts_on_sampled_lengths(tiny_folder, tmp_path):
  pytest.importorskip("transformers")                     # the tokenizer
  r = _bench(["learner", "--model", str(tiny_folder), "--steps", "1"], tmp_path / "learner.json")
  assert r["benchmark"] == "learner" and r["kind"] == "real_model_learner"
  assert r["rows"] == 4 and r["response_buckets"] == [16]
  assert r["steps"] == 2 and r["timed_steps"] == 1
  assert 1 <= r["response_length"]["max"] <= 16
  assert 0 < r["padding_efficiency"] <= 1 and 0 < r["unpacked_padding_efficiency"] <= 1
  assert r["real_tokens_per_s"] > 0 and r["unpacked_real_tokens_per_s"] > 0
  assert r["compiles_after_warmup"] == 0


@pytest.mark.parametrize("args, named", [
    (["sampler", "--model", "/no/such/model"], "--model='/no/such/model'"),
    (["learner", "--model", "missing.gguf"], "--model='missing.gguf'"),
    (["controller", "--model", "smollm2-135m-instruct"], "--model="),
    (["sampler", "--model", "x", "--rows", "6"], "--rows"),
    (["sampler", "--rows", "8"], "--rows needs --model"),
    (["sampler", "--peer_python", "/bin/sh"], "only the heavy_tail and learner"),
    (["heavy_tail", "--peer_python", "/no/such/python"], "--peer_python='/no/such/python'"),
    (["learner", "--model", "x", "--peer_python", "/bin/sh"], "runs on the tiny model"),
    (["heavy_tail", "--model", "x", "--rows", "8"], "--rows")])
def test_a_bad_real_model_flag_is_one_argparse_error(args, named, capsys):
  from sagc_jax.bench.__main__ import main

  with pytest.raises(SystemExit) as exit_info:
    main(args)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("python -m sagc_jax.bench: error:") and named in err[-1]


@pytest.mark.slow
def test_heavy_tail_scenario_reports_refill_against_subcalls_and_fused():
  from sagc_jax.bench import heavy_tail

  targets = heavy_tail.lognormal_targets(64, 8.0, 1.0, 64)
  assert targets[0] >= 1 and targets[-1] <= 64 and list(targets) == sorted(targets)
  r = heavy_tail.run(1, max_new_tokens=64, median=8.0, slots=16, log=lambda m: None)
  assert set(r["samplers"]) == {"refill", "subcalls", "fused"}
  assert r["heavy_tail_greedy_match"] == 1.0 and r["heavy_tail_compiles_after_warmup"] == 0
  assert r["forced_lengths_equal_measured"] and len(r["lengths"]) == 64
  assert r["heavy_tail_refill_over_subcalls"] > 0 and r["heavy_tail_refill_over_fused"] > 0
  # 16 slots never run more slot-steps than the fused sampler's 64 rows x longest row.
  steps = {k: v["decode_slots"] for k, v in r["samplers"].items()}
  assert steps["refill"] <= steps["fused"] == 64 * r["length_max"]


def test_the_peer_column_compares_tunix_row_by_row_and_refuses_another_rope_theta():
  """Tunix's response ends before its stop token (the worker adds it to the length):
  a row matches when the lengths agree and the tokens before the stop do; a model
  whose RoPE theta is not Tunix's 1e6 is refused (Tunix would run another function)."""
  import dataclasses

  from sagc_jax.bench import heavy_tail
  from sagc_jax.models import init_model, tiny_config

  tunix = {"tokens": [[5, 6], [5, 6, 7], [9]], "lengths": [3, 3, 2]}
  ours = [[5, 6, 2, 0], [5, 6, 7, 0], [8, 2, 0, 0]]
  assert heavy_tail._match(tunix, ours, [3, 3, 2]) == pytest.approx(2 / 3)
  cfg = dataclasses.replace(tiny_config(), rope_theta=1e4)
  with pytest.raises(ValueError, match=r"RoPE theta 1e\+06 .* this model has 10000"):
    heavy_tail.run(1, model=init_model(cfg), cfg=cfg, peer_python="/bin/python")


PEER_PYTHON = os.environ.get("SAGC_PEER_PYTHON", "/tmp/peers/bin/python")


def _has_tunix(python: str) -> bool:
  """Whether ``python`` exists and imports google-tunix (checked without importing JAX
  here: its own process, a short timeout)."""
  if not os.path.isfile(python):
    return False
  try:
    return subprocess.run([python, "-c", "import importlib.util, sys; sys.exit("
                           "importlib.util.find_spec('tunix') is None)"],
                          capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


@pytest.mark.skipif(not _has_tunix(PEER_PYTHON),
                    reason=f"no Python with google-tunix at {PEER_PYTHON} (set SAGC_PEER_PYTHON; "
                    "docs/benchmarks.md says how to make one)")
def test_tunix_s_grpo_step_trains_the_same_batches_and_is_timed_per_step():
  """The learner's Tunix column on two real batches: Tunix's GRPO loss on the tiny
  model's initial weights is finite, each step is timed, and the ratios are totals
  over the timed steps of Tunix's seconds over ours."""
  from sagc_jax.bench import learner
  from sagc_jax.models import tiny_config

  rng = np.random.default_rng(0)
  batches = [learner.rollout("main_job", 4, tiny_config().vocab_size, rng) for _ in range(2)]
  config = learner._learners(0)[True].config
  ours = {"packed_step_seconds": [9.0, 2.0], "padded_step_seconds": [9.0, 4.0]}
  r = learner.tunix_column(PEER_PYTHON, 0, config, batches, 1, ours, log=lambda m: None)
  assert len(r["tunix_seconds"]) == 2 and all(t > 0 for t in r["tunix_seconds"])
  assert all(np.isfinite(r["tunix_losses"]))
  assert r["packed_over_tunix"] == pytest.approx(r["tunix_seconds"][1] / 2.0)
  assert r["padded_over_tunix"] == pytest.approx(r["tunix_seconds"][1] / 4.0)
  tokens = int(batches[1].lengths.sum())
  assert r["tunix_real_tokens_per_s"] == pytest.approx(tokens / r["tunix_seconds"][1])


def test_tunix_gets_the_advantages_our_grpo_learner_trains_on():
  """GRPO: (s - group mean) / (unbiased group std + eps), a numpy re-derivation (the
  batch's groups are contiguous rows)."""
  from sagc_jax.bench import learner

  batch = learner.rollout("main_job", 4, tiny_config().vocab_size, np.random.default_rng(1))
  config = learner._learners(0)[True].config
  groups = [batch.scores[batch.group_ids == g] for g in np.unique(batch.group_ids)]
  expected = np.concatenate([(s - s.mean()) / (s.std(ddof=1) + config.adv_eps)
                             for s in groups])
  np.testing.assert_allclose(learner.tunix_advantages(batch, config), expected, rtol=1e-5,
                             atol=1e-6)


def test_with_rope_theta_links_the_weights_and_rewrites_only_the_config(tmp_path):
  import json

  from sagc_jax.bench.real_model import with_rope_theta

  src = tmp_path / "m"
  src.mkdir()
  (src / "config.json").write_text(json.dumps({"rope_parameters": {"rope_theta": 1e5},
                                               "hidden_size": 8}))
  (src / "model.safetensors").write_bytes(b"weights")
  out = with_rope_theta(src, 1e6)
  config = json.loads((out / "config.json").read_text())
  assert config["rope_parameters"]["rope_theta"] == 1e6 and config["hidden_size"] == 8
  assert (out / "model.safetensors").is_symlink()
  assert (out / "model.safetensors").read_bytes() == b"weights"
  assert json.loads((src / "config.json").read_text())["rope_parameters"]["rope_theta"] == 1e5
