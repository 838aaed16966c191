"""``python -m sagc_jax.figures``: jobs run into their folders, the machine is recorded
and stamped on figures, finished jobs are skipped on a rerun, unknown jobs are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagc_jax.experiments import figures
from sagc_jax.experiments.machine import machine_info, machine_line, stamp

REPO = Path(__file__).resolve().parents[1]


def test_machine_info_names_cpu_cores_and_jax_and_stamps_figures():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  info = machine_info()
  assert info["cores"] >= 1 and info["cpu"] and info["jax"] != "not installed"
  fig, ax = plt.subplots()
  ax.plot([0, 1])
  stamp(fig, {**info, "cpu": "Test CPU 9000", "cores": 3})
  footer = fig.texts[-1].get_text()
  plt.close(fig)
  assert footer.startswith("measured on: Test CPU 9000, 3 cores, jax ")
  assert machine_line(info) in f"measured on: {machine_line(info)}"


def test_figures_cli_runs_jobs_records_the_machine_and_resumes(commands, tmp_path):
  out = tmp_path / "figures"
  cmd = ["sagc_jax.figures", f"--out={out}", "--only=simulate,simulate_4prompts_step"]
  first = commands.run(*cmd, cwd=REPO)
  assert first.returncode == 0, first.stderr
  machine = json.loads((out / "machine.json").read_text())
  assert machine["cores"] >= 1 and machine["jax"]
  index = (out / "index.md").read_text()
  assert "| simulate |" in index and "| simulate_4prompts_step |" in index
  assert index.count("| ok |") == 2 and machine["cpu"] in index
  assert (out / "simulate" / "results.png").read_bytes()[:4] == b"\x89PNG"
  claims = (out / "simulate" / "claims.md").read_text()
  assert "simulator, 5 seeds" in claims
  step = json.loads((out / "simulate_4prompts_step" / "results.json").read_text())
  assert step["config"]["controller"]["event"] == "step"
  assert step["config"]["sim"]["prompts_per_step"] == 4
  again = commands.run(*cmd, cwd=REPO)
  assert again.returncode == 0 and again.stdout.count("skipped") == 2


def test_unknown_jobs_are_refused_with_the_list():
  with pytest.raises(ValueError, match=r"unknown job\(s\) \['nope'\]; the jobs are: main_job"):
    figures.select_jobs("simulate,nope", None)
  aot = ",".join(j.name for j in figures.JOBS if j.name.startswith("aot_"))
  assert aot.count("aot_") == 4
  assert [j.name for j in figures.select_jobs(None, aot)] == [
      j.name for j in figures.JOBS if not j.name.startswith("aot_")]


def _results_sections() -> dict[str, str]:
  """docs/results.md's ``## `` sections: title -> body."""
  text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
  parts = text.split("\n## ")[1:]
  return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[1] for part in parts}


def test_every_job_names_its_results_section_and_the_section_names_the_job():
  sections = _results_sections()
  for job in figures.JOBS:
    assert job.section in sections, f"{job.name}: no section {job.section!r} in results.md"
    only = [line for line in sections[job.section].replace("\n", " ").split("`")
            if line.startswith("python -m sagc_jax.figures --only ")]
    assert any(job.name in o.split("--only ", 1)[1].split(",") for o in only), (
        f"results.md section {job.section!r} does not name `python -m sagc_jax.figures "
        f"--only ...{job.name}...`")
  # A section no job makes says which command made it.
  for title, body in sections.items():
    assert "Command" in body.split("\n\n", 1)[0] or "Command" in body[:400], title
