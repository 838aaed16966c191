"""Decoding settings of a sampler (``SamplingParams``), validated once."""

from __future__ import annotations

import dataclasses
import math

__all__ = ["SamplingParams"]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Static decoding settings (each distinct value compiles its own program).

  Attributes:
    max_new_tokens: response length cap (tokens, including the stop token).
    temperature: 0 = greedy; otherwise logits are divided by it.
    top_p: nucleus mass in (0, 1]; 1 disables it.
    top_k: keep the k most likely tokens; 0 disables it.
    stop_ids: token ids that end a response (EOS and any stop tokens).
    pad_id: id written in padding positions.
  """
  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop_ids: tuple[int, ...] = ()
  pad_id: int = 0

  def __post_init__(self):
    """The one check of these settings (the training config's ``rollout`` section
    is validated by building one)."""
    def is_int(v):
      return isinstance(v, int) and not isinstance(v, bool)

    def is_number(v):
      return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if not is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
      raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be a positive int")
    if not is_number(self.temperature) or self.temperature < 0:
      raise ValueError(f"temperature={self.temperature!r} must be >= 0 (0 = greedy)")
    if not is_number(self.top_p) or not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p!r} must be in (0, 1]")
    if not is_int(self.top_k) or self.top_k < 0:
      raise ValueError(f"top_k={self.top_k!r} must be an int >= 0 (0 = off)")
    # The one normalisation of stop ids: sorted, unique Python ints.
    object.__setattr__(self, "stop_ids", tuple(sorted({int(i) for i in self.stop_ids})))
    if not self.stop_ids:
      raise ValueError("stop_ids is empty: give at least the EOS id")
