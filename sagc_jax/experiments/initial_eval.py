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

The key is a SHA-256 over
* every byte of the policy's weights, and of the other files of its folder
  (``model.path``: tokenizer, chat template, generation config);
* what the evaluation reads: its held-out examples (prompt, answer), their prompt token
  ids, the stop and pad ids;
* the settings that decide it: ``seed``, ``data``, ``mesh``, ``model``, ``reward``,
  ``rollout``, ``train.eval_greedy`` and ``train.eval_k`` (with ``eval_k`` > 1 also
  ``controller.tau`` and the candidate sizes, which the straggler profile uses);
* the devices (platform and its version, kind, count, mesh shape), the versions of
  jax, jaxlib and the libraries that decode and verify, jax's numeric options, and the
  ``JAX_*`` / ``XLA_*`` / ``LIBTPU_*`` / ``TPU_*`` environment variables;
* the source of the ``sagc_jax`` package as this process imported it.

A difference in any of these gives another key and a fresh evaluation. What the key
cannot see (a different CPU behind the same shared folder, a library outside the list)
is why the folder is per comparison and local. One process only: on a pod every run
evaluates (the file would have to reach every host).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jaxlib
import numpy as np

from sagc_jax.experiments.machine import package_version

__all__ = ["InitialEvaluationStore", "initial_eval_key", "reuse_before_rl", "reuse_or_evaluate"]

_PACKAGE = Path(__file__).resolve().parents[1]
_EVALUATION_SETTINGS = ("data", "mesh", "model", "reward", "rollout")
_LIBRARIES = ("flax", "numpy", "transformers", "tokenizers", "math-verify", "sympy",
              "jax-cuda12-plugin", "libtpu")
_ENV_PREFIXES = ("JAX_", "XLA_", "LIBTPU_", "TPU_")
_JAX_OPTIONS = ("jax_default_matmul_precision", "jax_enable_x64",
                "jax_threefry_partitionable", "jax_default_prng_impl")
_WEIGHT_FILES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".msgpack", ".index.json")


def _files_digest(root: Path, paths: Sequence[Path]) -> str:
  """SHA-256 of ``paths`` (their names relative to ``root``, and bytes), in sorted order."""
  digest = hashlib.sha256()
  for path in sorted(paths):
    digest.update(str(path.relative_to(root)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()


# At import: the code this process runs, not what the files hold when the key is made.
_SOURCE_DIGEST = _files_digest(_PACKAGE, list(_PACKAGE.rglob("*.py")))


def _weights_digest(variables: Any) -> str:
  """SHA-256 of every leaf of ``variables`` (path, dtype, shape and bytes), one leaf
  on the host at a time."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]:
    array = np.asarray(jax.device_get(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def _folder_digest(folder: str) -> str:
  """SHA-256 of the files of a local model folder other than its weights (names and
  bytes): the tokenizer, chat template and generation config. '' without a folder."""
  if not folder or not os.path.isdir(folder):
    return ""
  return _files_digest(Path(folder), [p for p in Path(folder).rglob("*")
                                      if p.is_file() and not p.name.endswith(_WEIGHT_FILES)])


def initial_eval_key(config: Any, variables: Any, mesh_shape: dict[str, int],
                     examples: Sequence[dict], prompt_ids: Sequence[Sequence[int]],
                     stop_ids: Sequence[int], pad_id: int) -> str:
  """The key of a run's evaluation before RL (see the module docstring): ``variables``
  the policy's weights, ``examples`` the held-out examples it evaluates (``prompt``,
  ``answer``) and ``prompt_ids`` their encoded prompts."""
  devices = jax.devices()
  settings = {"seed": config.seed,
              **{name: getattr(config, name).to_dict() for name in _EVALUATION_SETTINGS},
              "eval_greedy": config.train.eval_greedy, "eval_k": config.train.eval_k}
  if settings["eval_k"] > 1:        # the straggler profile of the k samples
    settings["controller"] = {"tau": config.controller.tau,
                              "sizes": list(config.group_sizes())}
  evaluated = hashlib.sha256(json.dumps(
      [[ex["prompt"], ex["answer"], list(map(int, ids))]
       for ex, ids in zip(examples, prompt_ids)]).encode()).hexdigest()
  parts = {
      "weights": _weights_digest(variables),
      "model_files": _folder_digest(config.model.path),
      "evaluated": evaluated, "stop_ids": list(map(int, stop_ids)), "pad_id": int(pad_id),
      "settings": settings,
      "devices": {"platform": devices[0].platform, "kind": devices[0].device_kind,
                  "platform_version": getattr(devices[0].client, "platform_version", ""),
                  "count": len(devices), "mesh": dict(mesh_shape)},
      "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                   **{name: package_version(name) for name in _LIBRARIES}},
      "jax_options": {name: str(getattr(jax.config, name, None)) for name in _JAX_OPTIONS},
      "environment": {k: v for k, v in sorted(os.environ.items())
                      if k.startswith(_ENV_PREFIXES)},
      "source": _SOURCE_DIGEST,
  }
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


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
    """Keeps an evaluation (written to a temporary file, then renamed: a reader never
    sees half a file, and a write that fails leaves nothing behind)."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.stem}.",
                                       suffix=".partial")
    try:
      with os.fdopen(handle, "w") as f:
        json.dump({"evaluation": evaluation,
                   "sampled_correct": np.asarray(sampled_correct).tolist(),
                   "measured_by": measured_by}, f)
      os.replace(partial, self.path)
    finally:
      if os.path.exists(partial):
        os.unlink(partial)


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
    evaluator, inputs = trainer.evaluator, trainer.inputs
    examples = evaluator.examples()
    store = None
    if jax.process_count() == 1:
      evaluated = [inputs.eval_source[i] for i in range(examples)]
      from flax import nnx
      key = initial_eval_key(trainer.config, nnx.state(trainer.model, nnx.Param),
                             dict(inputs.mesh.shape), evaluated, inputs.encode(evaluated),
                             inputs.stop_ids, inputs.pad_id)
      store = InitialEvaluationStore(directory, key)
    evaluation, correct = reuse_or_evaluate(
        store, lambda: trainer.evaluate_with_lines("before RL"),
        lambda: evaluator.sampled_correct, examples, str(trainer.workdir), trainer.log)
    if evaluation.get("eval_reused"):
      evaluator.sampled_correct = correct
      evaluator.log_result("before RL", evaluation)
    return evaluation

  return before_rl
