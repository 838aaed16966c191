"""Datasets for RL training: the built-in synthetic task, local GSM8K / MATH, user
prompt/answer files (JSON Lines / parquet), loaders.

Every dataset is a TFDS builder stored as array_record, read by random access without
TensorFlow (``load_split``), and iterated in a seeded, resumable order (``PromptLoader``).
The builders and their settings live in their own modules (``synthetic``,
``word_problems``, ``local_math``, ``prompt_files``); this package exports the loader.
"""

from sagc_jax.data.loader import (DATASET_NAMES, DataSource, PromptLoader, builder_options,
                                  example_location, load_split, make_builder)
from sagc_jax.data.prompt_files import FILE_FORMATS

__all__ = ["DATASET_NAMES", "DataSource", "FILE_FORMATS", "PromptLoader", "builder_options",
           "example_location", "load_split", "make_builder"]
