r"""Built-in synthetic reasoning task: left-to-right integer arithmetic with a scratchpad.

Why this task exists: the whole RL stack (SFT warm start, GRPO/DAPO, SAGC) must be
exercisable end to end on a laptop-class CPU in minutes, with a ~0.8M-parameter
character-level model. Real math data needs a real model; this task is learnable by a
tiny model, is generated offline (no network), and has an exact-match verifiable reward.

An example::

  prompt:   "7+5-3=?\n"
  solution: "7+5=12\n12-3=9\ncheck 7+5=12\nanswer 9\n"
  answer:   "9"

* Evaluation is strictly left to right (no operator precedence), so every scratchpad line
  is one binary operation on the running value: the model only has to learn one-step
  arithmetic and copying. Results may be negative ("-2") and are kept as such.
* The tokenizer is character level (newline + printable ASCII): texts are short and
  regular, numbers are written in plain decimal.
* Heavy-tailed solution lengths. After the steps the solution re-checks its work with
  probability ``recheck_prob`` and keeps re-checking with the same probability (a
  geometric count capped at ``max_rechecks``); each recheck re-does one step (chosen
  uniformly: the last one or an earlier one) as a ``check a op b=c`` line. The
  ``answer N`` line comes last. Most solutions are short and a few are 2-4x longer, so
  a policy sampled from a model trained on them produces the straggler length variance
  SAGC is about.

Measured solution lengths in characters with the default config (20000 train examples,
seed 0): quantiles 5/25/50/75/90/95/99% = 15/21/27/35/47/56/75, max 116, mean 30.0;
34.6% of the solutions contain at least one recheck; p95/median = 2.07, p99/median = 2.78
(``tests/test_data.py`` re-measures these). Prompts are 6-10 characters.

Toward the SAGC paper's regime (``guess_prob > 0``, best with ``modulus=10``): with that
probability the solution skips the scratchpad and states only the answer
(``"answer 9\n"``). A model this small cannot sum several digits modulo 10 in its head,
so longer reasoning pays: after a warm start on ``guess_prob=0.2`` data and a second
stage on mostly answer-only solutions (``sft.guess_stage_*``), written-out solutions
are right far more often than guesses, and RL raises held-out accuracy by writing the
work more often, with longer responses. The within-group max/median ratio rises while
a growing minority of a group writes the work and falls once most do (docs/results.md,
"The paper's regime on CPU").
The guess is drawn last, after the example is complete, so data with
``guess_prob = 0`` is identical to data generated before the knob existed, and every
example that is not a guess is the always-work example of the same index.

Determinism and held-out split: example ``i`` of split ``s`` is drawn from its own
generator seeded with ``(seed, split_code(s), i)``. The prompt space is small (200
one-operation prompts with the defaults), so independent draws would put most test
prompts in train too. Instead every prompt belongs to exactly one split by a stable hash
(``prompt_split``: CRC32 of the prompt, 1 in ``HELDOUT_BUCKETS`` to test), and each
example redraws until its prompt falls in its split's part. Test prompts therefore never
occur in train, and because the hash ignores length, both splits keep the same mix of
short and long problems.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import zlib
from typing import Any, Iterator

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

__all__ = [
    "SPLITS",
    "SyntheticArithmetic",
    "SyntheticBuilderConfig",
    "SyntheticConfig",
    "builder_config_for",
    "evaluate_left_to_right",
    "draw_example",
    "example_rng",
    "generate_split",
    "make_example",
    "prompt_split",
]

SPLITS = ("train", "test")
HELDOUT_BUCKETS = 8          # 1 in 8 prompts is reserved for the test split
_SPLIT_CODES = {"train": 0, "test": 1}
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _check_int(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"SyntheticConfig.{name} must be an int, got {value!r}")
  if value < minimum:
    raise ValueError(f"SyntheticConfig.{name}={value!r} must be >= {minimum}")


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
  """Parameters of the synthetic arithmetic task (validated on construction).

  Attributes:
    max_operand: operands are drawn uniformly from 0..max_operand.
    min_ops, max_ops: number of binary operations per prompt, uniform in [min_ops, max_ops].
    allow_mul: also draw ``*`` (otherwise only ``+`` and ``-``).
    recheck_prob: probability of each further recheck line, in [0, 1).
    max_rechecks: cap on the number of recheck lines.
    modulus: when > 0, every running value is reduced modulo it (``7+5=2`` with
      modulus 10), so each scratchpad line is one of a few hundred digit facts while
      the answer of several operations cannot be had without them (a running sum
      modulo m is the classic task a small transformer fails to do in one shot).
    guess_prob: probability that the solution is only the answer line (no
      scratchpad, no rechecks), in [0, 1); 0 = always write the work.
    num_train, num_test: examples in the train / test split.
    seed: root seed of both splits.
  """

  max_operand: int = 9
  min_ops: int = 1
  max_ops: int = 3
  allow_mul: bool = False
  recheck_prob: float = 0.35
  max_rechecks: int = 6
  modulus: int = 0
  guess_prob: float = 0.0
  num_train: int = 20000
  num_test: int = 500
  seed: int = 0

  def __post_init__(self):
    for name, minimum in (("max_operand", 1), ("min_ops", 1), ("max_ops", 1),
                          ("max_rechecks", 0), ("modulus", 0), ("num_train", 1),
                          ("num_test", 1), ("seed", 0)):
      _check_int(name, getattr(self, name), minimum)
    if self.max_ops < self.min_ops:
      raise ValueError(f"SyntheticConfig.max_ops={self.max_ops} must be >= "
                       f"min_ops={self.min_ops}")
    if not isinstance(self.allow_mul, (bool, np.bool_)):
      raise ValueError(f"SyntheticConfig.allow_mul must be a bool, got {self.allow_mul!r}")
    _check_probability("recheck_prob", self.recheck_prob)
    _check_probability("guess_prob", self.guess_prob)

  @property
  def ops(self) -> tuple[str, ...]:
    return ("+", "-", "*") if self.allow_mul else ("+", "-")

  def num_examples(self, split: str) -> int:
    _check_split(split)
    return self.num_train if split == "train" else self.num_test

  def name(self) -> str:
    """A filesystem-safe name that encodes every parameter (TFDS config name)."""
    ops = "".join({"+": "add", "-": "sub", "*": "mul"}[o] for o in self.ops)
    return (f"ops{self.min_ops}-{self.max_ops}_max{self.max_operand}_{ops}"
            f"_recheck{self.recheck_prob:g}x{self.max_rechecks}"
            + (f"_mod{self.modulus}" if self.modulus else "")
            + (f"_guess{self.guess_prob:g}" if self.guess_prob else "") +
            f"_train{self.num_train}_test{self.num_test}_seed{self.seed}")


def _check_probability(name: str, p: Any) -> None:
  if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
    raise ValueError(f"SyntheticConfig.{name} must be a number, got {p!r}")
  if not 0.0 <= p < 1.0:
    raise ValueError(f"SyntheticConfig.{name}={p!r} is outside [0, 1)")


def _check_split(split: str) -> None:
  if split not in _SPLIT_CODES:
    raise ValueError(f"unknown split {split!r}; allowed: {list(SPLITS)}")


def evaluate_left_to_right(numbers: list[int], ops: list[str], modulus: int = 0) -> list[int]:
  """Running values of ``n0 op1 n1 op2 n2 ...`` evaluated left to right (no precedence),
  each reduced modulo ``modulus`` when it is > 0."""
  if len(numbers) != len(ops) + 1:
    raise ValueError(f"need len(numbers) == len(ops) + 1, got {len(numbers)} and {len(ops)}")
  values = [int(numbers[0])]
  for op, b in zip(ops, numbers[1:]):
    if op not in _OPS:
      raise ValueError(f"unknown operator {op!r}; allowed: {sorted(_OPS)}")
    value = _OPS[op](values[-1], int(b))
    values.append(value % modulus if modulus else value)
  return values


def make_example(rng: np.random.Generator, cfg: SyntheticConfig) -> dict[str, str]:
  """One example ``{"prompt", "solution", "answer"}`` drawn with ``rng``, with its
  written work (``draw_example`` applies ``guess_prob``)."""
  n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
  numbers = [int(x) for x in rng.integers(0, cfg.max_operand + 1, size=n_ops + 1)]
  ops = [cfg.ops[int(i)] for i in rng.integers(0, len(cfg.ops), size=n_ops)]
  values = evaluate_left_to_right(numbers, ops, cfg.modulus)
  steps = [f"{values[k]}{ops[k]}{numbers[k + 1]}={values[k + 1]}" for k in range(n_ops)]

  prompt = str(numbers[0]) + "".join(o + str(b) for o, b in zip(ops, numbers[1:])) + "=?\n"
  lines = list(steps)
  num_rechecks = 0
  while num_rechecks < cfg.max_rechecks and rng.random() < cfg.recheck_prob:
    num_rechecks += 1
    lines.append("check " + steps[int(rng.integers(0, n_ops))])
  answer = str(values[-1])
  lines.append("answer " + answer)
  return {"prompt": prompt, "solution": "\n".join(lines) + "\n", "answer": answer}


def example_rng(cfg: SyntheticConfig, split: str, index: int) -> np.random.Generator:
  """The generator of example ``index`` of ``split`` (random access, disjoint streams)."""
  _check_split(split)
  return np.random.default_rng((cfg.seed, _SPLIT_CODES[split], int(index)))


def prompt_split(prompt: str) -> str:
  """The split a prompt belongs to (a stable hash partition of the prompt space)."""
  return "test" if zlib.crc32(prompt.encode()) % HELDOUT_BUCKETS == 0 else "train"


def draw_example(cfg: SyntheticConfig, split: str, index: int) -> dict[str, str]:
  """Example ``index`` of ``split``: drawn from its own stream until its prompt is in ``split``."""
  rng = example_rng(cfg, split, index)
  while True:
    example = make_example(rng, cfg)
    if prompt_split(example["prompt"]) == split:
      break
  # The paper-regime variant's guess, drawn after everything else: no written work.
  if cfg.guess_prob and rng.random() < cfg.guess_prob:
    example["solution"] = f"answer {example['answer']}\n"
  return example


def generate_split(cfg: SyntheticConfig, split: str) -> Iterator[dict[str, Any]]:
  """All examples of a split in order, each with its ``id`` (= index in the split)."""
  for i in range(cfg.num_examples(split)):
    yield {**draw_example(cfg, split, i), "id": i}


# ------------------------------------------------------------------------- TFDS builder
class PlainModuleBuilder:
  """Mixin for builders defined in a package module (not a TFDS dataset folder): their
  code path and their ``DatasetInfo`` (``example_info``).

  tfds 4.9.10 resolves ``code_path`` of such a builder through the
  ``importlib_resources`` backport, which tfds does not depend on: without it
  ``download_and_prepare`` fails with ``ModuleNotFoundError``. The file of the class is
  what that lookup returns anyway. List the mixin before the TFDS base class.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  DESCRIPTION = ""

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(inspect.getfile(cls))

  def example_info(self, **kwargs) -> tfds.core.DatasetInfo:
    """The ``DatasetInfo`` of every dataset here: ``prompt``, ``solution``, ``answer``
    texts and ``id`` per record, in file / generation order (shuffling disabled, so
    record ``i`` of a split has ``id == i``; ``PromptLoader`` shuffles). Built directly:
    dataset_info_from_configs() looks for README/TAGS files next to the module, which a
    builder living in a plain package does not have."""
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "prompt": tfds.features.Text(),
            "solution": tfds.features.Text(),
            "answer": tfds.features.Text(),
            "id": np.int64,
        }),
        disable_shuffling=True,
        **kwargs,
    )


