"""Datasets for RL training: the built-in synthetic task, local GSM8K / MATH, user
prompt/answer files (JSON Lines / parquet), loaders.

Every dataset is a TFDS builder stored as array_record, read by random access without
TensorFlow (``load_split``), and iterated in a seeded, resumable order (``PromptLoader``).
"""

from sagc_jax.data.loader import (DATASET_NAMES, DataSource, PromptLoader, builder_options,
                                  example_location, load_split, make_builder)
from sagc_jax.data.local_math import BOXED_INSTRUCTION, Gsm8kLocal, MathLocal, make_prompt
from sagc_jax.data.prompt_files import FILE_FORMATS, FilesSpec, PromptAnswerFiles
from sagc_jax.data.synthetic import (SyntheticArithmetic, SyntheticBuilderConfig,
                                     SyntheticConfig, generate_split, make_example)

__all__ = [
    "BOXED_INSTRUCTION",
    "DATASET_NAMES",
    "DataSource",
    "FILE_FORMATS",
    "FilesSpec",
    "Gsm8kLocal",
    "MathLocal",
    "PromptAnswerFiles",
    "PromptLoader",
    "SyntheticArithmetic",
    "SyntheticBuilderConfig",
    "SyntheticConfig",
    "builder_options",
    "example_location",
    "generate_split",
    "load_split",
    "make_builder",
    "make_example",
    "make_prompt",
]
