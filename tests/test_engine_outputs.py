"""The replay engine's commands print and write what they did when the fixtures were
saved (``engine_outputs``: timings masked, everything else exact)."""

import difflib

import pytest

from engine_outputs import CASES, FIXTURES, run_case


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_commands_outputs_equal_the_saved_ones(name):
  saved = {p.name: p.read_text() for p in sorted((FIXTURES / name).iterdir())}
  got = run_case(name)
  assert sorted(got) == sorted(saved)
  for file, text in got.items():
    if text != saved[file]:
      diff = "".join(difflib.unified_diff(saved[file].splitlines(True), text.splitlines(True),
                                          f"saved/{name}/{file}", f"now/{name}/{file}", n=1))
      pytest.fail(f"{name}/{file} differs from the saved output:\n{diff[:6000]}")
