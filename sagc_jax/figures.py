"""``python -m sagc_jax.figures [--out runs/figures] [--only a,b] [--list]``: reruns every
measurement the docs report, as a resumable job list, into one folder with
``index.md`` and ``machine.json``. The jobs are ``sagc_jax.experiments.figures.JOBS``;
``--list`` names the section of docs/results.md each one makes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from sagc_jax.cli import run_absl_tool


def _define_flags():
  from absl import flags

  flags.DEFINE_string("out", "runs/figures", "Folder for every job's outputs.")
  flags.DEFINE_string("only", None, "Comma-separated jobs to run (default: all).")
  flags.DEFINE_string("skip", None, "Comma-separated jobs to leave out.")
  flags.DEFINE_bool("force", False, "Rerun jobs that finished before.")
  flags.DEFINE_bool("list", False, "Print the jobs, with the docs/results.md section each "
                    "makes, and exit.")
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  from sagc_jax.experiments.figures import regenerate, select_jobs

  jobs = select_jobs(flags.only, flags.skip)
  if flags.list:
    for job in jobs:
      print(f"{job.name:<32} ~{job.minutes:>5.1f} min  {job.what}")
      print(f"{'':<32}   makes docs/results.md, \"{job.section}\"")
    print(f"total ~{sum(j.minutes for j in jobs):.0f} min on the reference machine of "
          "docs/results.md")
    return
  records = regenerate(Path(flags.out), jobs, force=flags.force)
  failed = [r["job"] for r in records if r["status"].startswith("failed")]
  print(f"wrote {Path(flags.out) / 'index.md'}" + (f"; failed: {', '.join(failed)}"
                                                   if failed else ""))
  if failed:
    sys.exit(1)


def run() -> None:
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
