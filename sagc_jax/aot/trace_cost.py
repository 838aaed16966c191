"""A replayed step priced by a preset's compiled programs on a TPU topology: the
``aot:REPORT.json`` cost model of ``python -m sagc_jax.simulate --trace``.

``REPORT.json`` is ``python -m sagc_jax.aot --config PRESET --topology T --out
REPORT.json``. Its rooflines price what a pod pays for (decode is bandwidth-bound, so
a decode step costs about the same whatever the rows):

* Refill sampler (``report["refill"]``): a round of rows costs
  ``(sum(lengths) / slots + max(lengths)) x step`` plus one prefill program per
  ``slots`` rows admitted: every token decoded at full slot occupancy, plus the
  longest row's own tail. ``step`` is the segment program's roofline plus the
  Pallas kernel's reads of the keys a lane holds (``slots_per_lane x (prompt +
  mean length / 2)`` keys at ``kv_ms_per_key``). How far the AOT report's own
  simulation of the slot schedule (``refill_report.project_refill``) stands from this
  bound is its ``rollout_over_bound`` per length model (``bound_ratios``), which the
  replay prints beside its tables.
* Fused sampler: each sub-call of a round decodes until its longest row is done:
  ``generate_ms + (longest - 1) x decode_step_ms`` per call of the sampler's call
  rows.
* Learner: ``projected_learner_s`` is the learner at the worst case (the row budget,
  every response at the cap); a step is priced by the tokens of the rows it trains
  (DAPO: the kept groups of every round) against that (a packed learner's cost
  follows its tokens).

Lengths: the trace's responses are scaled from its cap to the preset's
(``length_scale``); a response the trace truncated stays at the cap. How much of a
result rests on those is the share of steps whose longest row is capped
(``capped_steps``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["CompiledStepCost"]


@dataclasses.dataclass(frozen=True)
class CompiledStepCost:
  """Step seconds from an AOT report (module docstring)."""

  report: dict[str, Any]
  source: str = ""

  @classmethod
  def load(cls, path: str | Path) -> "CompiledStepCost":
    path = Path(path)
    if not path.is_file():
      raise ValueError(f"AOT report {path} is not a file (python -m sagc_jax.aot ... "
                       "--out REPORT.json writes one)")
    try:
      report = json.loads(path.read_text())
    except ValueError as err:
      raise ValueError(f"AOT report {path} is not JSON ({err})") from None
    missing = [k for k in ("rollout", "projected_learner_s", "decode_step_ms")
               if report.get(k) is None]
    if missing:
      raise ValueError(f"AOT report {path} lacks {', '.join(missing)}: write it again with "
                       "this version of python -m sagc_jax.aot (without --only)")
    return cls(report, str(path))

  @property
  def name(self) -> str:
    return f"aot:{Path(self.source).name}"

  @property
  def bound_ratios(self) -> dict[str, float]:
    """The report's refill projection over this bound, per length model (none: dense)."""
    return dict((self.report.get("refill") or {}).get("rollout_over_bound", {}))

  @property
  def cap(self) -> int:
    return int(self.report["rollout"]["max_new_tokens"])

  @property
  def rollout(self) -> dict[str, Any]:
    """The preset's rollout budget (mode, rollouts or prompts per step)."""
    r = self.report["rollout"]
    return {k: r[k] for k in ("mode", "rollouts_per_step", "prompts_per_step")}

  def settings(self, trace) -> dict[str, Any]:
    """A replay under this cost takes the preset's rollout budget, candidate sizes (its
    compiled row buckets hold them) and DAPO rounds limit, and the trace's lengths
    scaled from the trace's cap to the preset's."""
    from sagc_jax.control.engine import replay_settings

    r = self.report["rollout"]
    return replay_settings(trace, rollout=self.rollout, candidates=sorted(r["group_sizes"]),
                           max_rounds=int(r["dynamic_max_rounds"]),
                           length_scale=self.cap / trace.max_new_tokens, length_cap=self.cap)

  def _rows_budget(self) -> int:
    r = self.report["rollout"]
    if r["mode"] == "hold_rollouts":
      return int(r["rollouts_per_step"])
    return int(r["prompts_per_step"]) * max(r["group_sizes"])

  def _refill_round_s(self, lengths: np.ndarray, prompt_tokens: np.ndarray) -> float:
    f = self.report["refill"]
    slots = int(f["slots"])
    keys = slots // int(f["lanes"]) * (float(prompt_tokens.mean()) + float(lengths.mean()) / 2)
    step_ms = f["segment_ms"] + f["kv_ms_per_key"] * keys
    decode_ms = (lengths.sum() / slots + lengths.max()) * step_ms
    # An admission round fills at most every slot: ceil(rows / slots) prefills at least.
    return (decode_ms + math.ceil(lengths.size / slots) * f["prefill_ms"]) / 1e3

  def _dense_round_s(self, lengths: np.ndarray) -> float:
    calls = int(self.report.get("sampler_calls_per_round") or 1)
    per_call = math.ceil(lengths.size / calls)
    seconds = 0.0
    for lo in range(0, lengths.size, per_call):
      longest = int(lengths[lo:lo + per_call].max())
      seconds += (self.report["generate_ms"] + (longest - 1) * self.report["decode_step_ms"])
    return seconds / 1e3

  def __call__(self, rounds: Sequence[tuple[np.ndarray, np.ndarray]],
               trained: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    refill = self.report.get("refill") is not None
    rollout = sum(self._refill_round_s(lengths, prompts) if refill
                  else self._dense_round_s(lengths) for lengths, prompts in rounds)
    lengths, prompts = trained
    prompt_max = max(self.report["rollout"]["prompt_buckets"])
    learner = self.report["projected_learner_s"] * float(lengths.sum() + prompts.sum()) / (
        self._rows_budget() * (prompt_max + self.cap))
    return {"rollout_s": rollout, "learner_s": learner, "total_s": rollout + learner}
