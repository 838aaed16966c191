"""The arms of a comparison (``python -m sagc_jax.compare``) and running them.

The matrix {algorithms} x {static G for each candidate (or each of
``compare.static_sizes``), SAGC, the contextual kinds of ``compare.contextual``}
runs ``compare.seeds`` times. Every run starts from the same policy (the warm start is built once, in
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
import re
from pathlib import Path
from typing import Any

from sagc_jax.runtime.metrics import finished_summary

_RUN_NAME = re.compile(r"^(?P<arm>.+)_seed(?P<seed>\d+)$")


def arm_configs(config) -> dict[str, Any]:
  """``{arm name: training config}`` for the comparison matrix of ``config.compare``
  (one seed: ``config.seed``).

  Every arm runs its algorithm's published recipe: the objective keys of
  ``ALGORITHM_PRESETS`` go back to ``None`` (the preset's values), so a setting the
  comparison file tuned for one algorithm does not leak into the other's arms. The
  one key kept is a ``kl_coef`` the file sets: it tunes the GRPO arms' KL term (DAPO
  has none).
  """
  from sagc_jax.rl.config import PRESET_FIELDS

  arms = {}
  for algorithm in config.compare.algorithms:
    variants = [(f"{algorithm}_static{g}", "static", g) for g in static_sizes(config)]
    variants.append((f"{algorithm}_sagc", "sagc", None))
    variants += [(f"{algorithm}_{kind}", kind, None) for kind in contextual_kinds(config)]
    for name, kind, g in variants:
      arm = copy.deepcopy(config)
      with arm.unlocked():
        del arm["compare"]
      arm.learner.algorithm = algorithm
      for key in PRESET_FIELDS:
        if not (key == "kl_coef" and algorithm == "grpo"):
          arm.learner[key] = None
      arm.controller.update(dict(kind=kind) if g is None else dict(kind=kind, static_g=g))
      budget = time_budget(config)
      if budget:        # equal time for every arm, evaluated along one time axis
        arm.train.update(dict(time_budget_s=budget, eval_points=eval_points(config),
                              eval_every=arm.train.steps))
      arms[name] = arm
  return arms


def static_sizes(config) -> tuple[int, ...]:
  """The static-G arms: ``compare.static_sizes`` (e.g. ``(4, 16)``: the smallest and
  largest only, where every arm costs minutes), by default every candidate G."""
  candidates = tuple(config.controller.candidates)
  sizes = config.compare.get("static_sizes") or candidates
  bad = [g for g in sizes if isinstance(g, bool) or not isinstance(g, int) or g < 2]
  if bad or len(set(sizes)) != len(sizes):
    raise ValueError(f"compare.static_sizes={tuple(sizes)!r} must be distinct ints >= 2 "
                     f"(e.g. the candidates {candidates})")
  return tuple(sizes)


CONTEXTUAL_KINDS = ("prompt_aware", "per_prompt")


def contextual_kinds(config) -> tuple[str, ...]:
  """``compare.contextual``: arms of the contextual controllers (docs/controllers.md)
  beside SAGC, e.g. ``("prompt_aware", "per_prompt")``; none by default."""
  kinds = tuple(config.compare.get("contextual", ()) or ())
  bad = [k for k in kinds if k not in CONTEXTUAL_KINDS]
  if bad or len(set(kinds)) != len(kinds):
    raise ValueError(f"compare.contextual={kinds!r} must be distinct kinds of "
                     f"{CONTEXTUAL_KINDS}")
  return kinds


def time_budget(config) -> float:
  """``compare.time_budget_s`` (0 or unset: none): every arm's ``train.time_budget_s``;
  ``train.steps`` is then only a cap, and an arm that reaches it is reported."""
  budget = config.compare.get("time_budget_s", 0.0) or 0.0
  if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (
      0 <= budget < float("inf")):
    raise ValueError(f"compare.time_budget_s={budget!r} must be a number of seconds >= 0 "
                     "(0 = no budget: every arm runs train.steps)")
  return float(budget)


def eval_points(config) -> int:
  """``compare.eval_points`` (default 8): evaluations at evenly spaced points of the
  budget."""
  points = config.compare.get("eval_points", 8)
  if isinstance(points, bool) or not isinstance(points, int) or points < 1:
    raise ValueError(f"compare.eval_points={points!r} must be a positive int")
  return points


def targets(config) -> tuple[float, ...]:
  """``compare.targets``: held-out sampled accuracies whose time to reach is reported."""
  values = tuple(config.compare.get("targets", ()) or ())
  bad = [t for t in values if isinstance(t, bool) or not isinstance(t, (int, float))
         or not 0 < t <= 1]
  if bad:
    raise ValueError(f"compare.targets={values!r} must be accuracies in (0, 1]")
  return tuple(float(t) for t in values)


def seed_count(config) -> int:
  """``compare.seeds`` (default 1), checked."""
  seeds = config.compare.get("seeds", 1)
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise ValueError(f"compare.seeds={seeds!r} must be a positive int")
  return seeds


def run_configs(config) -> dict[str, Any]:
  """``{"<arm>_seed<k>": training config}``: every arm of ``arm_configs`` for each of
  ``compare.seeds`` seeds (``config.seed + k``: data order and sampling)."""
  runs = {}
  for k in range(seed_count(config)):
    for name, arm in arm_configs(config).items():
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
    arm.model.path = str(policy.absolute())
    arm.data.data_dir = data_dir
    if arm.train.compilation_cache and not arm.train.compilation_cache_dir:
      arm.train.compilation_cache_dir = str(workdir / "jax_cache")   # arms share programs
    if not arm.train.initial_eval_dir:        # the runs of a seed share their first evaluation
      arm.train.initial_eval_dir = str(shared / "initial_eval")
    if _train_arm(arm, arm_dir).get("preempted"):
      log(f"{name}: stopped by SIGTERM or Ctrl-C after a checkpoint; rerun the same command to "
          "resume this arm and the ones after it")
      raise SystemExit(0)


def _train_arm(config, arm_dir: Path) -> dict[str, Any]:
  """One run, in its own process (``arm_process``: memory is returned between runs)."""
  from sagc_jax.experiments.arm_process import run_in_child

  return run_in_child(config, arm_dir)

