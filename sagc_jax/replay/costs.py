"""What a replayed step costs: the ``CostFn`` protocol every cost model meets, the three
cost models, and the factory that builds one from a ``--cost`` flag.

* ``CostModel``: a synthetic step cost (the simulate worlds' ``cost`` section).
* ``DecodeCost``: a trace's measured CPU decode and learner cost (``cpu``).
* ``CompiledStepCost``: a preset's compiled programs on a TPU topology
  (``aot:REPORT.json``, written by ``python -m sagc_jax.aot``).

A cost prices the step's sampling ``rounds``, each ``(lengths of its rows, its prompts'
token lengths)``, and the rows the learner ``trained`` (``(response lengths, prompt
token lengths)``, one entry per row), as ``{"rollout_s", "learner_s", "total_s"}``.

The compiled cost, ``aot:REPORT.json``:
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
import math
from pathlib import Path
from typing import Any, ClassVar, Protocol, Sequence

import numpy as np

from sagc_jax.base import checks
from sagc_jax.control.budget import budget_from_flag
from sagc_jax.runtime.storage import read_json

__all__ = ["CompiledStepCost", "CostFn", "CostModel", "DecodeCost", "budgeted_settings",
           "cost_from_flag", "replay_settings"]

Rounds = Sequence[tuple[np.ndarray, np.ndarray]]


class CostFn(Protocol):
  """A step's priced seconds (module docstring). ``name`` labels the reports."""

  name: str

  def __call__(self, rounds: Rounds, trained: tuple[np.ndarray, np.ndarray]
               ) -> dict[str, float]: ...


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Wall-clock of one synchronous RL step (seconds), per round of ``rows`` rows whose
  longest response is ``longest`` tokens and longest prompt ``prompt`` tokens:

  * prefill: ``prefill_s_per_token * rows * prompt``;
  * decode: every row advances in lock-step until the longest response of the round
    is done, each iteration costing ``decode_s_per_iter + decode_s_per_row_iter *
    rows`` (memory-bound: a fixed weight-streaming cost plus a per-row KV-cache cost);
  * learner: ``learner_s_per_token * rows * (prompt + longest)`` over the trained rows,
    padded to the longest;
  * ``step_overhead_s`` for rewards, host work and the optimizer update.
  """

  prefill_s_per_token: float
  decode_s_per_iter: float
  decode_s_per_row_iter: float
  learner_s_per_token: float
  step_overhead_s: float
  name: ClassVar[str] = "synthetic"

  @classmethod
  def of(cls, config: Any) -> "CostModel":
    return cls(**{f.name: float(config.cost[f.name]) for f in dataclasses.fields(cls)})

  def __call__(self, rounds: Rounds, trained: tuple[np.ndarray, np.ndarray]
               ) -> dict[str, float]:
    rollout = sum(self.prefill_s_per_token * lengths.size * int(prompts.max())
                  + int(lengths.max()) * (self.decode_s_per_iter
                                          + self.decode_s_per_row_iter * lengths.size)
                  for lengths, prompts in rounds)
    lengths, prompts = trained
    learner = (self.learner_s_per_token * lengths.size
               * (int(prompts.max()) + int(lengths.max())) if lengths.size else 0.0)
    return {"rollout_s": rollout, "learner_s": learner,
            "total_s": rollout + learner + self.step_overhead_s}


@dataclasses.dataclass(frozen=True)
class DecodeCost:
  """A trace's measured CPU cost (``training.trace_sampling``): a sampling round runs
  until its longest row is done, each decode step costing ``step_s`` plus ``slot_s``
  per row still decoding (finished rows are compacted away), so a round costs ``step_s
  x longest + slot_s x sum(lengths)``; the learner's update costs ``learner_step_s +
  learner_token_s x`` the trained rows' prompt and response tokens (0 for a trace
  recorded without the learner's timing)."""

  step_s: float
  slot_s: float
  learner_step_s: float = 0.0
  learner_token_s: float = 0.0
  name: str = "cpu"

  @classmethod
  def of(cls, trace: Any) -> "DecodeCost":
    fit = trace.header.get("decode_cost") or {}
    if "step_s" not in fit:
      raise ValueError("the trace's header holds no decode_cost with step_s and slot_s: the "
                       "'cpu' cost model needs a trace written by python -m sagc_jax.calibrate")
    learner = trace.header.get("learner_cost") or {}
    return cls(float(fit["step_s"]), float(fit["slot_s"]), float(learner.get("step_s", 0.0)),
               float(learner.get("token_s", 0.0)))

  def cost_seed(self, trace: Any) -> tuple[float, float, float, float]:
    """This fit as ``signal_rate``'s ``cost_seed``, linearised at ``trace``'s lengths: a
    round's decoded tokens (``rows x`` the mean length) and the learner's prompt and
    response tokens become ``signal_rate``'s ``rows x`` the median length
    (``control.signal_rate``)."""
    mean, median, prompt_mean = length_stats(trace.lengths, trace.prompt_tokens)
    return (self.step_s, self.slot_s * mean / median, self.learner_step_s,
            self.learner_token_s * (mean + prompt_mean) / median)

  def settings(self, trace: Any) -> dict[str, Any]:
    """What a replay under this cost takes from the trace's run: its rollout budget,
    candidate sizes and DAPO rounds limit, lengths as recorded."""
    return replay_settings(trace)

  def __call__(self, rounds: Rounds, trained: Any = None) -> dict[str, float]:
    rollout = sum(self.step_s * int(lengths.max()) + self.slot_s * float(lengths.sum())
                  for lengths, _ in rounds)
    learner = 0.0
    if trained is not None and trained[0].size and (self.learner_step_s or self.learner_token_s):
      tokens = float(trained[0].sum() + trained[1].sum())
      learner = self.learner_step_s + self.learner_token_s * tokens
    return {"rollout_s": rollout, "learner_s": learner, "total_s": rollout + learner}


