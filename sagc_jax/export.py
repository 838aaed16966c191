"""``python -m sagc_jax.export --workdir DIR --out FOLDER [--step N]``: a run's policy as
a Hugging Face folder that transformers and vLLM load as they are.

Reads the run (``DIR/config.json`` and one checkpoint's parameters, nothing
else) and writes nothing into it. The folder gets the policy's weights as
safetensors in HF names and layouts (``save_pretrained``), ``config.json``, and
every other file of the folder the run started from: tokenizer files with the
chat template and ``generation_config.json`` (written from the model's EOS /
BOS / pad ids when the base folder has none, so generation stops where the
sampler stopped). ``DIR`` and ``FOLDER`` may be gs:// paths; the base folder
(the run's ``model.path``) is staged like in training. The writer is
``sagc_jax.training.export``.
"""

from __future__ import annotations

from typing import Sequence

from sagc_jax.cli import run_absl_tool


def _define_flags():
  from absl import flags

  flags.DEFINE_string("workdir", None, "Training run directory (local or gs://).")
  flags.DEFINE_string("out", None, "Folder to write (local or gs://); must not exist yet.")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest).")
  flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                    "Weight dtype (default: the run's model.dtype).")
  flags.DEFINE_string("base", None, "HF folder with the run's tokenizer and config "
                      "(default: the run's model.path, or its tiny-model warm start).")
  flags.mark_flags_as_required(["workdir", "out"])
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  from absl import logging
  logging.set_verbosity(logging.WARNING)       # orbax logs every file at INFO
  from sagc_jax.training.export import export

  export(flags.workdir, flags.out, step=flags.step, dtype=flags.dtype, base=flags.base)


def run() -> None:
  """Console entry point ``sagc-export``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
