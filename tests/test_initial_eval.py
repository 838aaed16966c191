"""The key and the folder that let runs reuse an evaluation before RL
(``experiments.initial_eval``): what changes the key, what does not, damaged files and a
folder that cannot be written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sagc_jax.config import preset, validate
from sagc_jax.experiments.initial_eval import (InitialEvaluationStore, initial_eval_key,
                                            reuse_or_evaluate)

MESH = {"data": 2, "model": 1}
EXAMPLES = [{"prompt": "1 + 2 = ?", "answer": "3"}, {"prompt": "2 * 3 = ?", "answer": "6"}]
PROMPT_IDS = [[5, 6, 7], [5, 8, 7]]


def weights(value=0.0):
  return {"layer": {"kernel": np.full((3, 4), value, np.float32)},
          "norm": np.ones((4,), np.float32)}


def key(config=None, variables=None, mesh=MESH, examples=EXAMPLES, prompt_ids=PROMPT_IDS,
        stop_ids=(2,), pad_id=0):
  return initial_eval_key(validate(config or preset("grpo", "sagc")), variables or weights(), mesh,
                          examples, prompt_ids, stop_ids, pad_id)


def test_the_key_follows_weights_and_evaluation_settings_but_not_the_controller():
  base = key()
  assert key() == base
  other_controller = preset("grpo", "static")
  other_controller.controller.static_g = 16
  assert key(other_controller) == base
  one_weight = weights()
  one_weight["layer"]["kernel"][2, 3] = np.float32(1e-30)     # one value, few bits
  assert key(variables=one_weight) != base
  assert key(mesh={"data": 1, "model": 2}) != base
  for section, name, value in [("rollout", "temperature", 0.7), ("data", "eval_examples", 17),
                               ("train", "eval_k", 4), ("train", "eval_greedy", False),
                               ("reward", "format_weight", 0.5), ("seed", None, 1)]:
    changed = preset("grpo", "sagc")
    if name is None:
      changed[section] = value
    else:
      changed[section][name] = value
    assert key(changed) != base, (section, name)


def test_the_key_follows_what_the_evaluation_reads():
  base = key()
  assert key(examples=[EXAMPLES[0], {"prompt": "2 * 3 = ?", "answer": "5"}]) != base
  assert key(prompt_ids=[[5, 6, 7], [5, 8, 9]]) != base       # another tokenizer or template
  assert key(stop_ids=(2, 3)) != base and key(pad_id=1) != base


def test_with_eval_k_the_straggler_profile_s_controller_settings_enter_the_key():
  """eval_k > 1 reports each candidate G's straggler profile at tau: a static arm and
  SAGC evaluate differently then."""
  def with_k(kind, tau=1.8):
    config = preset("grpo", kind)
    config.train.eval_k = 8
    config.controller.tau = tau
    return config
  assert key(with_k("sagc")) != key(with_k("static"))
  assert key(with_k("sagc")) != key(with_k("sagc", tau=2.0))


def test_the_key_follows_the_model_folder_s_files_and_the_environment(tmp_path, monkeypatch):
  folder = tmp_path / "policy"
  folder.mkdir()
  (folder / "tokenizer.json").write_text('{"version": 1}')
  (folder / "model.safetensors").write_bytes(b"weights: hashed from the arrays instead")
  config = preset("grpo", "sagc")
  config.model.path = str(folder)
  base = key(config)
  (folder / "model.safetensors").write_bytes(b"another file of the same weights")
  assert key(config) == base
  (folder / "tokenizer.json").write_text('{"version": 2}')
  changed = key(config)
  assert changed != base
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_fast_math=true")
  assert key(config) != changed


@pytest.mark.parametrize("text, problem", [
    ('{"evaluation": ', "Expecting"),                            # truncated
    ("[]", "holds a list"),
    ('{"evaluation": {"eval_seconds": 1.0}, "sampled_correct": [1, 0]}', "eval_sampled_accuracy"),
    ('{"evaluation": {"eval_sampled_accuracy": 0.5}, "sampled_correct": null}', "no per-example"),
    ('{"evaluation": {"eval_sampled_accuracy": 0.5}, "sampled_correct": [1]}', "1 per-example"),
])
def test_a_damaged_file_is_named_and_the_evaluation_is_measured_again(tmp_path, text, problem):
  store = InitialEvaluationStore(tmp_path, "k")
  store.path.write_text(text)
  lines, calls = [], []

  def evaluate():
    calls.append(1)
    return {"eval_sampled_accuracy": 0.5, "eval_seconds": 2.0}

  evaluation, correct = reuse_or_evaluate(store, evaluate, lambda: np.array([1, 0], np.int8),
                                          2, "run-a", lines.append)
  assert calls == [1] and evaluation == {"eval_sampled_accuracy": 0.5, "eval_seconds": 2.0}
  assert str(store.path) in lines[0] and problem in lines[0] and "evaluating again" in lines[0]
  assert store.load(2)[0] == evaluation and store.load(2)[2] == "run-a"   # rewritten whole
  again, correct_again = reuse_or_evaluate(store, evaluate, lambda: None, 2, "run-b",
                                           lines.append)
  assert calls == [1] and again["eval_reused"] == 1.0
  assert again["eval_sampled_accuracy"] == 0.5 and correct_again.tolist() == [1, 0]
  assert "run-a" in lines[-1]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json"]     # no partial file


def test_a_folder_that_cannot_be_written_costs_a_warning_not_the_evaluation(tmp_path):
  blocker = tmp_path / "not_a_folder"
  blocker.write_text("a file where the folder should be")
  store = InitialEvaluationStore(blocker / "initial_eval", "k")
  lines = []
  evaluation, correct = reuse_or_evaluate(
      store, lambda: {"eval_sampled_accuracy": 0.25}, lambda: np.array([1, 0, 0, 0]), 4,
      "run-a", lines.append)
  assert evaluation == {"eval_sampled_accuracy": 0.25} and correct.tolist() == [1, 0, 0, 0]
  assert len(lines) == 1 and "could not keep" in lines[0] and "the run goes on" in lines[0]


def test_a_remote_folder_is_refused_at_start_up_naming_the_key():
  config = preset("grpo", "sagc")
  config.train.initial_eval_dir = "gs://bucket/initial_eval"
  with pytest.raises(ValueError, match="train.initial_eval_dir='gs://bucket/initial_eval' "
                                       "must be a local folder"):
    validate(config)


def test_a_kept_file_is_json_a_person_can_read(tmp_path):
  store = InitialEvaluationStore(tmp_path, "k")
  store.save({"eval_sampled_accuracy": 0.5}, np.array([1, 0], np.int8), "runs/x")
  assert json.loads(store.path.read_text()) == {
      "evaluation": {"eval_sampled_accuracy": 0.5}, "sampled_correct": [1, 0],
      "measured_by": "runs/x"}
