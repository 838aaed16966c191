"""Tables of ``python -m sagc_jax.simulate --trace``: every arm replaying real rollouts
(``control.trace_replay``), per algorithm and tau, against the largest static G.

Replicate k reseeds the replay and resamples the trace's prompts (bootstrap by
prompt), so a table's mean ± 95% Student-t half-width over replicates holds the
trace's own sampling error too. The comparison with the largest static G is
replicate-paired (``claims.paired_markdown``): ``better`` / ``worse`` when the
interval excludes no change on that side.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from sagc_jax.control.trace import Trace
from sagc_jax.control.trace_replay import ARMS, replay, replay_config
from sagc_jax.experiments.claims import Paired, format_ci, mean_ci, paired_markdown
from sagc_jax.experiments.prompt_claims import prompt_claim_rows

__all__ = ["trace_claims"]

_COLUMNS = (
    ("group_straggler_rate", "group straggler rate", ".3f"),
    ("step_straggler_rate", "step straggler rate", ".3f"),
    ("mean_g", "mean G", ".2f"),
    ("rounds_per_step", "rounds / step", ".2f"),
    ("step_s", "s / step", ".1f"),
    ("signal_per_h", "signal / h", ".0f"),
    ("capped_steps", "steps at the cap", ".2f"),
)
_PAIRED = (
    Paired("time_to_target_h", "wall-clock to the target signal, arm / static", "ratio",
           "below"),
    Paired("signal_at_equal_time_k", "signal at equal wall-clock, arm / static", "ratio",
           "above"),
    Paired("group_straggler_rate", "group straggler rate, arm - static", "difference", "below",
           "+.3f"),
)


def _refused(arm: str, refill: bool) -> str:
  """What the trainer says of an arm the replay runs anyway."""
  if arm == "per_prompt":
    why = ["one process only (sizes per prompt)"]
    if refill:
      why.append("refused with the refill sampler (rollout.refill_slots > 0); priced here "
                 "as refill rows all the same")
    return "; ".join(why)
  return ""


def trace_claims(traces: Sequence[Trace], cost: Callable, *, algorithms: Sequence[str],
                 taus: Sequence[float], replicates: int, steps: int, rollout: dict[str, Any],
                 candidates: Sequence[int], max_rounds: int, length_scale: float = 1.0,
                 length_cap: int | None = None, refill: bool = False,
                 delta: float | None = None,
                 log: Callable[[str], None] = print) -> tuple[str, list[dict[str, Any]]]:
  """The markdown tables and their rows (module docstring); the controller section is
  the first trace's run's, with ``candidates``, ``delta`` (when given) and each of
  ``taus``."""
  controller = dict(traces[0].header["controller"], candidates=tuple(candidates))
  if delta is not None:
    controller["delta"] = float(delta)
  rows: list[dict[str, Any]] = []
  sections = []
  reference = f"static_G{max(candidates)}"
  for algorithm in algorithms:
    for tau in taus:
      mine = []
      for rep in range(replicates):
        log(f"replay: {algorithm}, tau {tau:g}, replicate {rep + 1}/{replicates}")
        config = replay_config(dict(controller, tau=float(tau),
                                    seed=int(controller.get("seed", 0)) + rep), rollout, steps)
        result = replay(traces, config, cost, dapo=algorithm == "dapo", max_rounds=max_rounds,
                        kinds=ARMS, seed=rep, bootstrap=True, length_scale=length_scale,
                        length_cap=length_cap)
        for row in prompt_claim_rows(result, rep):
          s = result["summary"][row["arm"]]
          col = result["traces"][row["arm"]]
          row.update(algorithm=algorithm, tau=float(tau),
                     step_s=s["wall_clock_s"] / steps,
                     signal_per_h=s["signal"] / (s["wall_clock_s"] / 3600.0),
                     rounds_per_step=s["rounds_per_step"],
                     capped_steps=float(np.mean(col["capped"])))
          mine.append(row)
      rows += mine
      sections.append(_section(mine, algorithm, tau, reference, refill))
  return "\n\n".join(sections), rows


def _section(rows: Sequence[dict[str, Any]], algorithm: str, tau: float, reference: str,
             refill: bool) -> str:
  arms = list(dict.fromkeys(r["arm"] for r in rows))
  n = len({r["seed"] for r in rows})
  lines = [f"**{algorithm.upper()}, tau {tau:g}**: per arm, mean ± 95% CI over {n} "
           "replicates", "",
           "| arm | " + " | ".join(title for _, title, _ in _COLUMNS) + " | trainer |",
           "|---|" + "---|" * (len(_COLUMNS) + 1)]
  for arm in arms:
    mine = [r for r in rows if r["arm"] == arm]
    lines.append(f"| {arm} | " + " | ".join(format_ci(mean_ci([r[k] for r in mine]), fmt)
                                          for k, _, fmt in _COLUMNS)
                 + f" | {_refused(arm, refill)} |")
  others = [a for a in arms if a != reference]
  lines += ["", f"Against {reference}, per replicate then mean ± 95% CI:", "",
            paired_markdown(rows, [(a, a, reference) for a in others], _PAIRED)]
  return "\n".join(lines)
