"""``python -m sagc_jax.compare --config configs/compare_tiny_cpu.py --workdir DIR``:
{GRPO, DAPO} x {static G, SAGC} x seeds, trained one arm after another, then the
report (results.csv, summary table, claims.md, plots). ``--arms`` runs a subset,
``--merge_only`` only rebuilds the report. The library is
``sagc_jax.experiments.arms`` (the runs) and ``sagc_jax.experiments.compare`` (the report).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from sagc_jax.cli import run_absl_tool


def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "comparison config (a training config "
                                  "with a 'compare' section).", lock_config=True)
  flags.DEFINE_string("workdir", None, "Comparison directory.")
  flags.DEFINE_string("arms", None, "Comma-separated arms to run (default: all).")
  flags.DEFINE_bool("merge_only", False, "Only build the report from arms/ (no training).")
  flags.mark_flags_as_required(["workdir"])
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  from absl import logging

  from sagc_jax.experiments.arms import compare_section, run_arms, run_configs, select_arms
  from sagc_jax.experiments.compare import report
  from sagc_jax.experiments.machine import machine_info
  from sagc_jax.experiments.record import open_record, record_settings
  from sagc_jax.runtime.storage import is_remote
  import tensorflow_datasets as tfds

  logging.set_verbosity(logging.WARNING)
  tfds.disable_progress_bar()
  if is_remote(flags.workdir):
    raise ValueError(f"--workdir={flags.workdir}: a comparison runs its arms on this host and "
                     "needs a local folder (on a pod, run each arm with launch/tpu_pod.sh and "
                     "its own gs:// --workdir)")
  workdir = Path(flags.workdir).absolute()
  if flags.merge_only:
    ignored = [a.split("=")[0] for a in sys.argv[1:] if a.startswith("--config")]
    if ignored:
      _print_now(f"--merge_only ignores {', '.join(ignored)}: the report reads the settings "
                 f"the runs were started with, {workdir / 'compare.json'}")
    if not workdir.is_dir():
      raise ValueError(f"--workdir={flags.workdir}: no such folder to merge")
  else:
    if flags.config is None:
      raise ValueError("--config is required unless --merge_only")
    from sagc_jax.config import config_digest, validate
    arms = select_arms(run_configs(flags.config), flags.arms)
    compare = compare_section(flags.config)     # the record the report reads
    for name, arm in arms.items():             # every arm, before anything is written
      try:
        validate(arm)
      except ValueError as err:
        raise ValueError(f"arm {name}: {err}") from None
    open_record(workdir, dict(record_settings(compare), config_digest=config_digest(
        flags.config)), machine_info())
    run_arms(flags.config, workdir, arms, log=_print_now)
  report(workdir, log=_print_now)


def _print_now(message: str) -> None:
  print(message, flush=True)           # progress must reach a redirected log promptly


def run() -> None:
  """Console entry point ``sagc-compare``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
