"""Seeds derived from integers: every random draw of a run (rollout sampling per step
and round, evaluation batches) takes its key from ``seed_for(config.seed, ...)``, so a
resumed run draws exactly what an uninterrupted one would have."""

from __future__ import annotations

import numpy as np

__all__ = ["seed_for"]


def seed_for(*parts: int) -> int:
  """A 32-bit seed derived from integers (stable across runs and resumes)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])
