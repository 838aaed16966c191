"""The arms of a comparison (``python -m sagc_jax.compare``) and running them.

The matrix {algorithms} x {static G for each candidate (or each of
``compare.static_sizes``), SAGC, the kinds of ``compare.contextual`` and
``compare.kinds``} runs ``compare.seeds`` times (the keys: ``config.compare``).
Every run starts from the same policy (the warm start is built once, in
``<workdir>/shared``); seed k (``config.seed + k``) sets the data order and the
sampling of every arm alike, so the arms of one seed see the same prompts in the same
order. Runs live in ``<workdir>/arms/<arm>_seed<k>`` as ordinary training runs, so a
run can go on its own machine (``--arms grpo_sagc``: every seed of that arm, or
``--arms grpo_sagc_seed1``; e.g. one per TPU slice), be copied into ``arms/`` and
merged (``--merge_only``); a finished run is skipped and an interrupted one resumes
from its checkpoint. The report over the runs is ``sagc_jax.experiments.compare``.
"""

from __future__ import annotations

import copy
import os
import re
import time
from pathlib import Path
from typing import Any

from sagc_jax.config.compare import CompareSection
from sagc_jax.config.run import typed_section
from sagc_jax.experiments.record import record_run
from sagc_jax.runtime.metrics import finished_summary

_RUN_NAME = re.compile(r"^(?P<arm>.+)_seed(?P<seed>\d+)$")


def compare_section(config) -> CompareSection:
  """The typed ``compare`` section of a comparison config; a bad or unknown key raises
  ``ValueError`` naming it."""
  return typed_section(CompareSection, config.compare)


def arm_configs(config) -> dict[str, Any]:
  """``{arm name: training config}`` for the comparison matrix of ``config.compare``
  (one seed: ``config.seed``).

  Every arm runs its algorithm's published recipe: the objective keys of
  ``ALGORITHM_PRESETS`` go back to ``None`` (the preset's values), so a setting the
  comparison file tuned for one algorithm does not leak into the other's arms. The
  one key kept is a ``kl_coef`` the file sets: it tunes the GRPO arms' KL term (DAPO
  has none). With ``compare.time_budget_s`` every arm gets the same budget and
  evaluation points (one time axis); ``train.steps`` is then only a cap.
  """
  from sagc_jax.rl.config import PRESET_FIELDS

  compare = compare_section(config)
  arms = {}
  for algorithm in compare.algorithms:
    for variant, overrides in compare.variants(config.controller.candidates):
      arm = copy.deepcopy(config)
      with arm.unlocked():
        del arm["compare"]
      arm.learner.algorithm = algorithm
      for key in PRESET_FIELDS:
        if not (key == "kl_coef" and algorithm == "grpo"):
          arm.learner[key] = None
      arm.controller.update(overrides)
      if compare.time_budget_s:
        arm.train.update(dict(time_budget_s=compare.time_budget_s,
                              eval_points=compare.eval_points, eval_every=arm.train.steps))
      arms[f"{algorithm}_{variant}"] = arm
  return arms


def run_configs(config) -> dict[str, Any]:
  """``{"<arm>_seed<k>": training config}``: every arm of ``arm_configs`` for each of
  ``compare.seeds`` seeds (``config.seed + k``: data order and sampling), in the order
  they run: seed by seed, the arms of a seed in a random order drawn from that seed, so
  that a drift of the machine's speed is not confounded with one arm (the same seed
  gives the same order, so a resumed comparison runs the rest in that order)."""
  import numpy as np

  runs = {}
  for k in range(compare_section(config).seeds):
    arms = list(arm_configs(config).items())
    for i in np.random.default_rng(config.seed + k).permutation(len(arms)):
      name, arm = arms[i]
      arm.seed = config.seed + k
      runs[f"{name}_seed{k}"] = arm
  return runs


def split_run_name(name: str) -> tuple[str, int]:
  """``"grpo_sagc_seed2"`` -> ``("grpo_sagc", 2)``; a name without a seed is seed 0."""
  match = _RUN_NAME.match(name)
  return (match["arm"], int(match["seed"])) if match else (name, 0)


def select_arms(all_arms: dict[str, Any], wanted: str | None) -> dict[str, Any]:
  """The runs named in ``wanted`` (comma-separated; an arm name selects all its seeds)."""
  if not wanted:
    return all_arms
  names = [n.strip() for n in wanted.split(",") if n.strip()]
  chosen, unknown = {}, []
  for name in names:
    hits = {n: c for n, c in all_arms.items() if n == name or split_run_name(n)[0] == name}
    if not hits:
      unknown.append(name)
    chosen.update(hits)
  if unknown:
    arms = sorted({split_run_name(n)[0] for n in all_arms})
    raise ValueError(f"--arms: unknown arm(s) {unknown}; this comparison has {arms} "
                     f"(each with seeds _seed0.._seed{max(split_run_name(n)[1] for n in all_arms)})")
  return chosen


def run_arms(config, workdir: Path, arms: dict[str, Any], log=print) -> None:
  """Runs (or resumes, or skips when finished) each run from one shared warm start."""
  from sagc_jax.data import builder_options, load_split
  from sagc_jax.runtime.storage import cache_root
  from sagc_jax.training.inputs import policy_source
  from sagc_jax.training.warm_start import prepare_policy

  data_dir = config.data.data_dir or str(workdir / "tfds")
  shared = workdir / "shared"
  shared.mkdir(parents=True, exist_ok=True)
  train = load_split(config.data.name, "train", data_dir, config.data.manual_dir or None,
                     **builder_options(config.data))
  # A GGUF source (a .gguf file or a built-in name) is converted once, here, so that
  # every arm starts from the same local folder.
  cache = cache_root(config.train.local_cache_dir)
  start = policy_source(config, cache, log)
  policy = prepare_policy(config, shared, train, log, model_path=start, cache=cache)
  for index, (name, arm) in enumerate(arms.items()):
    arm_dir = workdir / "arms" / name
    if finished_summary(arm_dir, arm.train) is not None:
      log(f"[{index + 1}/{len(arms)}] {name}: finished earlier, skipped")
      continue
    log(f"[{index + 1}/{len(arms)}] {name}")
    started, load = time.time(), os.getloadavg()[0]
    arm.model.path = str(policy.absolute())
    arm.data.data_dir = data_dir
    if arm.train.compilation_cache and not arm.train.compilation_cache_dir:
      arm.train.compilation_cache_dir = str(workdir / "jax_cache")   # arms share programs
    if not arm.train.initial_eval_dir:        # the runs of a seed share their first evaluation
      arm.train.initial_eval_dir = str(shared / "initial_eval")
    try:
      preempted = _train_arm(arm, arm_dir).get("preempted")
    finally:                  # a failed stretch is recorded too
      record_run(workdir, name, index, started, load)
    if preempted:
      log(f"{name}: stopped by SIGTERM or Ctrl-C after a checkpoint; rerun the same command to "
          "resume this arm and the ones after it")
      raise SystemExit(0)


def _train_arm(config, arm_dir: Path) -> dict[str, Any]:
  """One run, in its own process (``arm_process``: memory is returned between runs)."""
  from sagc_jax.experiments.arm_process import run_in_child

  return run_in_child(config, arm_dir)

