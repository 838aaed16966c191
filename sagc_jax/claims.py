"""``python -m sagc_jax.claims --adaptation DIR_A DIR_B``: the SAGC paper's adaptation
claim across two finished comparisons. The claims themselves are
``sagc_jax.experiments.claims``.
"""

from __future__ import annotations

from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m sagc_jax.claims --adaptation DIR_A DIR_B``: the adaptation claim
  across two finished comparisons (their ``results.csv``)."""
  import argparse
  import csv

  parser = argparse.ArgumentParser(prog="python -m sagc_jax.claims", description=main.__doc__)
  parser.add_argument("--adaptation", nargs=2, metavar="DIR", required=True,
                      help="two comparison directories, each with a results.csv")
  args = parser.parse_args(argv)
  comparisons = {}
  for folder in args.adaptation:
    path = f"{folder}/results.csv"
    try:
      with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    except OSError as err:
      parser.error(f"{path}: {err.strerror} (run or --merge_only the comparison first)")
    for row in rows:                   # a seed may be written as a float ("0.0")
      row.update({key: float(row[key]) for key in ("group_straggler_rate", "mean_g")},
                 seed=int(float(row["seed"])))
    comparisons[folder.rstrip("/").split("/")[-1]] = rows
  from sagc_jax.experiments.claims import adaptation_table

  print(adaptation_table(comparisons))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
