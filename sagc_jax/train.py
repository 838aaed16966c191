"""``python -m sagc_jax.train --config configs/X.py --workdir DIR``: one training run.

Resumes from the newest usable checkpoint in ``DIR/checkpoints`` when there is
one. Ends with a summary (held-out accuracy before/after RL, straggler rate,
mean G, wall-clock split) on stdout and in ``DIR/summary.json``, and a plot in
``DIR/run.png``.

Required: ``--config`` and ``--workdir``. Any ``--config.KEY=VALUE`` overrides one
setting of the config for this run, e.g. ``--config.train.steps=10`` or
``--config.controller.tau=1.8``; every key is in docs/configs.md. Resuming a run with another model is refused.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Sequence

from sagc_jax.cli import run_absl_tool

def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "ml_collections config file (get_config()).",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, plots).")
  flags.DEFINE_integer("max_steps", None, "Stop after this many more steps (testing).")
  flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() (Cloud TPU pods; "
                    "the local launcher's SAGC_* environment variables also enable it).")
  flags.mark_flags_as_required(["config", "workdir"])
  return flags.FLAGS


def format_summary(summary: dict) -> str:
  lines = ["summary"]

  def end(key: str) -> str:     # absent when a stop signal came before the evaluation
    return f"{summary[key]:.3f}" if key in summary else "(not measured yet)"

  if "eval_sampled_accuracy_start" in summary:
    lines.append(f"  held-out accuracy, sampled (T = rollout temperature): "
                 f"{summary['eval_sampled_accuracy_start']:.3f} before RL -> "
                 f"{end('eval_sampled_accuracy_end')} after {int(summary['steps'])} steps")
  if "eval_sampled_gain" in summary:
    lines.append(f"  gain {summary['eval_sampled_gain']:+.3f}, 95% interval "
                 f"[{summary['eval_sampled_gain_ci95_low']:+.3f}, "
                 f"{summary['eval_sampled_gain_ci95_high']:+.3f}] (paired, "
                 f"{summary['eval_sampled_gain_examples']:.0f} examples, same seeds)")
  if "eval_accuracy_start" in summary:
    lines.append(f"  held-out accuracy, greedy: {summary['eval_accuracy_start']:.3f} -> "
                 f"{end('eval_accuracy_end')}")
  if "straggler_rate" in summary:
    lines.append(f"  straggler rate: groups {summary['group_straggler_rate']:.3f}, steps "
                 f"{summary['step_straggler_rate']:.3f}   mean G "
                 f"{summary['mean_g']:.2f}   mean log2 G {summary['mean_log2_g']:.2f}")
    lines.append(f"  wall-clock {summary['time_total_s']:.1f} s = rollout "
                 f"{summary['time_rollout_s']:.1f} + reward {summary['time_reward_s']:.1f} + "
                 f"learner {summary['time_learner_s']:.1f} (+ host); scoring overlapped "
                 f"with decoding {summary.get('time_reward_overlapped_s', 0.0):.1f} s")
    lines.append(f"  new compilations after warm-up: {summary['new_compilations']:.0f}   "
                 f"skipped updates: {summary['skipped_updates']}")
  return "\n".join(lines)


def main(argv: Sequence[str], flags) -> None:
  if flags.max_steps is not None and flags.max_steps < 1:
    raise ValueError(f"--max_steps={flags.max_steps} must be >= 1 (leave it out to train to "
                     "train.steps)")
  # A single-process run only: on a pod every process must reach the same decision,
  # and their workdirs need not be one shared folder.
  single = not flags.distributed and "SAGC_COORDINATOR" not in os.environ
  from sagc_jax.runtime.metrics import finished_summary

  finished = finished_summary(flags.workdir, flags.config.train) if single else None
  if finished is not None:           # nothing to train: no data, model or compilation
    if finished.get("budget_spent"):
      print(f"{flags.workdir} spent its time budget earlier, after {finished['steps']} steps "
            f"(train.time_budget_s={finished['time_budget_s']:g}; raise it to train on)")
    else:
      print(f"{flags.workdir} finished all {finished['steps']} steps earlier "
            "(train.steps; raise it to train on)")
    print(format_summary(finished))
    return
  from absl import logging
  import tensorflow_datasets as tfds

  from sagc_jax.runtime import distributed
  distributed.initialize(tpu_pod=flags.distributed)   # before any JAX computation

  from sagc_jax.runtime.checkpoint import CheckpointWriteError
  from sagc_jax.runtime.metrics import MetricsWriteError
  from sagc_jax.runtime.stop import StopRequested
  from sagc_jax.experiments.plots import plot_run
  from sagc_jax.config import run_config
  from sagc_jax.training.loop import Trainer

  # Keep the console to our own progress lines (library INFO logs go to absl's log file).
  logging.set_verbosity(logging.WARNING)
  tfds.disable_progress_bar()

  try:
    config = run_config(flags.config)
    before_rl = None
    if config.train.initial_eval_dir:      # a comparison's runs of a seed share one
      from sagc_jax.experiments.initial_eval import reuse_before_rl
      before_rl = reuse_before_rl(config.train.initial_eval_dir)
    trainer = Trainer(config, flags.workdir, stop_deadline=True, before_rl=before_rl)
  except StopRequested as stopped:
    # Data preparation, the warm start, restoring: redone by the next start.
    _exit_now(f"stopped during {stopped.phase}: nothing new to checkpoint; rerun the same "
              "command to go on (exit 0)", 0)
  try:
    try:
      summary = trainer.run(max_steps=flags.max_steps)
    finally:
      trainer.close()
  except KeyboardInterrupt:
    # The second Ctrl-C (the first one checkpoints after the current step).
    _exit_now("interrupted: steps since the last checkpoint are lost", 130)
  except (CheckpointWriteError, MetricsWriteError) as err:
    # A full disk (or any write failure): every step up to the last checkpoint is kept.
    _exit_now(f"error: {err}", 1)
  except Exception as err:
    if not distributed.is_multiprocess():
      raise
    # Most often another process died (kill -9, a lost host) and this one's next
    # collective failed. A normal exit would wait in jax.distributed's shutdown barrier
    # for the dead process's heartbeat timeout (~1-2 minutes) and then abort anyway.
    import jax
    traceback.print_exc()
    first_line = (str(err).strip().splitlines() or [""])[0][:300]
    _exit_now(f"error: process {jax.process_index()} of "
              f"{jax.process_count()} stopped: {type(err).__name__}: "
              f"{first_line}\n(in a multi-process run this usually means another "
              "process died first: see its log; rerun the same command to resume from the "
              "last checkpoint)", 1)
  if trainer.stopped_in is not None or summary.get("preempted"):
    # Stopped by a signal: XLA compiles may still run in worker threads, or an
    # abandoned program on the device (an evaluation, a rollout), which a normal exit
    # would wait for (minutes) while the stop deadline runs. What was finished is
    # checkpointed; the summary is in summary.json.
    if trainer.is_primary and trainer.history:
      print(format_summary(summary), flush=True)
    where = f"during {trainer.stopped_in}" if trainer.stopped_in else "by a stop signal"
    _exit_now(f"stopped {where}; steps done: {trainer.step} (exit 0; rerun the same command "
              "to go on)", 0)
  if trainer.is_primary:
    print(format_summary(summary))
    if trainer.history:
      path = trainer.workdir / "run.png"
      plot_run(trainer.history, trainer.eval_history, path,
               title=trainer.config.label)
      print(f"  plot: {path}\n  metrics: {trainer.workdir / 'metrics.jsonl'}")


def _exit_now(message: str, status: int) -> None:
  """Prints ``message`` and ends the process at once: orbax leaves non-daemon threads
  waiting forever for a failed or abandoned save's signals, so a normal interpreter
  exit would hang (the run must end so a supervisor sees it)."""
  print(message, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(status)


def run() -> None:
  """Console entry point ``sagc-train``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
