"""Tests of sagc_jax.models against transformers (the independent reference).

Tiny random HF checkpoints (see ``hf_fixtures``) are loaded with ``from_pretrained`` and
must reproduce transformers' float32 logits to 1e-4, for every family and switch:
Llama with and without ``llama3`` RoPE scaling, tied and untied heads, Qwen2 biases,
Qwen3 q/k norms with head_dim != hidden/heads. The KV cache, padding, sharded loading on
8 fake CPU devices (tests/conftest.py), the
save -> transformers round trip, sharded safetensors, bf16, error reporting, the offline
tokenizer and the tiny checkpoint builder are checked too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

import hf_fixtures as hf
from sagc_jax.models import (ModelConfig, build_tiny_checkpoint, build_tiny_tokenizer,
                             encode_prompts, from_pretrained, init_cache, init_model,
                             load_tokenizer, pad_prompts, read_config, real_token_positions,
                             save_pretrained, tiny_config)
from sagc_jax.models import rope as rope_lib

pytest.importorskip("torch")
pytest.importorskip("transformers")

ATOL = 1e-4
SEQ = 160  # > original_max_position_embeddings=64 of the llama3 cases
REPO = Path(__file__).resolve().parents[1]
MAX_DIFFS: dict[str, float] = {}


class Checkpoints:
  """Builds each reference checkpoint once per module, on first use."""

  def __init__(self, root: Path):
    self.root = root
    self.ids = np.random.default_rng(0).integers(0, hf.COMMON["vocab_size"], (2, SEQ))
    self._built: dict[str, tuple[Path, object, np.ndarray]] = {}
    self._loaded: dict[str, tuple] = {}

  def get(self, name: str) -> tuple[Path, object, np.ndarray]:
    """(folder, torch model, reference logits of ``self.ids``)."""
    if name not in self._built:
      model = hf.build_hf_model(hf.CASES[name])
      folder = hf.save_hf_model(model, self.root / name)
      self._built[name] = (folder, model, hf.hf_logits(model, self.ids))
    return self._built[name]

  def load(self, name: str):
    """Our (model, cfg) loaded from the checkpoint in float32."""
    if name not in self._loaded:
      self._loaded[name] = from_pretrained(self.get(name)[0])
    return self._loaded[name]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> Checkpoints:
  return Checkpoints(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module", autouse=True)
def report_diffs():
  yield
  if MAX_DIFFS:
    print("\nmax |logit diff| vs transformers (float32):")
    for name, diff in sorted(MAX_DIFFS.items()):
      print(f"  {name:28s} {diff:.2e}")


def _forward(model, ids, mask=None):
  return np.asarray(nnx.jit(lambda m, i, k: m(i, attention_mask=k))(
      model, jnp.asarray(ids), None if mask is None else jnp.asarray(mask)))


def _max_diff(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# ---------------------------------------------------------------------------- parity


@pytest.mark.parametrize("name", sorted(hf.CASES))
def test_logits_match_transformers(ckpts, name):
  _, _, ref = ckpts.get(name)
  model, cfg = ckpts.load(name)
  case = hf.CASES[name]
  assert cfg.model_type == case.family and cfg.tie_word_embeddings == case.tied
  assert (model.lm_head is None) == case.tied
  out = np.asarray(model(jnp.asarray(ckpts.ids)))  # eager, default positions, no mask
  assert out.dtype == np.float32 and out.shape == ref.shape
  diff = _max_diff(out, ref)
  MAX_DIFFS[name] = diff
  assert np.abs(ref).max() > 1.0  # the reference is far from trivial
  assert diff <= ATOL, f"{name}: max abs logit diff {diff}"


def test_family_switches_are_read(ckpts):
  _, cfg2 = ckpts.load("qwen2_untied")
  assert cfg2.qkv_bias and not cfg2.o_bias and not cfg2.qk_norm and cfg2.rope_theta == 1e6
  _, cfg3 = ckpts.load("qwen3")
  assert cfg3.qk_norm and not cfg3.qkv_bias and cfg3.head_dim == 32
  assert cfg3.head_dim != cfg3.hidden_size // cfg3.num_heads
  _, cfgl = ckpts.load("llama3_tied")
  assert cfgl.rope_scaling is not None and cfgl.rope_scaling.factor == 8.0
  assert cfgl.rope_scaling.original_max_position_embeddings == 64


def test_llama3_scaling_is_needed(ckpts, tmp_path):
  """The scaled checkpoints would fail parity if the scaling were ignored."""
  folder, _, ref = ckpts.get("llama3_untied")
  scaled = read_config(folder)
  plain = ModelConfig(**{**scaled.__dict__, "rope_scaling": None})
  assert not np.allclose(rope_lib.inv_frequencies(scaled), rope_lib.inv_frequencies(plain))
  unscaled = tmp_path / "unscaled"
  shutil.copytree(folder, unscaled)
  config = json.loads((unscaled / "config.json").read_text())
  config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0}
  (unscaled / "config.json").write_text(json.dumps(config))
  model, cfg = from_pretrained(unscaled)
  assert cfg.rope_scaling is None
  assert _max_diff(model(jnp.asarray(ckpts.ids)), ref) > 100 * ATOL


def test_transformers4_config_dialect(ckpts):
  folder, _, _ = ckpts.get("llama3_tied")
  v5 = json.loads((folder / "config.json").read_text())
  v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
  v4["rope_theta"] = v5["rope_parameters"]["rope_theta"]
  v4["rope_scaling"] = {k: v for k, v in v5["rope_parameters"].items() if k != "rope_theta"}
  assert ModelConfig.from_hf_dict(v4) == ModelConfig.from_hf_dict(v5)
  old = {**v4, "rope_scaling": {**v4["rope_scaling"], "type": "llama3"}}
  del old["rope_scaling"]["rope_type"]
  assert ModelConfig.from_hf_dict(old) == ModelConfig.from_hf_dict(v5)


# ---------------------------------------------------------------------- padding / cache


def _padded(rows: list[np.ndarray], side: str, pad_id: int = 7):
  return pad_prompts([list(r) for r in rows], pad_id, side=side)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", ["llama3_tied", "qwen2_untied", "qwen3"])
def test_padded_batch_matches_unpadded_rows(ckpts, name, side):
  _, torch_model, _ = ckpts.get(name)
  model, _ = ckpts.load(name)
  rows = [ckpts.ids[0, :SEQ], ckpts.ids[1, :90], ckpts.ids[0, 30:41]]
  ids, mask = _padded(rows, side)
  out = _forward(model, ids, mask)
  worst = 0.0
  for i, row in enumerate(rows):
    ref = hf.hf_logits(torch_model, row[None])[0]
    worst = max(worst, _max_diff(out[i][mask[i]], ref))
  MAX_DIFFS[f"{name}_{side}_padded"] = worst
  assert worst <= ATOL


def _decode_step():
  return nnx.jit(lambda m, ids, mask, cache: m(ids, attention_mask=mask, cache=cache))


@pytest.mark.parametrize("name", ["llama3_untied", "qwen2_tied", "qwen3"])
def test_cache_decoding_matches_full_forward(ckpts, name):
  """Prefill then token-by-token decode == transformers on the whole sequence."""
  _, _, ref = ckpts.get(name)
  model, cfg = ckpts.load(name)
  ids = jnp.asarray(ckpts.ids)
  prefill, total = 100, 120
  step = _decode_step()
  cache = init_cache(cfg, 2, max_len=128)
  logits, cache = step(model, ids[:, :prefill], jnp.ones((2, prefill), bool), cache)
  outs = [np.asarray(logits)]
  for t in range(prefill, total):
    logits, cache = step(model, ids[:, t:t + 1], jnp.ones((2, 1), bool), cache)
    outs.append(np.asarray(logits))
  out = np.concatenate(outs, axis=1)
  assert int(cache.index) == total and list(np.asarray(cache.next_pos)) == [total, total]
  diff = _max_diff(out, ref[:, :total])
  MAX_DIFFS[f"{name}_cache_decode"] = diff
  assert diff <= ATOL


@pytest.mark.parametrize("side", ["left", "right"])
def test_cache_padded_prefill_then_per_row_decode(ckpts, side):
  """Rows of different prompt lengths, padded either side, decoded in a while-loop."""
  name = "qwen3"
  _, torch_model, _ = ckpts.get(name)
  model, cfg = ckpts.load(name)
  full = [ckpts.ids[0, :60], ckpts.ids[1, :45], ckpts.ids[0, 100:150]]
  prompt_lens = [40, 13, 30]
  new = 12
  prompt_ids, prompt_mask = _padded([r[:n] for r, n in zip(full, prompt_lens)], side)
  cont = np.stack([r[n:n + new] for r, n in zip(full, prompt_lens)])
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, prompt_ids, prompt_mask, cont):
    m = nnx.merge(graphdef, state)
    cache = init_cache(cfg, 3, max_len=prompt_ids.shape[1] + new)
    pre_logits, cache = m(prompt_ids, attention_mask=prompt_mask, cache=cache)

    def body(carry):
      i, cache, out = carry
      tok = jax.lax.dynamic_slice_in_dim(cont, i, 1, axis=1)
      logits, cache = m(tok, attention_mask=jnp.ones_like(tok, bool), cache=cache)
      return i + 1, cache, out.at[:, i].set(logits[:, 0])

    out = jnp.zeros((3, new, cfg.vocab_size), jnp.float32)
    _, cache, out = jax.lax.while_loop(lambda c: c[0] < new, body, (0, cache, out))
    return pre_logits, out, cache

  pre_logits, dec_logits, cache = run(state, prompt_ids, prompt_mask, cont)
  pre_logits, dec_logits = np.asarray(pre_logits), np.asarray(dec_logits)
  assert list(np.asarray(cache.next_pos)) == [n + new for n in prompt_lens]
  worst = 0.0
  for i, (row, n) in enumerate(zip(full, prompt_lens)):
    ref = hf.hf_logits(torch_model, row[None, :n + new])[0]
    worst = max(worst, _max_diff(pre_logits[i][prompt_mask[i]], ref[:n]))
    worst = max(worst, _max_diff(dec_logits[i], ref[n:n + new]))
  MAX_DIFFS[f"{name}_cache_{side}_padded"] = worst
  assert worst <= ATOL


def test_finished_rows_do_not_advance(ckpts):
  """A masked decode token (row already at EOS) is invisible to later steps."""
  _, _, ref = ckpts.get("llama_tied")
  model, cfg = ckpts.load("llama_tied")
  ids = jnp.asarray(ckpts.ids)
  step = _decode_step()
  cache = init_cache(cfg, 2, max_len=40)
  _, cache = step(model, ids[:, :20], jnp.ones((2, 20), bool), cache)
  # Row 1 "finished": its garbage token is masked out.
  junk = jnp.stack([ids[0, 20], jnp.asarray(5)])[:, None]
  _, cache = step(model, junk, jnp.asarray([[True], [False]]), cache)
  logits, cache = step(model, jnp.stack([ids[0, 21], ids[1, 20]])[:, None],
                       jnp.ones((2, 1), bool), cache)
  assert list(np.asarray(cache.next_pos)) == [22, 21]
  assert _max_diff(logits[0, 0], ref[0, 21]) <= ATOL
  assert _max_diff(logits[1, 0], ref[1, 20]) <= ATOL


def test_learner_gradients_with_padding_are_finite():
  """Per-token log-probs of a padded batch differentiate cleanly (no NaN from
  fully-masked pad queries), and pad tokens get no gradient signal through the loss."""
  cfg = dataclasses.replace(tiny_config("qwen3"), num_layers=2)
  model = init_model(cfg, seed=1)
  ids, mask = pad_prompts([[1, 5, 6, 7, 8, 2], [1, 9, 10]], pad_id=0, side="left")

  def loss_fn(m):
    logp = jax.nn.log_softmax(m(ids, attention_mask=mask)[:, :-1])
    tok_logp = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    return -(tok_logp * mask[:, 1:]).sum() / mask[:, 1:].sum()

  loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(model)
  assert np.isfinite(float(loss))
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  explicit, default = nnx.jit(lambda m: (
      m(ids, attention_mask=mask, positions=real_token_positions(mask)),
      m(ids, attention_mask=mask)))(model)
  assert _max_diff(explicit, default) == 0.0


def test_cache_overflow_is_refused(ckpts):
  model, cfg = ckpts.load("llama_tied")
  cache = init_cache(cfg, 2, max_len=8)
  with pytest.raises(ValueError, match="max_len=8"):
    model(jnp.asarray(ckpts.ids[:, :9]), cache=cache)


# ---------------------------------------------------------------------------- sharding

def _sharded_load(folder, ref, ids) -> dict:
  """Loads ``folder`` on a (2 data, 4 model) mesh of the 8 fake devices and returns the
  logit and decode differences from ``ref`` and the parameters' and cache's specs."""
  from sagc_jax.models.sharding import fit_spec

  assert jax.device_count() == 8, jax.device_count()
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  model, cfg = from_pretrained(folder, mesh=mesh)
  specs = {}
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    arr = var.get_value()
    name = ".".join(map(str, path))
    specs[name] = [str(s) for s in arr.sharding.spec]
    # Each device holds only its slice: no full copy anywhere.
    n_split = np.prod([mesh.shape[a] for a in arr.sharding.spec if a is not None])
    shard_sizes = {s.data.size for s in arr.addressable_shards}
    assert shard_sizes == {arr.size // n_split}, (name, shard_sizes, arr.shape)
    assert tuple(var.get_metadata()["out_sharding"]) == tuple(arr.sharding.spec) + (
        None,) * (arr.ndim - len(arr.sharding.spec)), name
  ids = jnp.asarray(ids)
  with jax.set_mesh(mesh):
    logits = nnx.jit(lambda m, x: m(x))(model, ids)
    cache = init_cache(cfg, 2, 32, mesh=mesh)
    step = nnx.jit(lambda m, x, c: m(x, cache=c))
    _, cache = step(model, ids[:, :16], cache)
    dec, cache = step(model, ids[:, 16:17], cache)
  sharded_init = init_model(dataclasses.replace(tiny_config("qwen3"), num_layers=1), mesh=mesh)
  return {
      "diff": float(np.abs(np.asarray(logits) - ref).max()),
      "decode_diff": float(np.abs(np.asarray(dec)[:, 0] - ref[:, 16]).max()),
      "specs": specs,
      "cache_k_spec": [str(s) for s in cache.k[0].sharding.spec],
      "cache0_k_spec": [str(s) for s in init_cache(cfg, 2, 32, mesh=mesh).k[0].sharding.spec],
      "init_q_spec": [str(s) for s in
                      sharded_init.layers[0].self_attn.q_proj.kernel[...].sharding.spec],
      "fit_uneven": [str(s) for s in fit_spec((6, 8), ("model", "model"), mesh)],
  }


def test_sharded_load_on_8_devices(ckpts):
  folder, _, ref = ckpts.get("qwen2_untied")
  result = _sharded_load(folder, ref, ckpts.ids)
  MAX_DIFFS["qwen2_untied_sharded_8dev"] = result["diff"]
  assert result["diff"] <= ATOL and result["decode_diff"] <= ATOL
  specs = result["specs"]
  assert specs["embed_tokens.weight"] == ["model", "None"]
  assert specs["lm_head.kernel"] == ["None", "model"]
  assert specs["layers.0.self_attn.q_proj.kernel"] == ["None", "model"]
  assert specs["layers.0.self_attn.q_proj.bias"] == ["model"]
  assert specs["layers.1.self_attn.o_proj.kernel"] == ["model", "None"]
  assert specs["layers.1.mlp.gate_proj.kernel"] == ["None", "model"]
  assert specs["layers.1.mlp.down_proj.kernel"] == ["model", "None"]
  assert specs["norm.weight"] in (["None"], [])
  assert result["cache0_k_spec"] == ["data", "None", "None", "None"]  # 2 KV heads, 4-way model
  assert result["cache_k_spec"][0] == "data"
  assert result["init_q_spec"] == ["None", "model"]
  assert result["fit_uneven"] == ["None", "model"]


# ---------------------------------------------------------------------- save / formats


@pytest.mark.parametrize("name", ["llama3_tied", "qwen2_untied", "qwen3", "qwen3_tied"])
def test_save_pretrained_round_trip_through_transformers(ckpts, tmp_path, name):
  from transformers import AutoModelForCausalLM

  _, _, ref = ckpts.get(name)
  model, cfg = ckpts.load(name)
  out = save_pretrained(model, cfg, tmp_path / "saved")
  files = set(os.listdir(out))
  assert {"config.json", "model.safetensors"} <= files
  if cfg.tie_word_embeddings:
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
  reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
  diff = _max_diff(hf.hf_logits(reloaded, ckpts.ids), ref)
  MAX_DIFFS[f"{name}_saved_then_transformers"] = diff
  assert diff <= ATOL
  assert read_config(out) == cfg


def test_sharded_safetensors_load_and_save(ckpts, tmp_path):
  from transformers import AutoModelForCausalLM

  _, torch_model, ref = ckpts.get("llama3_untied")
  folder = hf.save_hf_model(torch_model, tmp_path / "hf_sharded", max_shard_size="50KB")
  assert (folder / "model.safetensors.index.json").is_file()
  assert len(list(folder.glob("*.safetensors"))) > 2
  model, cfg = from_pretrained(folder)
  diff = _max_diff(model(jnp.asarray(ckpts.ids)), ref)
  MAX_DIFFS["llama3_untied_hf_sharded_files"] = diff
  assert diff <= ATOL
  ours = save_pretrained(model, cfg, tmp_path / "ours_sharded", max_shard_bytes=60_000)
  index = json.loads((ours / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 2
  reloaded = AutoModelForCausalLM.from_pretrained(str(ours)).eval()
  assert _max_diff(hf.hf_logits(reloaded, ckpts.ids), ref) <= ATOL
  assert _max_diff(from_pretrained(ours)[0](jnp.asarray(ckpts.ids)), ref) <= ATOL


def test_bfloat16_load(ckpts, tmp_path):
  folder, _, ref = ckpts.get("qwen2_untied")
  model, _ = from_pretrained(folder, dtype=jnp.bfloat16)
  dtypes = {v.get_value().dtype for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  assert dtypes == {jnp.dtype(jnp.bfloat16)}
  out = _forward(model, ckpts.ids)
  assert out.dtype == np.float32 and np.isfinite(out).all()
  diff = _max_diff(out, ref)
  MAX_DIFFS["qwen2_untied_bf16 (loose)"] = diff
  assert diff < 0.25 * np.abs(ref).max()
  # bf16 weights are saved as BF16 and read back unchanged.
  saved = save_pretrained(model, model.cfg, tmp_path / "bf16")
  assert json.loads((saved / "config.json").read_text())["dtype"] == "bfloat16"
  again, _ = from_pretrained(saved, dtype=jnp.bfloat16)
  assert _max_diff(_forward(again, ckpts.ids), out) == 0.0


# ------------------------------------------------------------------------------- errors


def _copy(ckpts, name: str, dst: Path) -> Path:
  shutil.copytree(ckpts.get(name)[0], dst)
  return dst


def _edit_tensors(folder: Path, edit) -> None:
  path = folder / "model.safetensors"
  tensors = load_file(str(path))
  edit(tensors)
  save_file(tensors, str(path), metadata={"format": "pt"})


def test_pickle_only_folder_is_refused(ckpts, tmp_path):
  folder = tmp_path / "pickled"
  folder.mkdir()
  shutil.copy(ckpts.get("llama_tied")[0] / "config.json", folder)
  (folder / "pytorch_model.bin").write_bytes(b"not unpickled")
  with pytest.raises(ValueError, match=r"pickle.*pytorch_model\.bin"):
    from_pretrained(folder)


def test_missing_tensor_is_named(ckpts, tmp_path):
  folder = _copy(ckpts, "qwen2_untied", tmp_path / "missing")
  name = "model.layers.1.self_attn.k_proj.bias"
  _edit_tensors(folder, lambda t: t.pop(name))
  with pytest.raises(ValueError, match=r"missing tensors.*" + name.replace(".", r"\.")):
    from_pretrained(folder)


def test_non_finite_tensor_is_refused_and_named(ckpts, tmp_path):
  folder = _copy(ckpts, "llama_tied", tmp_path / "nan")
  name = "model.layers.1.mlp.up_proj.weight"

  def poison(tensors):
    tensors[name] = tensors[name].copy()
    tensors[name][3, 5] = np.nan
  _edit_tensors(folder, poison)
  with pytest.raises(ValueError, match=rf"tensor '{name}' in .*model\.safetensors has NaN or "
                                       "inf values"):
    from_pretrained(folder)


def test_unexpected_tensor_is_named_and_inv_freq_ignored(ckpts, tmp_path):
  folder = _copy(ckpts, "llama_tied", tmp_path / "unexpected")
  inv = "model.layers.0.self_attn.rotary_emb.inv_freq"
  _edit_tensors(folder, lambda t: t.update({inv: np.ones(8, np.float32)}))
  from_pretrained(folder)  # a persisted rotary buffer is ignored
  name = "model.layers.0.mlp.extra_proj.weight"
  _edit_tensors(folder, lambda t: t.update({name: np.ones((2, 2), np.float32)}))
  with pytest.raises(ValueError, match=r"unexpected tensors.*extra_proj"):
    from_pretrained(folder)


def test_shape_mismatch_is_named(ckpts, tmp_path):
  folder = _copy(ckpts, "llama_tied", tmp_path / "shape")
  name = "model.layers.1.mlp.up_proj.weight"
  _edit_tensors(folder, lambda t: t.update({name: np.ones((100, 64), np.float32)}))
  with pytest.raises(ValueError, match=name.replace(".", r"\.") + r".*\(100, 64\)"):
    from_pretrained(folder)


@pytest.mark.parametrize("key,value,match", [
    ("model_type", "gpt2", "'gpt2'"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}, "'yarn'"),
    ("hidden_act", "gelu", "'gelu'"),
    ("num_key_value_heads", 3, "num_kv_heads=3"),
    ("use_sliding_window", True, "use_sliding_window"),
])
def test_unsupported_config_is_named(ckpts, tmp_path, key, value, match):
  folder = _copy(ckpts, "qwen2_tied", tmp_path / "cfg")
  config = json.loads((folder / "config.json").read_text())
  config[key] = value
  (folder / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=match):
    from_pretrained(folder)


def test_model_config_validation_names_field():
  good = tiny_config("llama").__dict__
  for field, bad in [("hidden_size", 0), ("head_dim", 31), ("rms_norm_eps", -1.0),
                     ("model_type", "mistral"), ("eos_token_ids", [2])]:
    with pytest.raises(ValueError, match=f"ModelConfig.{field}="):
      ModelConfig(**{**good, field: bad})
  with pytest.raises(ValueError, match="ModelConfig.attention_bias"):
    ModelConfig(**{**good, "model_type": "qwen2", "attention_bias": True})


# ---------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="module")
def tiny_tok_dir(tmp_path_factory) -> Path:
  return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def test_tokenizer_offline_plain_and_chat_template(tiny_tok_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  tok = load_tokenizer(tiny_tok_dir)
  text = "answer: (12 + 3) * 4 = 60\ncheck"
  [ids] = encode_prompts(tok, [text])  # no template: plain text with BOS
  assert ids[0] == tok.bos_token_id == 1 and len(ids) == len(text) + 1
  assert tok.decode(ids, skip_special_tokens=True) == text
  assert (tok.pad_token_id, tok.eos_token_id) == (0, 2)
  with pytest.raises(ValueError, match="no chat template"):
    encode_prompts(tok, [text], use_chat_template=True)

  templated = tmp_path / "templated"
  shutil.copytree(tiny_tok_dir, templated)
  config = json.loads((templated / "tokenizer_config.json").read_text())
  config["chat_template"] = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>"
                             "{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}")
  (templated / "tokenizer_config.json").write_text(json.dumps(config))
  tok = load_tokenizer(templated)
  [chat_ids], [plain_ids] = (encode_prompts(tok, ["1+1?"]),
                             encode_prompts(tok, ["1+1?"], use_chat_template=False))
  assert tok.decode(chat_ids) == "<s>user: 1+1?</s><s>assistant: "
  assert chat_ids.count(tok.bos_token_id) == 2  # no extra BOS on top of the template
  assert tok.decode(plain_ids) == "<s>1+1?"


def test_pad_prompts():
  ids, mask = pad_prompts([[5, 6, 7], [8]], pad_id=0, side="left")
  assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
  ids, mask = pad_prompts([[5, 6, 7], [8]], pad_id=0, length=4, side="right")
  assert ids.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]] and mask.sum() == 4
  with pytest.raises(ValueError, match="prompt 0 has 3 tokens > length=2"):
    pad_prompts([[5, 6, 7]], 0, length=2)


# ---------------------------------------------------------------------- tiny checkpoint


def test_tiny_checkpoint_builder_needs_no_torch(tmp_path):
  code = ("import sys; from sagc_jax.models import build_tiny_checkpoint; "
          f"build_tiny_checkpoint({str(tmp_path / 'tiny')!r}, seed=3, family='qwen2'); "
          "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
          "assert not bad, bad")
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": f"{REPO}{os.pathsep}" + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert (tmp_path / "tiny" / "tokenizer.json").is_file()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_tiny_checkpoint_loads_here_and_in_transformers(tmp_path, family):
  from transformers import AutoModelForCausalLM, AutoTokenizer

  folder = build_tiny_checkpoint(tmp_path / family, seed=0, family=family)
  model, cfg = from_pretrained(folder)
  assert cfg == tiny_config(family)
  tok = load_tokenizer(folder)
  assert len(tok) == cfg.vocab_size
  hf_tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
  text = "12 * (3 + 4) = 84\nanswer 84"
  ids, mask = pad_prompts(encode_prompts(tok, [text, "check 7-2=5"]), tok.pad_token_id)
  assert hf_tok(text)["input_ids"] == list(ids[0])
  torch_model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
  ref = hf.hf_logits(torch_model, ids[:1])
  out = _forward(model, ids, mask)
  diff = _max_diff(out[:1], ref)
  MAX_DIFFS[f"tiny_{family}_vs_transformers"] = diff
  assert diff <= ATOL
  n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert 5e5 < n_params < 2e6


def test_init_follows_each_modules_declared_kind_and_refuses_an_undeclared_one():
  """Random init reads each parameter's ``init`` metadata (set by its module), never
  its name: norms start at 1, biases at 0, matrices normal(std); a parameter whose
  module declares nothing is refused, not silently drawn from normal(0.02)."""
  from flax import nnx

  from sagc_jax.models.tiny import tiny_config
  from sagc_jax.models.transformer import _init_value, init_model
  model = init_model(tiny_config("qwen2"), seed=0, init_std=0.5)
  flat = {".".join(map(str, p)): np.asarray(v.get_value())
          for p, v in nnx.to_flat_state(nnx.state(model))}
  assert all((v == 1).all() for k, v in flat.items() if k.endswith("norm.weight"))
  assert all((v == 0).all() for k, v in flat.items() if k.endswith(".bias"))
  kernel = flat["layers.0.mlp.up_proj.kernel"]
  assert 0.4 < kernel.std() < 0.6
  with pytest.raises(ValueError, match="extra.scale declares no init kind"):
    _init_value(("extra", "scale"), nnx.Param(jnp.ones((3,))), np.random.default_rng(0), 0.02)


def _damaged(tmp_path, mutate) -> Path:
  folder = tmp_path / "model"
  build_tiny_checkpoint(folder, seed=0)
  mutate(folder)
  return folder


def _edit_config(folder, **changes):
  config = json.loads((folder / "config.json").read_text())
  config.update(changes)
  (folder / "config.json").write_text(json.dumps(config))


def _cut(path, keep):
  data = path.read_bytes()
  path.write_bytes(keep(data))


@pytest.mark.parametrize("mutate, loader, error, match", [
    (lambda d: _cut(d / "model.safetensors", lambda b: b[:len(b) // 2]), "model", ValueError,
     r"model\.safetensors is not a readable safetensors file \(.*\); re-download"),
    (lambda d: _cut(d / "model.safetensors", lambda b: b"\xff" * 16 + b[16:]), "model",
     ValueError, r"model\.safetensors is not a readable safetensors file"),
    (lambda d: (d / "config.json").write_text("{not json"), "model", ValueError,
     r"config\.json is not valid JSON"),
    (lambda d: _edit_config(d, architectures=["Qwen2ForCausalLM"]), "model", ValueError,
     r"architectures=\['Qwen2ForCausalLM'\] disagree with model_type='llama'"),
    (lambda d: _edit_config(d, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                            rope_scaling={"rope_type": "yarn", "factor": 4.0}), "model",
     ValueError, r"rope_parameters says rope_type='default' but rope_scaling says 'yarn'"),
    (lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")],
     "tokenizer", FileNotFoundError,
     r"has none of the tokenizer files \['tokenizer.json', 'tokenizer.model', 'vocab.json'\]"),
])
def test_damaged_or_inconsistent_checkpoint_folders_are_refused_naming_the_file(
    tmp_path, mutate, loader, error, match):
  """#16: one clear error naming the file or the disagreeing keys, never a loader
  traceback and never a silent load with other settings than transformers uses."""
  folder = _damaged(tmp_path, mutate)
  with pytest.raises(error, match=match) as info:
    from_pretrained(folder) if loader == "model" else load_tokenizer(folder)
  if "safetensors" in match or "JSON" in match:            # the file is named in full
    assert str(folder) in str(info.value)


def test_train_cli_reports_a_truncated_checkpoint_in_one_line(tmp_path):
  folder = _damaged(tmp_path, lambda d: _cut(d / "model.safetensors", lambda b: b[:100]))
  proc = subprocess.run([sys.executable, "-m", "sagc_jax.train",
                         f"--config={Path(__file__).resolve().parents[1] / 'configs/tiny_cpu.py'}",
                         f"--workdir={tmp_path / 'run'}", f"--config.model.path={folder}"],
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "model.safetensors is not a readable" in last
  assert "Traceback" not in proc.stderr
