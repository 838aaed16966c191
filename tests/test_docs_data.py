"""The raw files under docs/data/ rebuild the per-hour tables of docs/results.md: every
table line that ``experiments.rebuild`` makes from a section's learning.csv,
compare.json and per_hour.json stands in results.md as printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sagc_jax.experiments.rebuild import rebuild_markdown

REPO = Path(__file__).resolve().parents[1]
SECTIONS = sorted(p.parent for p in (REPO / "docs" / "data").glob("*/learning.csv"))


def test_every_per_hour_section_has_its_raw_files():
  assert SECTIONS, "docs/data/ holds no comparison"
  for folder in SECTIONS:
    for name in ("learning.csv", "per_hour.json", "compare.json"):
      assert (folder / name).is_file(), f"{folder.name} lacks {name}"


@pytest.mark.parametrize("folder", SECTIONS, ids=[p.name for p in SECTIONS])
def test_a_sections_tables_are_rebuilt_from_its_raw_files(folder):
  results = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
  assert f"docs/data/{folder.name}" in results, f"results.md does not cite {folder.name}"
  tables = [line for line in rebuild_markdown(folder).splitlines()
            if line.startswith("|") and not line.startswith("|---")]
  assert len(tables) > 4
  missing = [line for line in tables if line not in results]
  assert not missing, f"{len(missing)} rebuilt lines are not in results.md, e.g. {missing[0]}"
