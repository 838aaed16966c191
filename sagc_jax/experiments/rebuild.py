"""A per-hour section of docs/results.md rebuilt from its raw files alone:
``python -m sagc_jax.experiments.rebuild docs/data/<section>`` prints the tables that
``experiments.per_hour`` made when the comparison ran, from the ``learning.csv``,
``compare.json`` and ``per_hour.json`` it wrote (docs/claims.md, "Raw data"), so that
every figure of such a section can be recomputed without the runs.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from sagc_jax.experiments.per_hour import analyse_rows
from sagc_jax.experiments.per_hour_tables import per_hour_markdown
from sagc_jax.experiments.record import load_record
from sagc_jax.runtime.storage import read_json

__all__ = ["rebuild_markdown"]


def rebuild_markdown(folder: str | Path) -> str:
  """The tables of a comparison's report from its raw files alone (``learning.csv``,
  ``compare.json``, and ``per_hour.json`` for H, its source, the price and the runs
  without a value at H): what ``docs/data/<section>`` holds for results.md."""
  folder = Path(folder)
  saved = read_json(folder / "per_hour.json")
  with open(folder / "learning.csv", newline="", encoding="utf-8") as f:
    rows = [{k: v if k in ("arm", "algorithm") else float(v) if v else math.nan
             for k, v in row.items()} for row in csv.DictReader(f)]
  price = (saved.get("priced") or {}).get("price")
  # The targets and margin the report used (per_hour.json), the record's where older.
  settings = {**load_record(folder), **{k: saved[k] for k in ("targets", "equivalence_margin")
                                        if k in saved}}
  result = analyse_rows(rows, settings, float(saved["horizon_s"]), price)
  return per_hour_markdown({**result, **{k: saved.get(k) for k in ("horizon_source",
                                                                    "priced_error", "short")}})


if __name__ == "__main__":
  import sys

  print(rebuild_markdown(sys.argv[1]))
