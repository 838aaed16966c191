"""The evaluation before RL, kept once and reused by the runs that would repeat it.

Every run of a comparison starts from one shared policy, and the held-out evaluation
draws its random numbers with fixed seeds in a fixed batch layout that does not depend
on the controller (``training.build.build_eval_samplers``). The runs of one seed
therefore compute the same evaluation before RL, number for number: on a real model
an evaluation costs several steps. With ``train.initial_eval_dir``
set (``sagc_jax.compare`` sets ``<workdir>/shared/initial_eval``), the training command
passes ``reuse_before_rl`` to the trainer's ``before_rl`` hook: a run keeps its
evaluation before RL in that folder under a key of what the evaluation depends on, and
a later run with the same key reads it instead of evaluating. The training loop itself
knows nothing of this cache.

The key is a SHA-256 over every byte of the policy's weights and the settings that
decide the evaluation: ``seed``, ``data``, ``mesh`` (and the mesh's resolved shape),
``model``, ``reward``, ``rollout``, ``train.eval_greedy`` and ``train.eval_k`` (with
``eval_k`` > 1 also ``controller.tau`` and the candidate sizes, which the straggler
profile uses). The runs of a comparison share one machine, one install and one
source tree, which the key does not see: that is why the folder is per comparison and
local. One process only: on a pod every run evaluates (the file would have to reach
every host).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np


__all__ = ["InitialEvaluationStore", "initial_eval_key", "reuse_before_rl", "reuse_or_evaluate"]

_EVALUATION_SETTINGS = ("data", "mesh", "model", "reward", "rollout")


def initial_eval_key(config: Any, variables: Any, mesh_shape: dict[str, int]) -> str:
  """The key of a run's evaluation before RL (see the module docstring): ``variables``
  the policy's weights, hashed one leaf (path, dtype, shape and bytes) on the host at
  a time."""
  settings = {"seed": config.seed, "mesh_shape": dict(mesh_shape),
              **{name: getattr(config, name).to_dict() for name in _EVALUATION_SETTINGS},
              "eval_greedy": config.train.eval_greedy, "eval_k": config.train.eval_k}
  if settings["eval_k"] > 1:        # the straggler profile of the k samples
    settings["controller"] = {"tau": config.controller.tau,
                              "sizes": list(config.group_sizes())}
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]:
    array = np.asarray(jax.device_get(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()[:32]


class InitialEvaluationStore:
  """The evaluations before RL in ``directory``, one JSON file per key."""

  def __init__(self, directory: str | os.PathLike, key: str):
    self.path = Path(directory) / f"{key}.json"

  def load(self, examples: int) -> tuple[dict[str, float], np.ndarray, str] | None:
    """(evaluation, per-example sampled correctness, the run that measured it), or
    None when no run kept an evaluation under this key. Raises ``ValueError`` naming
    what is wrong with a file that is not a kept evaluation of ``examples`` examples."""
    if not self.path.exists():
      return None
    saved = json.loads(self.path.read_text())
    if not isinstance(saved, dict):
      raise ValueError(f"holds a {type(saved).__name__}, not an object")
    evaluation, correct = saved.get("evaluation"), saved.get("sampled_correct")
    if not isinstance(evaluation, dict) or not isinstance(
        evaluation.get("eval_sampled_accuracy"), (int, float)):
      raise ValueError("has no evaluation with eval_sampled_accuracy")
    if not isinstance(correct, list) or len(correct) != examples:
      raise ValueError(f"has {len(correct) if isinstance(correct, list) else 'no'} "
                       f"per-example results; this run evaluates {examples} examples")
    return evaluation, np.asarray(correct, np.int8), str(saved.get("measured_by", "?"))

  def save(self, evaluation: dict[str, float], sampled_correct: np.ndarray,
           measured_by: str) -> None:
    """Keeps an evaluation (written to a partial file, then renamed: a reader never
    sees half a file, and a write that fails leaves nothing behind)."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    partial = self.path.with_name(f".{self.path.name}.partial")
    try:
      partial.write_text(json.dumps({"evaluation": evaluation,
                                     "sampled_correct": np.asarray(sampled_correct).tolist(),
                                     "measured_by": measured_by}))
      os.replace(partial, self.path)
    finally:
      partial.unlink(missing_ok=True)


def reuse_or_evaluate(store: InitialEvaluationStore | None, evaluate: Callable[[], dict],
                      sampled_correct: Callable[[], np.ndarray], examples: int,
                      measured_by: str, log: Callable[[str], None]
                      ) -> tuple[dict[str, float], np.ndarray]:
  """The evaluation before RL: the stored one when ``store`` has it, else
  ``evaluate()`` (then kept in ``store``). Returns it with its per-example sampled
  correctness. A reused evaluation's ``eval_seconds`` is the time spent reading it;
  ``eval_reused`` is 1.0. A file that cannot be read, or a folder that cannot be
  written, costs a warning, never the run or its evaluation."""
  start = time.perf_counter()
  kept = None
  if store is not None:
    try:
      kept = store.load(examples)
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as err:
      log(f"warning: {store.path} is not a kept evaluation ({err}); evaluating again")
  if kept is None:
    evaluation = evaluate()
    if store is not None:
      try:
        store.save(evaluation, sampled_correct(), measured_by)
      except OSError as err:
        log(f"warning: could not keep the evaluation before RL in {store.path} ({err}); "
            "the run goes on")
    return evaluation, sampled_correct()
  evaluation, correct, source = kept
  log(f"eval before RL: reusing the evaluation {source} measured from the same weights "
      f"and evaluation settings ({store.path})")
  evaluation = dict(evaluation, eval_seconds=time.perf_counter() - start, eval_reused=1.0)
  return evaluation, correct


def reuse_before_rl(directory: str) -> Callable[[Any], dict[str, float]]:
  """The trainer's ``before_rl`` hook that keeps the evaluation before RL in
  ``directory`` and reuses a kept one with the same key (module docstring)."""

  def before_rl(trainer: Any) -> dict[str, float]:
    from flax import nnx

    evaluator = trainer.evaluator
    store = None
    if jax.process_count() == 1:
      key = initial_eval_key(trainer.config, nnx.state(trainer.model, nnx.Param),
                             dict(trainer.inputs.mesh.shape))
      store = InitialEvaluationStore(directory, key)
    evaluation, correct = reuse_or_evaluate(
        store, lambda: trainer.evaluate_with_lines("before RL"),
        lambda: evaluator.sampled_correct, evaluator.examples(), str(trainer.workdir),
        trainer.log)
    if evaluation.get("eval_reused"):
      evaluator.sampled_correct = correct
      evaluator.log_result("before RL", evaluation)
    return evaluation

  return before_rl
