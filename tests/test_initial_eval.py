"""The key and the folder that let runs reuse an evaluation before RL
(``training.initial_eval``): what changes the key, what does not, damaged files."""

from __future__ import annotations

import numpy as np

from sagc_jax.config import preset
from sagc_jax.training.initial_eval import (InitialEvaluationStore, initial_eval_key,
                                            reuse_or_evaluate)

MESH = {"data": 2, "model": 1}


def weights(value=0.0):
  return {"layer": {"kernel": np.full((3, 4), value, np.float32)},
          "norm": np.ones((4,), np.float32)}


def test_the_key_follows_weights_and_evaluation_settings_but_not_the_controller():
  config = preset("grpo", "sagc")
  base = initial_eval_key(config, weights(), MESH)
  assert initial_eval_key(config, weights(), MESH) == base
  other_controller = preset("grpo", "static")
  other_controller.controller.static_g = 16
  assert initial_eval_key(other_controller, weights(), MESH) == base
  one_weight = weights()
  one_weight["layer"]["kernel"][2, 3] = np.float32(1e-30)     # one value, few bits
  assert initial_eval_key(config, one_weight, MESH) != base
  assert initial_eval_key(config, weights(), {"data": 1, "model": 2}) != base
  for section, key, value in [("rollout", "temperature", 0.7), ("data", "eval_examples", 17),
                              ("train", "eval_k", 4), ("train", "eval_greedy", False),
                              ("reward", "format_weight", 0.5)]:
    changed = preset("grpo", "sagc")
    changed[section][key] = value
    assert initial_eval_key(changed, weights(), MESH) != base, (section, key)
  reseeded = preset("grpo", "sagc")
  reseeded.seed = config.seed + 1
  assert initial_eval_key(reseeded, weights(), MESH) != base


def test_a_damaged_file_is_named_and_the_evaluation_is_measured_again(tmp_path):
  store = InitialEvaluationStore(tmp_path, "k")
  store.path.write_text('{"evaluation": ')
  lines, calls = [], []

  def evaluate():
    calls.append(1)
    return {"eval_sampled_accuracy": 0.5, "eval_seconds": 2.0}

  evaluation, correct = reuse_or_evaluate(store, evaluate, lambda: np.array([1, 0], np.int8),
                                          "run-a", lines.append)
  assert calls == [1] and evaluation == {"eval_sampled_accuracy": 0.5, "eval_seconds": 2.0}
  assert lines and str(store.path) in lines[0] and "evaluating again" in lines[0]
  assert store.load()[0] == evaluation and store.load()[2] == "run-a"   # rewritten whole
  again, correct_again = reuse_or_evaluate(store, evaluate, lambda: None, "run-b",
                                           lines.append)
  assert calls == [1] and again["eval_reused"] == 1.0
  assert again["eval_sampled_accuracy"] == 0.5 and correct_again.tolist() == [1, 0]
  assert "run-a" in lines[-1]
  assert not list(tmp_path.glob("*.partial"))
