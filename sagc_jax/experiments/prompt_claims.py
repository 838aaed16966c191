"""Multi-seed tables of the prompt-heterogeneity simulation
(``sagc_jax.control.prompt_simulator``): every arm's measurements, and the
contextual controllers against SAGC on the same seeds.

Seed k runs the simulation with ``config.seed + k`` (the pool, the loader order
and the lengths) and ``controller.seed + k``. Per arm and quantity the table gives
the mean ± 95% Student-t half-width over the seeds (``claims.mean_ci``). The
comparison with SAGC is seed-paired: per seed the ratio arm / SAGC (or the
difference, for rates), then its mean ± half-width, read as

* ``better`` / ``worse``: the interval excludes "no change" on that side;
* ``no difference``: it does not (at this many seeds).

Nothing here is tuned: the verdicts are a fixed function of the rows.
"""

from __future__ import annotations

from typing import Any, Sequence

from sagc_jax.control.prompt_simulator import ARMS_CONTEXTUAL, simulate_prompts
from sagc_jax.experiments.claims import (Paired, format_ci, mean_ci, paired_markdown,
                                          seeded_configs)

__all__ = ["prompt_claim_rows", "prompt_claims_markdown", "simulate_prompt_claims"]

# (row key, column title, format) of the per-arm table.
_COLUMNS = (
    ("group_straggler_rate", "group straggler rate", ".3f"),
    ("step_straggler_rate", "step straggler rate", ".3f"),
    ("wall_clock_h", "wall-clock (simulated h)", ".2f"),
    ("signal_k", "signal (k)", ".2f"),
    ("informative_k", "informative groups (k)", ".2f"),
    ("mean_g", "mean G", ".2f"),
    ("time_to_target_h", "h to target signal", ".2f"),
    ("signal_at_equal_time_k", "signal at equal wall-clock (k)", ".2f"),
    ("controller_us", "controller µs / step", ".0f"),
)
# The paired comparison with SAGC (arm / SAGC or arm - SAGC, per seed).
_PAIRED = (
    Paired("signal_at_equal_time_k", "signal at equal wall-clock, arm / SAGC", "ratio", "above"),
    Paired("time_to_target_h", "wall-clock to the target signal, arm / SAGC", "ratio", "below"),
    Paired("signal_k", "signal over the run, arm / SAGC", "ratio", "above"),
    Paired("informative_k", "informative groups over the run, arm / SAGC", "ratio", "above"),
    Paired("wall_clock_h", "wall-clock of the run, arm / SAGC", "ratio", "below"),
    Paired("group_straggler_rate", "group straggler rate, arm - SAGC", "difference", "below",
           "+.4f"),
)


def prompt_claim_rows(result: dict[str, Any], seed: int) -> list[dict[str, Any]]:
  """One row per arm of one simulation, in the units of the tables."""
  rows = []
  for arm, s in result["summary"].items():
    rows.append({
        "arm": arm, "seed": seed,
        "group_straggler_rate": s["group_straggler_rate"],
        "step_straggler_rate": s["step_straggler_rate"],
        "wall_clock_h": s["wall_clock_s"] / 3600.0,
        "signal_k": s["signal"] / 1e3,
        "informative_k": s["informative_groups"] / 1e3,
        "mean_g": s["mean_g"],
        "time_to_target_h": s["time_to_target_s"] / 3600.0,
        "signal_at_equal_time_k": s["signal_at_equal_time"] / 1e3,
        "controller_us": s["controller_us"],
    })
  return rows


def prompt_claims_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """The per-arm table and the seed-paired comparison with SAGC (markdown)."""
  arms = list(dict.fromkeys(r["arm"] for r in rows))
  seeds = sorted({int(r["seed"]) for r in rows})
  lines = [f"Per arm, mean ± 95% CI over {len(seeds)} seeds:", "",
           "| arm | " + " | ".join(title for _, title, _ in _COLUMNS) + " |",
           "|---|" + "---|" * len(_COLUMNS)]
  for arm in arms:
    mine = [r for r in rows if r["arm"] == arm]
    lines.append(f"| {arm} | " + " | ".join(format_ci(mean_ci([r[key] for r in mine]), fmt)
                                          for key, _, fmt in _COLUMNS) + " |")
  contextual = [a for a in ARMS_CONTEXTUAL if a != "sagc" and a in arms]
  lines += ["", "Against SAGC, per seed then mean ± 95% CI:", "",
            paired_markdown(rows, [(a, a, "sagc") for a in contextual], _PAIRED)]
  return "\n".join(lines)


def simulate_prompt_claims(config: Any, seeds: int) -> tuple[str, list[dict[str, Any]]]:
  """Both tables over ``seeds`` simulations (seed k: ``config.seed + k`` and
  ``controller.seed + k``)."""
  rows = []
  for k, seeded in seeded_configs(config, seeds):
    rows += prompt_claim_rows(simulate_prompts(seeded), k)
  return prompt_claims_markdown(rows), rows
