"""A clock that does not drift: each training step priced from the work it logged.

Wall-clock step time moves with the machine (its load, its clock speed, the hour), and
a comparison runs its arms one after another, so drift can favour whichever arm ran
while the machine was fast. Every step also logs its work, which no drift moves: its
sampling rounds' longest rows (``decode_longest``: the decode iterations of rounds that
decode in one call, each iteration paying a fixed cost; a lower bound for rounds split
into sub-calls or refilled through slots), its decode slots (``decode_slots``: rows x
decode steps, the per-row cost), whether the learner ran, and the prompt and response
tokens it trained on (``learner/sequence_tokens``, once per epoch). A fixed linear price
of that work is calibrate's CPU decode and learner cost (``replay.costs.DecodeCost``,
whose terms are the same: ``training.trace_sampling``):

  ``seconds = step_s x decode_longest + slot_s x decode_slots
  + learner_step_s x (the learner ran) + learner_token_s x trained tokens``

* ``cpu:TRACE.jsonl`` takes those four prices from a trace that ``python -m
  sagc_jax.calibrate`` fitted on this machine;
* ``fit`` (the default) fits them by non-negative least squares to every step of the
  comparison at once, pooled over arms and seeds, so one price applies to all arms
  and the arms differ only in the work they did.

Steps logged before ``decode_longest`` existed are read as ``response_len_max`` times
their sampling rounds (an upper bound). The fit reports its R^2 over the steps: how much
of the wall-clock's variation the work explains; the rest is drift, or work the price
leaves out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

__all__ = ["Price", "price_from_setting", "step_work"]

_TERMS = ("step_s", "slot_s", "learner_step_s", "learner_token_s")


def step_work(row: dict[str, Any]) -> np.ndarray:
  """One metrics row's work, in the order of the price's terms: decode iterations,
  decode slots, whether the learner ran (0 or 1) and trained tokens."""
  longest = row.get("decode_longest")
  if longest is None:
    longest = row.get("response_len_max", 0.0) * row.get("sampling_rounds", 1.0)
  slots = row.get("decode_slots")
  if slots is None:            # rows from before decode_slots was logged
    slots = row.get("generated_tokens", 0.0) / (row.get("padding_efficiency") or 1.0)
  trained = float(row.get("learner/sequence_tokens", 0.0))
  ran = not row.get("update_skipped", 0.0) if "update_skipped" in row else trained > 0
  return np.array([float(longest), float(slots), float(ran), trained])


@dataclasses.dataclass(frozen=True)
class Price:
  """Seconds per unit of each work term (``_TERMS``), and where the prices came from."""

  step_s: float
  slot_s: float
  learner_step_s: float
  learner_token_s: float
  source: str
  r2: float | None = None       # of the fit over the steps (None: not fitted here)

  def __call__(self, row: dict[str, Any]) -> float:
    return float(step_work(row) @ self.terms())

  def terms(self) -> np.ndarray:
    return np.array([getattr(self, t) for t in _TERMS])

  def describe(self) -> dict[str, Any]:
    return {**{t: getattr(self, t) for t in _TERMS}, "source": self.source, "r2": self.r2}


def _fit(rows: Sequence[dict[str, Any]]) -> Price:
  """Non-negative least squares of the rows' ``time_total_s`` on their work."""
  from scipy.optimize import nnls

  rows = [r for r in rows if "time_total_s" in r]
  if len(rows) < len(_TERMS):
    raise ValueError(f"the priced clock's fit needs at least {len(_TERMS)} steps, "
                     f"the comparison has {len(rows)}")
  work = np.stack([step_work(r) for r in rows])
  if not work[:, [0, 1, 3]].any():
    raise ValueError("the steps log no work (decode_longest, generated_tokens, "
                     "learner/sequence_tokens) to price")
  seconds = np.array([float(r["time_total_s"]) for r in rows])
  scale = np.maximum(work.max(axis=0), 1.0)          # columns of comparable size
  try:
    coef, _ = nnls(work / scale, seconds)
  except RuntimeError as err:            # nnls's iteration limit
    raise ValueError(f"the priced clock's fit did not converge ({err})") from None
  coef = coef / scale
  residual = seconds - work @ coef
  r2 = float(1.0 - residual @ residual / max(float(np.sum((seconds - seconds.mean()) ** 2)),
                                             1e-30))
  return Price(*coef, source=f"fit: non-negative least squares on all {len(rows)} steps "
               f"of the comparison, R^2 {r2:.2f}", r2=r2)


def price_from_setting(setting: str, rows: Sequence[dict[str, Any]]) -> Price:
  """The price ``compare.priced_cost`` names (module docstring): ``fit`` (or empty)
  fitted to ``rows``, or ``cpu:TRACE.jsonl``."""
  if setting in ("", "fit"):
    return _fit(rows)
  if setting.startswith("cpu:") and len(setting) > 4:
    from sagc_jax.replay.costs import DecodeCost
    from sagc_jax.replay.trace import read_trace

    cost = DecodeCost.of(read_trace(setting[4:]))
    return Price(cost.step_s, cost.slot_s, cost.learner_step_s, cost.learner_token_s,
                 source=f"calibrate's CPU cost of {setting[4:]}")
  raise ValueError(f"compare.priced_cost={setting!r} is not 'fit' or 'cpu:TRACE.jsonl' "
                   "(a trace written by python -m sagc_jax.calibrate)")
