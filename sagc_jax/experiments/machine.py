"""Where a measurement came from: CPU model, core count, accelerator, jax version.

Wall-clock and even XLA:CPU numerics differ between machines, so every figure and
result file this project writes names the machine it was measured on. Importing this
module needs neither jax nor matplotlib (the numpy-only simulator uses it too).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

__all__ = ["machine_info", "machine_line", "package_version", "stamp"]


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown CPU"


def package_version(package: str) -> str | None:
  """The installed version of ``package`` (a distribution name); None when absent."""
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def machine_info() -> dict[str, Any]:
  """CPU model, usable cores, OS, Python, jax / jaxlib versions and, when jax is
  already imported, its backend and device kind."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:                       # not on Linux
    cores = os.cpu_count() or 0
  info: dict[str, Any] = {
      "cpu": _cpu_model(), "cores": cores, "os": f"{platform.system()} {platform.release()}",
      "python": platform.python_version(),
      **{name: package_version(name) or "not installed" for name in ("jax", "jaxlib")}}
  jax = sys.modules.get("jax")
  if jax is not None:
    devices = jax.devices()
    info.update(backend=jax.default_backend(), devices=len(devices),
                device_kind=devices[0].device_kind)
  return info


def machine_line(info: dict[str, Any] | None = None) -> str:
  """One line for a figure footer or a table caption."""
  info = info or machine_info()
  line = f"{info['cpu']}, {info['cores']} cores, jax {info['jax']}"
  if info.get("backend") and info["backend"] != "cpu":
    line += f", {info['devices']} x {info['device_kind']}"
  return line


def stamp(fig, info: dict[str, Any] | None = None) -> None:
  """Lays out ``fig`` leaving a strip at the bottom and writes the machine there."""
  fig.tight_layout(rect=(0, 0.03, 1, 1))
  fig.text(0.005, 0.004, f"measured on: {machine_line(info)}", fontsize=6, color="0.35",
           ha="left", va="bottom")
