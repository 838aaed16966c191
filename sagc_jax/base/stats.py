"""Per-arm tables over seeds or replicates: mean ± 95% Student-t half-width per arm,
and a seed-paired comparison of every arm with a reference arm. One convention for
every report of the package: ``simulate`` (its claims and prompt-pool tables), the
trace replay, ``calibrate`` and ``compare``.

Paired comparisons match the rows of two arms by ``seed`` (a replicate of a replay is
a seed): the per-seed ratio arm / reference or difference arm - reference, then its
mean ± half-width, read as ``better`` / ``worse`` when the interval excludes "no
change" on that side and ``not resolved`` when it does not (at this many seeds: a wide interval is no evidence of equivalence).
That reading, ``interval_side``, is the package's one verdict rule (the claims table's
too). Where many pairs are tested at once (``per_hour``), ``paired_test`` adds the
paired t p-value and ``holm`` corrects it for the family; ``pair_verdict`` words the
result, and says "not different" only when ``equivalence_test`` (two one-sided tests,
Schuirmann 1987) puts the difference inside a stated margin. Ratios of times are
averaged on the log scale (``geometric_ratio``), so that a ratio and its inverse give
reciprocal answers.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["ALPHA", "BORDERLINE", "MIN_EQUIVALENCE_N", "Paired", "arm_intervals", "by_arm", "by_seed",
           "equivalence_test", "finite", "format_ci", "geometric_ratio", "holm",
           "interval_side", "mean_ci", "pair_verdict", "paired_markdown", "paired_test",
           "paired_verdict", "per_arm_markdown", "per_seed", "too_few"]

ALPHA = 0.05         # a family's significance level (Holm-adjusted p below it: resolved)
BORDERLINE = 0.01    # a resolved pair with adjusted p in [BORDERLINE, ALPHA): borderline
MIN_EQUIVALENCE_N = 3  # equivalence is not claimed from fewer values (1 degree of freedom)


def mean_ci(values: Sequence[float]) -> tuple[float, float, int]:
  """(mean, 95% confidence half-width, n) of the finite ``values``: Student's t with
  n - 1 degrees of freedom (half-width nan for a single value), its quantile rounded
  to 3 decimals as printed tables give it, so reports do not move with scipy."""
  from scipy.stats import t as student_t

  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], float)
  if not x.size:
    return float("nan"), float("nan"), 0
  if x.size == 1:
    return float(x[0]), float("nan"), 1
  t = round(float(student_t.ppf(0.975, x.size - 1)), 3)
  return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(x.size)), int(x.size)


def paired_test(differences: Sequence[float]) -> dict[str, Any]:
  """Mean, 95% Student-t half-width, n and the two-sided paired t p-value of the
  per-seed differences (p nan with fewer than two; 0 or 1 for zero spread)."""
  from scipy.stats import t as student_t

  x = np.asarray([d for d in differences if math.isfinite(d)], float)
  mean, half, n = mean_ci(x)
  sd = float(x.std(ddof=1)) if n >= 2 else float("nan")
  p = (float("nan") if n < 2 else float(mean == 0.0) if sd == 0.0
       else float(2 * student_t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1)))
  return {"mean": mean, "half_width": half, "n": n, "p": p}


def equivalence_test(differences: Sequence[float], margin: float) -> dict[str, Any]:
  """Two one-sided t tests (TOST) of ``|mean difference| < margin``: the larger of the
  two one-sided p-values, and the 90% Student-t interval that lies inside
  ``(-margin, margin)`` exactly when that p is below 0.05 (nan p with fewer than two
  values; zero spread: 0 inside the margin, else 1)."""
  from scipy.stats import t as student_t

  x = np.asarray([d for d in differences if math.isfinite(d)], float)
  n = int(x.size)
  if n < 2:
    return {"margin": margin, "p": float("nan"), "low": float("nan"), "high": float("nan"),
            "n": n}
  mean, sd = float(x.mean()), float(x.std(ddof=1))
  if sd == 0.0:
    p, half = float(not abs(mean) < margin), 0.0
  else:
    se = sd / math.sqrt(n)
    p = float(max(student_t.sf((mean + margin) / se, n - 1),
                  student_t.sf((margin - mean) / se, n - 1)))
    half = float(student_t.ppf(0.95, n - 1)) * se
  return {"margin": margin, "p": p, "low": mean - half, "high": mean + half, "n": n}


def pair_verdict(p_holm: float, equivalence: dict[str, Any] | None = None) -> str:
  """The words for one pair of a Holm family (docs/claims.md): ``resolved`` (adjusted p
  below ``BORDERLINE``), ``borderline`` (below ``ALPHA``), ``equivalent`` (not resolved,
  at least ``MIN_EQUIVALENCE_N`` values and the TOST p of ``equivalence``, Holm-adjusted
  over the family where given as ``p_holm``, below ``ALPHA``), else ``not resolved``."""
  if math.isfinite(p_holm) and p_holm < ALPHA:
    return "resolved" if p_holm < BORDERLINE else "borderline"
  if (equivalence is not None and equivalence.get("n", MIN_EQUIVALENCE_N) >= MIN_EQUIVALENCE_N
      and equivalence.get("p_holm", equivalence["p"]) < ALPHA):
    return "equivalent"
  return "not resolved"


def geometric_ratio(ratios: Sequence[float]) -> dict[str, Any]:
  """The geometric mean of positive finite ``ratios`` and its 95% interval (a Student-t
  interval of the mean log ratio, exponentiated), with n: ratio(a, b) is exactly
  1 / ratio(b, a), interval included."""
  logs = [math.log(r) for r in ratios if r is not None and math.isfinite(r) and r > 0]
  mean, half, n = mean_ci(logs)
  if not n:
    return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
  return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half),
          "n": n}


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values (nan stays nan and is not counted)."""
  order = sorted((i for i, p in enumerate(p_values) if math.isfinite(p)),
                 key=lambda i: p_values[i])
  adjusted = [float("nan")] * len(p_values)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(order) - rank) * p_values[i]))
    adjusted[i] = running
  return adjusted


