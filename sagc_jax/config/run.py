"""``RunConfig``: a whole training config as frozen typed sections, built once at the
command line from the ConfigDict a user wrote (``run_config``).

Each section checks its own keys when it is built (``config.sections``); the rules
that relate two sections are ``check_run``, the one place they are written; the
learner's algorithm preset is resolved by ``LearnerConfig.from_dict``. Imports no
JAX and no ml_collections: ``run_config`` reads any nested mapping, or an object
with ``to_dict()`` (a ConfigDict).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from sagc_jax.config.sections import (FILE_DATASETS, SECTIONS, ControllerSection, DataSection,
                                      MeshSection, ModelSection, RewardSection, RolloutSection,
                                      SftSection, TrainSection)
from sagc_jax.rl.config import LearnerConfig
from sagc_jax.base import checks

__all__ = ["RunConfig", "check_run", "controller_settings", "run_config", "typed_section"]


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A validated training config. ``learner`` is the resolved ``LearnerConfig``;
  ``learner_settings`` the learner section as written (its preset keys may be
  None = "the preset's value"), which is what ``to_dict`` and config.json hold."""

  seed: int
  model: ModelSection
  mesh: MeshSection
  data: DataSection
  reward: RewardSection
  controller: ControllerSection
  rollout: RolloutSection
  train: TrainSection
  sft: SftSection
  learner: LearnerConfig
  learner_settings: Mapping[str, Any]

  def __post_init__(self):
    check_run(self)

  def to_dict(self) -> dict[str, Any]:
    """The config as the user's ConfigDict would write it (config.json)."""
    sections = {s.NAME: getattr(self, s.NAME).to_dict() for s in SECTIONS}
    return {"seed": self.seed, **sections, "learner": dict(self.learner_settings)}

  @property
  def label(self) -> str:
    """The run's arm in words: ``"grpo + sagc"``."""
    return f"{self.learner.algorithm} + {self.controller.kind}"

  def build_controller(self):
    """The run's controller, with the rollout budget's P(G)."""
    return self.controller.build(prompts_for=self.rollout.prompts_for)

  def group_sizes(self) -> tuple[int, ...]:
    return self.controller.group_sizes()


def _plain(value: Any) -> Any:
  """ConfigDict (``to_dict``) or mapping -> nested dicts."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  return value


def typed_section(section: type, given: Any) -> Any:
  """The typed ``section`` of ``given`` (a mapping or ConfigDict; missing keys take the
  section's defaults); an unknown key raises ``ValueError`` naming it."""
  given = _plain(given)
  fields = {f.name for f in dataclasses.fields(section)}
  extra = sorted(set(given) - fields)
  if extra:
    raise ValueError(f"{section.NAME}.{extra[0]} is not a {section.NAME} setting "
                     f"(allowed: {', '.join(sorted(fields))})")
  return section(**given)


def controller_settings(given: Any) -> dict[str, Any]:
  """Every setting of a controller section (``ControllerSection``, the one place that
  states their defaults), from a partial mapping: what the replay engine builds its
  arms from."""
  return typed_section(ControllerSection, given).to_dict()


def run_config(config: Any) -> RunConfig:
  """Builds and checks the ``RunConfig`` of a ConfigDict or nested mapping (the
  command-line boundary); the first problem raises ``ValueError`` naming its key.

  File datasets with relative patterns and no ``data.manual_dir`` read from the
  directory the run starts in: it is recorded as ``manual_dir`` here, so that eval,
  export and a resume from elsewhere find the same files.
  """
  if isinstance(config, RunConfig):
    return config
  values = _plain(config)
  known = {s.NAME for s in SECTIONS} | {"seed", "learner"}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ValueError(f"config section {unknown[0]!r} is not a training setting "
                     f"(allowed: {', '.join(sorted(known))})")
  sections = {}
  for section in SECTIONS:
    given = dict(values.get(section.NAME, {}))
    if section is DataSection and given.get("name") in FILE_DATASETS \
        and not given.get("manual_dir"):
      given["manual_dir"] = os.path.abspath(os.curdir)
    sections[section.NAME] = typed_section(section, given)
  settings = dict(values.get("learner", {}))
  rollout, train = sections["rollout"], sections["train"]
  learner = LearnerConfig.from_dict(settings, max_new_tokens=rollout.max_new_tokens,
                                    temperature=rollout.temperature, train_steps=train.steps)
  return RunConfig(seed=values.get("seed", 0), learner=learner, learner_settings=settings,
                   **sections)


def check_run(run: RunConfig) -> None:
  """The rules that span sections (each section has checked its own keys)."""
  rollout, controller, train = run.rollout, run.controller, run.train
  candidates = controller.group_sizes()
  needs = controller.needs
  if needs.no_refill and rollout.refill_slots:
    raise ValueError(f"controller.kind={controller.kind!r} needs rollout.refill_slots=0 (got "
                     f"{rollout.refill_slots}): the refill sampler takes one group size per "
                     "call")
  largest = max(rollout.prompts_for(g) * g for g in candidates)
  if needs.whole_step_per_call and 0 < rollout.max_rows_per_call < largest:
    raise ValueError(f"controller.kind={controller.kind!r} needs rollout.max_rows_per_call=0 "
                     f"or >= {largest} (got {rollout.max_rows_per_call}): groups of different "
                     "sizes are not split over sub-calls")
  checks.group_budget({"rollout": rollout}, "rollout", rollout.mode, candidates)
  limit = rollout.max_rows_per_call
  if limit and limit < max(candidates):
    raise ValueError(f"rollout.max_rows_per_call={limit} is smaller than the largest group "
                     f"size {max(candidates)}: a group must fit in one sampler call")
  if train.eval_k > rollout.eval_batch:
    raise ValueError(f"train.eval_k={train.eval_k} must be <= rollout.eval_batch="
                     f"{rollout.eval_batch} (the k samples of an example are one "
                     "evaluation group)")
  if 0 < limit < train.eval_k:
    raise ValueError(f"train.eval_k={train.eval_k} must be <= rollout.max_rows_per_call="
                     f"{limit} (a group is never split over sampler calls)")
  if rollout.refill_slots:
    import jax          # the size of the mesh's 'data' axis needs the device count
    data = run.mesh.data_ways(jax.device_count())
    if data and rollout.refill_slots % data:
      raise ValueError(f"rollout.refill_slots={rollout.refill_slots} must be a multiple of "
                       f"the mesh's 'data' axis ({data}, mesh.shape={run.mesh.shape}): each "
                       "data shard decodes its own slots")
  for g in candidates:
    rows = rollout.prompts_for(g) * g
    run.learner.check_split(rows, f"the {rows} rollouts of a G={g} step")
  seed = run.seed
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise ValueError(f"seed={seed!r} must be an int")
  checks.finite_numbers(run.to_dict())     # what no check above reads, e.g. another kind's