def length_stats(lengths: np.ndarray, prompt_tokens: np.ndarray) -> tuple[float, float, float]:
  """(mean response length, mean over prompts of the median, mean prompt length) of a
  trace's ``[prompts, responses]`` lengths: where a cost is linearised into
  ``signal_rate``'s form, whose per-row terms count ``rows x`` the median (at least 1)."""
  return (float(lengths.mean()), max(float(np.median(lengths, axis=1).mean()), 1.0),
          float(prompt_tokens.mean()))


def replay_settings(trace: Any, **changes: Any) -> dict[str, Any]:
  """The replay settings of a trace's run (``rollout``, ``candidates``, ``max_rounds``,
  ``length_scale``, ``length_cap``), with ``changes`` (a cost model's own budget)."""
  header = trace.header
  return {"rollout": dict(header["rollout"]),
          "candidates": sorted(header["controller"]["candidates"]),
          "max_rounds": int(header.get("learner", {}).get("dynamic_max_rounds", 3)),
          "length_scale": 1.0, "length_cap": trace.max_new_tokens, **changes}


@dataclasses.dataclass(frozen=True)
class CompiledStepCost:
  """Step seconds from an AOT report (module docstring). ``load`` refuses a report that
  lacks a field the cost reads, naming its dotted path (``refill.*`` only when the
  report has a refill sampler; else ``generate_ms``)."""

  report: dict[str, Any]
  source: str = ""
  FIELDS: ClassVar[tuple[str, ...]] = ("rollout", "projected_learner_s", "decode_step_ms")

  @classmethod
  def load(cls, path: str | Path) -> "CompiledStepCost":
    path = Path(path)
    if not path.is_file():
      raise ValueError(f"AOT report {path} is not a file (python -m sagc_jax.aot ... "
                       "--out REPORT.json writes one)")
    report = read_json(path)
    if not isinstance(report, dict):
      raise ValueError(f"AOT report {path} is not a JSON object")
    # The top-level fields first, then every nested field the cost reads (a refill
    # report's pricing, else the fused sampler's), so a missing one is named at load.
    for fields in (cls.FIELDS, cls._nested_fields(report)):
      missing = [k for k in fields if _lookup(report, k) is None]
      if missing:
        raise ValueError(f"AOT report {path} lacks {', '.join(missing)}: write it again with "
                         "this version of python -m sagc_jax.aot (without --only)")
    return cls(report, str(path))

  @staticmethod
  def _nested_fields(report: dict[str, Any]) -> list[str]:
    rollout = [f"rollout.{k}" for k in ("mode", "rollouts_per_step", "prompts_per_step",
                                        "max_new_tokens", "prompt_buckets", "group_sizes",
                                        "dynamic_max_rounds")]
    if report.get("refill") is None:      # the fused (dense) sampler
      return rollout + ["generate_ms"]
    return rollout + [f"refill.{k}" for k in ("slots", "lanes", "segment_ms", "kv_ms_per_key",
                                              "prefill_ms")]

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
    r = self.report["rollout"]
    return replay_settings(trace, rollout=self.rollout, candidates=sorted(r["group_sizes"]),
                           max_rounds=int(r["dynamic_max_rounds"]),
                           length_scale=self.cap / trace.max_new_tokens, length_cap=self.cap)

  def cost_seed(self, trace: Any) -> tuple[float, float, float, float]:
    """This report's cost in ``signal_rate``'s linear form (``cost_seed``: per longest
    token, per row token at the median length, per update, per trained response token),
    linearised at ``trace``'s lengths scaled to the preset's cap, as a replay scales them.
    Refill: a decode step's time at the trace's mean KV keys; the prefills and the rows'
    mean-over-median length go into the per-row term. Dense: each call decodes to its own
    longest row; its prefill is a per-step constant. Learner: the projected update per
    token, prompts included, per response token at the median."""
    lengths = np.minimum(trace.lengths * (self.cap / trace.max_new_tokens), self.cap)
    mean, median, prompt_mean = length_stats(lengths, trace.prompt_tokens)
    refill, report = self.report.get("refill"), self.report
    constant = 0.0
    if refill is not None:
      slots = int(refill["slots"])
      step_s = (refill["segment_ms"] + refill["kv_ms_per_key"] * (slots // int(refill["lanes"]))
                * (prompt_mean + mean / 2)) / 1e3
      slot_s = (step_s * mean + refill["prefill_ms"] / 1e3) / (slots * median)
    else:
      calls = int(report.get("sampler_calls_per_round") or 1)
      step_s, slot_s = calls * report["decode_step_ms"] / 1e3, 0.0
      constant = calls * max(report["generate_ms"] - report["decode_step_ms"], 0.0) / 1e3
    per_token = report["projected_learner_s"] / (
        self._rows_budget() * (max(report["rollout"]["prompt_buckets"]) + self.cap))
    return (step_s, slot_s, constant, per_token * (mean + prompt_mean) / median)

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
    longest = [int(lengths[lo:lo + per_call].max()) for lo in range(0, lengths.size, per_call)]
    return sum(self.report["generate_ms"] + (n - 1) * self.report["decode_step_ms"]
               for n in longest) / 1e3

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


def _lookup(report: dict[str, Any], key: str) -> Any:
  """The value at a dotted ``key`` of ``report``; None where it is missing."""
  try:
    return checks.lookup(report, key)
  except ValueError:
    return None


def budgeted_settings(cost: Any, trace: Any, budget: str | None = None) -> dict[str, Any]:
  """The replay settings of ``trace`` under ``cost`` (``cost.settings``), with the
  rollout budget a ``--budget MODE:SIZE`` flag names in place of the traced run's or
  the preset's (``budget_from_flag``; None: unchanged)."""
  settings = cost.settings(trace)
  if budget:
    settings["rollout"] = budget_from_flag(budget, settings["rollout"], settings["candidates"])
  return settings


def cost_from_flag(flag: str, trace: Any) -> CostFn:
  """The cost model a ``--cost`` flag names for replaying ``trace``: ``cpu`` (the decode
  cost calibrate measured while sampling ``trace``; ``cpu:OTHER.jsonl``: the one measured
  for another trace, on its machine, ``DecodeCost``); or ``aot:REPORT.json`` (a preset's
  compiled programs, ``CompiledStepCost``)."""
  if flag == "cpu":
    return DecodeCost.of(trace)
  if flag.startswith("cpu:") and len(flag) > 4:
    from sagc_jax.replay.trace import read_trace
    return DecodeCost.of(read_trace(flag[4:]))
  if flag.startswith("aot:") and len(flag) > 4:
    return CompiledStepCost.load(flag[4:])
  raise ValueError(f"--cost={flag!r} is not 'cpu', 'cpu:TRACE.jsonl' or 'aot:REPORT.json'")