def format_ci(stat: tuple[float, float, int], fmt: str) -> str:
  """``mean ± half`` of a ``mean_ci`` result; the mean alone for one value, '–' for none."""
  mean, half, n = stat
  if not n:
    return "–"
  return f"{mean:{fmt}}" if n == 1 else f"{mean:{fmt}} ± {half:{fmt.lstrip('+')}}"


def finite(x: Any) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x)


def by_seed(rows: Sequence[dict[str, Any]], match: Callable[[dict], bool]) -> dict[int, dict]:
  return {int(r["seed"]): r for r in rows if match(r)}


def by_arm(rows: Sequence[dict[str, Any]]) -> dict[str, dict[int, dict]]:
  """Per arm (first-seen order), its rows by seed (``by_seed``)."""
  return {arm: by_seed(rows, lambda r, arm=arm: r["arm"] == arm)
          for arm in dict.fromkeys(r["arm"] for r in rows)}


def per_seed(ours: dict[int, dict], base: dict[int, dict], key: str,
              op: Callable[[float, float], float]) -> list[float]:
  """``op(ours, base)`` of ``key`` for each seed of ``ours`` (in its order) that ``base``
  ran too, where both values are finite."""
  return [op(row[key], base[seed][key]) for seed, row in ours.items()
          if seed in base and finite(row.get(key)) and finite(base[seed].get(key))]


def too_few(stat: tuple[float, float, int]) -> str | None:
  """``n/a`` without a value, ``?`` with one (no interval), else None."""
  return "n/a" if stat[2] == 0 else "?" if stat[2] < 2 else None


def interval_side(stat: tuple[float, float, int], null: float) -> str | None:
  """``"above"`` / ``"below"`` when the 95% interval of a ``mean_ci`` result excludes
  ``null`` on that side; None when it contains it or there is none (see ``too_few``)."""
  mean, half, _ = stat
  return "above" if mean - half > null else "below" if mean + half < null else None


@dataclasses.dataclass(frozen=True)
class Paired:
  """A quantity compared between two arms of the same seed: per seed ``arm / base``
  (``kind="ratio"``, no change = 1) or ``arm - base`` (``"difference"``, no change =
  0); ``better`` is the side that favours the arm ("above" / "below"; None: neither)."""
  key: str
  title: str
  kind: str
  better: str | None
  fmt: str = ""          # '' = ".3f" for a ratio, "+.3f" for a difference