@dataclasses.dataclass
class SyntheticBuilderConfig(tfds.core.BuilderConfig):
  """TFDS builder config holding a ``SyntheticConfig``; its name encodes every parameter,
  so data prepared with different settings lives in different ``data_dir`` folders."""

  synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)


_DEFAULT_BUILDER_CONFIG = SyntheticBuilderConfig(
    name=SyntheticConfig().name(), synthetic=SyntheticConfig(),
    description="default synthetic arithmetic task")


def builder_config_for(cfg: SyntheticConfig) -> SyntheticBuilderConfig:
  """The builder config of ``cfg`` (the registered default object for default settings:
  TFDS refuses a custom config that shares a name with a registered one)."""
  if cfg == _DEFAULT_BUILDER_CONFIG.synthetic:
    return _DEFAULT_BUILDER_CONFIG
  return SyntheticBuilderConfig(name=cfg.name(), synthetic=cfg,
                                description="custom synthetic arithmetic task")


class GeneratedTaskBuilder(PlainModuleBuilder, tfds.core.GeneratorBasedBuilder):
  """A task generated offline (``example_info``'s records, in generation order).
  Subclasses give ``DESCRIPTION``, ``SPLIT_NAMES`` and ``generate(split)``."""

  SPLIT_NAMES: tuple[str, ...] = ()

  def generate(self, split: str) -> Iterator[dict]:
    raise NotImplementedError

  def _info(self) -> tfds.core.DatasetInfo:
    return self.example_info()

  def _split_generators(self, dl_manager):
    del dl_manager  # generated offline
    return {split: self._generate_examples(split) for split in self.SPLIT_NAMES}

  def _generate_examples(self, split: str):
    for example in self.generate(split):
      yield example["id"], example


class SyntheticArithmetic(GeneratedTaskBuilder):
  """TFDS builder of the synthetic task; use with ``file_format="array_record"``.

  ``SyntheticArithmetic(data_dir=..., config=builder_config_for(cfg),
  file_format="array_record")``.
  """

  BUILDER_CONFIGS = [_DEFAULT_BUILDER_CONFIG]
  DESCRIPTION = "Left-to-right integer arithmetic with a written scratchpad."
  SPLIT_NAMES = tuple(SPLITS)

  def generate(self, split: str) -> Iterator[dict]:
    return generate_split(self.builder_config.synthetic, split)
