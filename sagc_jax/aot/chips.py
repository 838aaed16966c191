"""Per-chip figures of Cloud TPU generations, for fit checks and rooflines.

Peak dense bfloat16 FLOP/s, HBM capacity and HBM bandwidth per chip, as published in
the Cloud TPU system-architecture pages (checked November 2026):

* v4:  https://cloud.google.com/tpu/docs/v4   — 275 TFLOP/s, 32 GiB, 1228 GB/s
* v5e: https://cloud.google.com/tpu/docs/v5e  — 197 TFLOP/s, 16 GiB,  819 GB/s
* v5p: https://cloud.google.com/tpu/docs/v5p  — 459 TFLOP/s, 95 GiB, 2765 GB/s
* v6e: https://cloud.google.com/tpu/docs/v6e  — 918 TFLOP/s, 32 GiB, 1640 GB/s

JAX may expose a chip as several devices (v4's two TensorCores in the abstract
topology); ``per_device`` divides the chip's figures by the devices per chip.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["CHIPS", "ChipSpec", "HBM_LIMIT", "generation_of"]

HBM_LIMIT = 0.9          # an executable "fits" when its peak is at most 90% of HBM


@dataclasses.dataclass(frozen=True)
class ChipSpec:
  name: str
  hbm_gib: float
  bf16_tflops: float
  hbm_gbps: float
  source: str

  def per_device(self, devices_per_chip: int) -> "ChipSpec":
    if devices_per_chip == 1:
      return self
    n = devices_per_chip
    return dataclasses.replace(self, name=f"{self.name} (1/{n} chip)", hbm_gib=self.hbm_gib / n,
                               bf16_tflops=self.bf16_tflops / n, hbm_gbps=self.hbm_gbps / n)

  def roofline_s(self, flops: float, hbm_bytes: float) -> float:
    """max(compute time, memory time): the time no implementation can beat."""
    return max(flops / (self.bf16_tflops * 1e12), hbm_bytes / (self.hbm_gbps * 1e9))


CHIPS = {
    "v4": ChipSpec("v4", 32, 275, 1228, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": ChipSpec("v5e", 16, 197, 819, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": ChipSpec("v5p", 95, 459, 2765, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": ChipSpec("v6e", 32, 918, 1640, "https://cloud.google.com/tpu/docs/v6e"),
}


def generation_of(topology: str) -> tuple[ChipSpec, int]:
  """(chip spec, number of chips) of a topology name such as ``v5e:4x4``."""
  try:
    gen, dims = topology.split(":")
    chips = math.prod(int(d) for d in dims.split("x"))
  except ValueError:
    raise ValueError(f"--topology={topology!r}: expected GEN:AxB[xC], e.g. v5e:4x4") from None
  if gen not in CHIPS:
    raise ValueError(f"--topology={topology!r}: generation {gen!r} is not one of "
                     f"{tuple(CHIPS)}")
  return CHIPS[gen], chips