def paired_verdict(stat: tuple[float, float, int], null: float, better: str | None) -> str:
  """``better`` / ``worse`` when the 95% interval excludes ``null`` on that side
  (``higher`` / ``lower`` when no side is better), ``not resolved`` when it does not,
  ``?`` with one seed and ``n/a`` with none."""
  side = interval_side(stat, null)
  if too_few(stat) or side is None:
    return too_few(stat) or "not resolved"
  if better is None:
    return "higher" if side == "above" else "lower"
  return "better" if side == better else "worse"


def paired_markdown(rows: Sequence[dict[str, Any]], pairs: Sequence[tuple[str, str, str]],
                    quantities: Sequence[Paired]) -> str:
  """Seed-paired comparisons as a markdown table: one row per quantity, per pair
  ``(column title, arm, base arm)`` the mean ± 95% Student-t half-width over the
  seeds that both arms ran (rows keyed by ``arm`` and ``seed``; non-finite values
  are left out, and a cell says when fewer seeds remain) and its verdict
  (``paired_verdict``)."""
  arms = by_arm(sorted(rows, key=lambda r: int(r["seed"])))
  seeds = sorted({int(r["seed"]) for r in rows})
  lines = ["| quantity | " + " | ".join(f"{title} | verdict" for title, _, _ in pairs) + " |",
           "|---|" + "---|---|" * len(pairs)]
  for q in quantities:
    fmt = q.fmt or (".3f" if q.kind == "ratio" else "+.3f")
    null = 1.0 if q.kind == "ratio" else 0.0
    op = operator.truediv if q.kind == "ratio" else operator.sub
    cells = []
    for _, arm, base in pairs:
      stat = mean_ci(per_seed(arms.get(arm, {}), arms.get(base, {}), q.key, op))
      n = stat[2]
      fewer = f" ({n} of {len(seeds)} seeds)" if 0 < n < len(seeds) else ""
      cells.append(f"{format_ci(stat, fmt)}{fewer} | {paired_verdict(stat, null, q.better)}")
    lines.append(f"| {q.title} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def per_arm_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]],
                     *, seeds_column: bool = False,
                     extra: tuple[str, Callable[[str], str]] | None = None) -> str:
  """Per arm (first-seen order), mean ± 95% CI over its rows of each ``(key, title,
  format)`` of ``columns``; ``seeds_column`` adds the number of rows, ``extra`` a last
  ``(title, text of an arm)`` column."""
  titles = [t for _, t, _ in columns] + ([extra[0]] if extra else [])
  lines = ["| arm | " + ("seeds | " if seeds_column else "") + " | ".join(titles) + " |",
           "|---|" + "---|" * (len(titles) + seeds_column)]
  for arm in dict.fromkeys(r["arm"] for r in rows):
    mine = [r for r in rows if r["arm"] == arm]
    cells = [format_ci(mean_ci([r[k] for r in mine]), fmt) for k, _, fmt in columns]
    cells = ([str(len(mine))] if seeds_column else []) + cells + (
        [extra[1](arm)] if extra else [])
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def arm_intervals(rows: Sequence[dict[str, Any]], keys: Sequence[str], reference: str,
                  ratios: Sequence[str]) -> dict[str, dict[str, float]]:
  """Per arm and key: the mean over the arm's rows and its 95% interval (``key_low``,
  ``key_high``), and for each of ``ratios`` the seed-paired ratio to ``reference``
  (``key_vs_<reference>``), the same way."""
  out: dict[str, dict[str, float]] = {}
  arms = by_arm(rows)
  for arm, mine in arms.items():
    series = {key: [r[key] for r in mine.values()] for key in keys}
    for key in ratios:
      series[f"{key}_vs_{reference}"] = per_seed(mine, arms[reference], key, operator.truediv)
    row: dict[str, float] = {}
    for key, values in series.items():
      mean, half, _ = mean_ci(values)
      row[key], row[f"{key}_low"], row[f"{key}_high"] = mean, mean - half, mean + half
    out[arm] = row
  return out


def arm_comparison(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]],
                   paired: Sequence[Paired], *, reference: str, others: Sequence[str],
                   intro: str, against: str,
                   extra: tuple[str, Callable[[str], str]] | None = None) -> str:
  """The per-arm table (``per_arm_markdown``) under ``intro``, then each of ``others``
  against ``reference``, seed-paired (``paired_markdown``) under ``against``."""
  return "\n".join([intro, "", per_arm_markdown(rows, columns, extra=extra), "", against, "",
                    paired_markdown(rows, [(a, a, reference) for a in others], paired)])
