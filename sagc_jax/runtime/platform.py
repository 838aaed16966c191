"""The JAX platform of a command-line run, chosen before JAX starts.

With libtpu installed (the ``tpu`` extra, which the ``test`` extra includes), JAX
initialises its TPU plugin in every process, even on hosts without a TPU: libtpu
then logs host-bound and worker-hostname errors, takes a per-host lockfile, and
another process holding that lockfile makes TPU initialisation wait or fail. A host
without any TPU device file and no TPU environment has nothing to find there, so
our commands set ``JAX_PLATFORMS=cpu`` on it unless a GPU plugin is installed (JAX
then chooses between GPU and CPU itself). A TPU VM (``/dev/accel*``, ``/dev/vfio``)
or an explicit ``JAX_PLATFORMS`` is never touched, so pods keep their platform.
Ahead-of-time compilation for abstract TPU topologies works with the CPU platform.
"""

from __future__ import annotations

import glob
import importlib.util
import os

__all__ = ["choose_platform", "has_tpu", "prepare_process"]

_GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                "jax_rocm7_plugin", "jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


# Set by a TPU VM's runtime or a pod launcher (JAX itself sets TPU_SKIP_MDS_QUERY on
# hosts *without* chips, so a plain "TPU_" prefix would mislead).
_TPU_ENVIRONMENT = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID",
                    "TPU_NAME", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS",
                    "CLOUD_TPU_TASK_ID")


def has_tpu(environ=os.environ) -> bool:
  """A TPU device file (``/dev/accel*``, ``/dev/vfio``) or TPU runtime environment."""
  return bool(glob.glob("/dev/accel*") or os.path.exists("/dev/vfio")
              or any(key in environ for key in _TPU_ENVIRONMENT))


def _has_gpu_plugin() -> bool:
  for name in _GPU_PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except (ImportError, ValueError):
      continue
  return False


def choose_platform(environ=os.environ) -> str | None:
  """Sets ``JAX_PLATFORMS=cpu`` when this host can only run JAX on CPU; returns the
  value set (None when left to JAX). Call before JAX is imported."""
  if "JAX_PLATFORMS" in environ or has_tpu(environ) or _has_gpu_plugin():
    return None
  environ["JAX_PLATFORMS"] = "cpu"
  return "cpu"


def prepare_process(environ=os.environ) -> None:
  """What every command sets before its libraries start: the JAX platform
  (``choose_platform``), and transformers' advisory warnings off. transformers prints
  "PyTorch was not found. Models won't be available ..." at import on an install
  without torch; our commands use it for tokenizers and config files only, which need
  no torch, so the line would only mislead."""
  choose_platform(environ)
  environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
