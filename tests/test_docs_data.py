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
  rebuilt = rebuild_markdown(folder)
  # The report from its first table on, both clocks, word for word (results.md runs the
  # priced clock's heading into its paragraph).
  block = rebuilt[rebuilt.index("| arm |"):].replace("### On the priced clock\n\n",
                                                       "**On the priced clock.** ").rstrip()
  assert block.count("\n| ") > 8
  if block not in results:
    missing = [line for line in block.splitlines() if line not in results]
    raise AssertionError(f"results.md lacks the rebuilt tables of {folder.name}: "
                         f"{len(missing)} lines differ, e.g. {missing[:1]}")
