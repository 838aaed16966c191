"""The evaluation before RL, kept once and reused by the runs that would repeat it.

Every run of a comparison starts from one shared policy, and the held-out evaluation
draws its random numbers with fixed seeds in a fixed batch layout that does not depend
on the controller (``training.build.build_eval_samplers``). The runs of one seed
therefore compute the same evaluation before RL, number for number: on the real-model
CPU comparison about 6.5 minutes of each 26-minute run. With ``train.initial_eval_dir``
set (``sagc_jax.compare`` sets ``<workdir>/shared/initial_eval``), a run keeps its
evaluation before RL in that folder under a key of everything the evaluation depends
on, and a later run with the same key reads it instead of evaluating.

The key is a SHA-256 over
* every byte of the policy's weights (all model variables, in a fixed order);
* the settings that decide the evaluation: ``seed``, ``data``, ``mesh``, ``model``,
  ``reward``, ``rollout``, ``train.eval_greedy`` and ``train.eval_k``;
* the devices (platform, kind, count, mesh shape), the jax and jaxlib versions and
  ``XLA_FLAGS`` (numerics differ between backends and compiler options);
* the source of the ``sagc_jax`` package (any code change gives a new key).

A difference in any of them gives another key and a fresh evaluation, so reuse can
cost an evaluation but never return another run's numbers. One process only: on a pod
every run evaluates (the file would have to reach every host).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jaxlib
import numpy as np

__all__ = ["InitialEvaluationStore", "initial_eval_key", "reuse_or_evaluate"]

_PACKAGE = Path(__file__).resolve().parents[1]
_EVALUATION_SETTINGS = ("data", "mesh", "model", "reward", "rollout")


def _source_digest() -> str:
  """SHA-256 of every ``.py`` file of the package (path and bytes, in sorted order)."""
  digest = hashlib.sha256()
  for path in sorted(_PACKAGE.rglob("*.py")):
    digest.update(str(path.relative_to(_PACKAGE)).encode())
    digest.update(path.read_bytes())
  return digest.hexdigest()


def _weights_digest(variables: Any) -> str:
  """SHA-256 of every leaf of ``variables`` (path, dtype, shape and bytes), one leaf
  on the host at a time."""
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables)[0]:
    array = np.asarray(jax.device_get(leaf))
    digest.update(f"{jax.tree_util.keystr(path)}|{array.dtype}|{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def initial_eval_key(config: Any, variables: Any, mesh_shape: dict[str, int]) -> str:
  """The key of the evaluation before RL of a run (see the module docstring)."""
  devices = jax.devices()
  parts = {
      "weights": _weights_digest(variables),
      "settings": {"seed": config.seed,
                   **{name: config[name].to_dict() for name in _EVALUATION_SETTINGS},
                   "eval_greedy": config.train.get("eval_greedy", True),
                   "eval_k": config.train.get("eval_k", 0)},
      "devices": {"platform": devices[0].platform, "kind": devices[0].device_kind,
                  "count": len(devices), "mesh": dict(mesh_shape)},
      "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                   "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")},
      "source": _source_digest(),
  }
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:32]


class InitialEvaluationStore:
  """The evaluations before RL in ``directory``, one JSON file per key."""

  def __init__(self, directory: str | os.PathLike, key: str):
    self.path = Path(directory) / f"{key}.json"

  def load(self) -> tuple[dict[str, float], np.ndarray, str] | None:
    """(evaluation, per-example sampled correctness, the run that measured it), or
    None when no run kept an evaluation under this key."""
    if not self.path.exists():
      return None
    saved = json.loads(self.path.read_text())
    return (saved["evaluation"], np.asarray(saved["sampled_correct"], np.int8),
            saved["measured_by"])

  def save(self, evaluation: dict[str, float], sampled_correct: np.ndarray,
           measured_by: str) -> None:
    """Keeps an evaluation (written to a temporary name, then renamed: a reader never
    sees half a file)."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"evaluation": evaluation,
                                   "sampled_correct": np.asarray(sampled_correct).tolist(),
                                   "measured_by": measured_by}))
    os.replace(partial, self.path)


def reuse_or_evaluate(store: InitialEvaluationStore | None, evaluate: Callable[[], dict],
                      sampled_correct: Callable[[], np.ndarray], measured_by: str,
                      log: Callable[[str], None]) -> tuple[dict[str, float], np.ndarray]:
  """The evaluation before RL: the stored one when ``store`` has it, else
  ``evaluate()`` (then kept in ``store``). Returns it with its per-example sampled
  correctness. A reused evaluation's ``eval_seconds`` is the time spent reading it;
  ``eval_reused`` is 1.0."""
  start = time.perf_counter()
  try:
    kept = store.load() if store is not None else None
  except (ValueError, KeyError, UnicodeDecodeError) as err:      # a file damaged by hand
    log(f"warning: {store.path} is not a kept evaluation ({err!r}); evaluating again")
    kept = None
  if kept is None:
    evaluation = evaluate()
    if store is not None:
      store.save(evaluation, sampled_correct(), measured_by)
    return evaluation, sampled_correct()
  evaluation, correct, source = kept
  log(f"eval before RL: reusing the evaluation {source} measured from the same weights "
      f"and evaluation settings ({store.path})")
  evaluation = dict(evaluation, eval_seconds=time.perf_counter() - start, eval_reused=1.0)
  return evaluation, correct
