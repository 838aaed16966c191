"""What ``signal_rate`` (``control.signal_rate``) knows of a step's seconds: a
two-feature Bayesian linear regression with forgetting, and calibrate's fit of a trace
as its prior. The cost model's form is in ``control.signal_rate``'s module docstring.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["CostRegression", "seed_coefficients"]


class CostRegression:
  """``y = x . c`` for two features, Bayesian linear regression with forgetting: the
  discounted normal equations plus a Gaussian prior on ``c`` (mean ``prior``, precision
  ``weight`` steps' worth in the units of the first step's features, diagonal; a tenth
  of a step without a seed: it only fixes the direction one size cannot tell), the
  noise variance from the discounted residuals of the current fit. Without a prior mean
  the first step's seconds are split evenly between the two terms: a size not yet tried
  is priced half as a fixed and half as a per-row cost of the sizes seen. Plain floats:
  a 2 x 2 system per step."""

  def __init__(self, forgetting: float, prior: Sequence[float] = (0.0, 0.0),
               weight: float = 0.1):
    self.forgetting = forgetting
    self.prior = [float(c) for c in prior]
    self.weight = float(weight)
    self.scale: list[float] | None = None    # |x| of the first step: the prior's units
    self.xx = [0.0, 0.0, 0.0]                # sum x0^2, x0 x1, x1^2 (discounted)
    self.xy = [0.0, 0.0]
    self.yy = 0.0
    self.n = 0.0

  def _system(self) -> tuple[list[float], list[float]]:
    s0, s1 = self.scale or (1.0, 1.0)
    p0, p1 = self.weight * s0 * s0, self.weight * s1 * s1
    a = [self.xx[0] + p0, self.xx[1], self.xx[2] + p1]
    return a, [self.xy[0] + p0 * self.prior[0], self.xy[1] + p1 * self.prior[1]]

  def coefficients(self) -> tuple[float, float]:
    a, b = self._system()
    det = a[0] * a[2] - a[1] * a[1]
    return (a[2] * b[0] - a[1] * b[1]) / det, (a[0] * b[1] - a[1] * b[0]) / det

  def draw(self, rng: np.random.Generator) -> tuple[float, float]:
    """Coefficients drawn from the posterior ``N(c, sigma^2 A^-1)``, each at least 0 (a
    cost)."""
    c0, c1 = self.coefficients()
    a, _ = self._system()
    det = a[0] * a[2] - a[1] * a[1]
    xx, xy = self.xx, self.xy
    sse = (self.yy - 2.0 * (c0 * xy[0] + c1 * xy[1])
           + c0 * c0 * xx[0] + 2.0 * c0 * c1 * xx[1] + c1 * c1 * xx[2])
    noise = max(sse, 0.0) / max(self.n - 2.0, 1.0)
    v00, v01, v11 = noise * a[2] / det, -noise * a[1] / det, noise * a[0] / det
    l00 = math.sqrt(max(v00, 0.0))
    l10 = v01 / l00 if l00 > 0 else 0.0
    l11 = math.sqrt(max(v11 - l10 * l10, 0.0))
    z0, z1 = rng.standard_normal(2)
    return max(c0 + l00 * z0, 0.0), max(c1 + l10 * z0 + l11 * z1, 0.0)

  def update(self, x: Sequence[float], y: float) -> None:
    if self.scale is None:
      self.scale = [abs(v) or 1.0 for v in x]
    g = self.forgetting
    self.xx = [g * self.xx[0] + x[0] * x[0], g * self.xx[1] + x[0] * x[1],
               g * self.xx[2] + x[1] * x[1]]
    self.xy = [g * self.xy[0] + x[0] * y, g * self.xy[1] + x[1] * y]
    self.yy = g * self.yy + y * y
    self.n = g * self.n + 1.0

  def state_dict(self) -> dict[str, Any]:
    return {"scale": self.scale, "xx": self.xx, "xy": self.xy, "yy": self.yy, "n": self.n}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.scale = None if state["scale"] is None else [float(v) for v in state["scale"]]
    self.xx, self.xy = [float(v) for v in state["xx"]], [float(v) for v in state["xy"]]
    self.yy, self.n = float(state["yy"]), float(state["n"])


def seed_coefficients(seed: Sequence[float]) -> tuple[tuple[float, float], tuple[float, float]]:
  """(rollout, learner) prior coefficients from ``cost_seed = (step_s, slot_s,
  learner_step_s, learner_token_s)``, calibrate's fit of a trace (``replay.costs.DecodeCost``;
  calibrate prints it as an override)."""
  values = tuple(seed)
  if len(values) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                 and math.isfinite(v) and v >= 0 for v in values):
    raise ValueError(f"cost_seed={values!r} must be () or 4 seconds >= 0: (step_s, slot_s, "
                     "learner_step_s, learner_token_s), as calibrate prints them")
  return (float(values[0]), float(values[1])), (float(values[2]), float(values[3]))
