"""The training loop: a run's parts, built once, and the step repeated.

A run is built from its parts, each its own module:

* ``training.inputs.build_run_inputs``: mesh, data, the starting policy (the tiny model's
  supervised warm start when needed), tokenizer, rewards;
* ``training.build.build_components``: the compiled samplers and learner;
* ``training.step.RLStep``: one RL step (plan -> sample -> reward -> update -> observe);
* ``training.run_state.RunState``: the finished steps, checkpoints and exact resume;
* ``training.supervisor.Supervisor``: the run directory's lock, stop signals, W&B and
  exports.

``Trainer.run`` reads top to bottom: warm-up, the evaluation before RL, then per step
the step, an evaluation when one is due (``run_state.evaluation_due``: every
``train.eval_every`` steps, at the last step, at the points of a time budget), its
metrics row, a checkpoint every ``train.checkpoint_every`` steps and an export every
``train.export_every``. A run with ``train.time_budget_s`` ends at the first step
boundary after its cumulative step time reaches it. A
stop signal ends a phase whose work a resume redoes (``training.supervisor``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import jax

from sagc_jax.config import RunConfig, run_config
from sagc_jax.data import PromptLoader
from sagc_jax.models.sharding import abstract_like
from sagc_jax.runtime import compilation
from sagc_jax.runtime import distributed
from sagc_jax.runtime.checkpoint import Checkpointer, prepare_checksums
from sagc_jax.runtime.metrics import MetricsWriter
from sagc_jax.runtime.stop import StopRequested
from sagc_jax.runtime.storage import cache_root, local_mirror, run_path, write_text
from sagc_jax.training.build import build_components, largest_host_gather
from sagc_jax.training.evaluation import Evaluator
from sagc_jax.training.export import prepare_export_root
from sagc_jax.training.inputs import build_run_inputs, configure_compilation_cache
from sagc_jax.training.run_state import RunState, budget_spent, evaluation_due, write_run_config
from sagc_jax.training.step import RLStep, StepResult
from sagc_jax.training.supervisor import Supervisor

class Trainer:
  """Builds every part of a run from its config and runs the step loop."""

  def __init__(self, config: RunConfig, workdir: str | os.PathLike, *,
               log: Callable[[str], None] | None = None, stop_deadline: bool = False,
               before_rl: Callable[["Trainer"], dict[str, float]] | None = None):
    """A trainer resumes the run's newest checkpoint in ``workdir`` if there is one
    (a reader of a run builds no trainer: ``evaluation.evaluate_run``).

    It handles SIGTERM / SIGINT from here to ``close()`` (a writer on the main
    thread); a signal during start-up raises ``StopRequested``. ``stop_deadline``
    (the command line): end the process ``train.stop_grace_s`` after the first
    signal whatever it is doing (``runtime.stop``). ``before_rl(trainer)``: returns the
    evaluation before RL in place of running it (a comparison reuses one per seed)."""
    config = run_config(config)     # the command line built it; a ConfigDict is checked here
    self.config, self.before_rl = config, before_rl
    # The workdir may be a bucket (gs://): every run file goes through storage.run_path.
    # Rebuildable files that need a real filesystem (TFDS data, the tiny model's warm
    # start) go to a local mirror; gs:// inputs are staged into the local cache.
    self.workdir = run_path(workdir)
    self.cache_root = cache_root(config.train.local_cache_dir)
    self.local_dir = local_mirror(workdir, self.cache_root)
    self.is_primary = jax.process_index() == 0
    self.log = log or print           # until the metrics writer exists
    self.state: RunState | None = None
    self.stopped_in: str | None = None   # the phase a stop signal ended at once
    self.supervisor = Supervisor(
        config, self.workdir, stop_deadline=stop_deadline,
        describe_state=lambda: self.state.describe() if self.state else "No step had run.",
        log=self.log)
    try:
      self.supervisor.start()
      with self.supervisor.stoppable("start-up", every_process=True):
        self._build(log)
    except BaseException:
      # A refused or stopped start (a bad config, a checkpoint mismatch, a signal)
      # leaves no lock or signal handler behind.
      self.supervisor.close()
      raise

  def _build(self, log: Callable[[str], None] | None) -> None:
    """The rest of ``__init__``, once the run directory is this trainer's."""
    config = self.config
    if config.train.export_every and self.is_primary:
      prepare_export_root(config, self.workdir, self.log)   # before any run file
    self.metrics = MetricsWriter(self.workdir, config.train.steps, enabled=self.is_primary,
                                 sync_secs=config.train.metrics_sync_secs,
                                 local_dir=self.local_dir)
    self.log = log or self.metrics.log
    compilation.install()
    configure_compilation_cache(config, self.workdir / "jax_cache")
    self.inputs = build_run_inputs(config, self.local_dir, self.cache_root, self.log)
    self.model = self.inputs.model
    self.loader = PromptLoader(self.inputs.train_source, seed=config.seed,
                               shard_index=jax.process_index(), num_shards=jax.process_count(),
                               limit=config.data.train_prompts)
    self.controller = config.build_controller()
    processes = jax.process_count()
    if config.controller.needs.one_process and processes > 1:
      raise ValueError(f"controller.kind={config.controller.kind!r} runs on one process (this "
                       f"run has {processes}); use 'prompt_aware' or 'sagc' on several "
                       "processes")
    uneven = [g for g in config.group_sizes() if config.rollout.prompts_for(g) % processes]
    if uneven:
      raise ValueError(f"prompts per step for G={uneven} do not split over {processes} "
                       "processes (each process reads an equal share of the prompts)")
    self.components = build_components(config, self.model, self.inputs.mesh,
                                       stop_ids=self.inputs.stop_ids, pad_id=self.inputs.pad_id)
    self.learner = self.components.learner
    self.evaluator = Evaluator(self.inputs, self.components.eval_sampler,
                               self.components.eval_sampled_sampler, log=self.log)
    self.rl_step = RLStep(self.inputs, self.components, self.controller, self.loader)
    self.checkpointer = Checkpointer(config.train.checkpoint_dir or self.workdir / "checkpoints",
                                     config.train.keep_checkpoints, log=self.log)
    self.state = RunState(self.checkpointer, self.learner, self.controller, self.loader,
                          self.metrics, config.train.max_consecutive_skipped, self.log)
    # Restoring rewrites metrics.jsonl (rows after the checkpoint) and config.json: a
    # stop signal there waits for the writes (a truncated file would lose rows that
    # cannot be rebuilt) and takes effect at warm-up.
    with self.supervisor.guard.stoppable("restoring the run", when=lambda: False):
      self.state.restore()
      # Only once the checkpoints are known to fit this config: a refused resume leaves
      # the run's config.json (and everything else) as it was.
      if self.is_primary:
        write_run_config(config, self.workdir, resuming=bool(self.step), log=self.log)
    self.supervisor.attach_wandb(self.metrics, self.local_dir, resumed=bool(self.step),
                                 log=self.log)

  # The run's progress, kept (and checkpointed) by its RunState.
  step = property(lambda self: self.state.step)
  history = property(lambda self: self.state.history)
  eval_history = property(lambda self: self.state.eval_history)

  # ------------------------------------------------------------- step, eval
  def train_step(self) -> StepResult:
    """Runs one RL step (``training.step.RLStep``): its metrics row and completions.

    A stop signal during the step's rollout (sampling, scoring) raises
    ``StopRequested`` at once on a single process; during the update only when every
    finished step is already checkpointed (the update overwrites donated weights)."""
    n = self.step + 1
    self.state.begin_step()

    def phase(part: str):
      when = self.state.nothing_new if part == "update" else None
      return self.supervisor.stoppable(f"step {n}'s {part}", when=when)
    result = self.rl_step(self.step, log=self.log, phase=phase)
    self.state.end_step()
    return result

  def evaluate(self, limit: int | None = None) -> dict[str, float]:
    """Held-out accuracy of the current policy (``evaluation.Evaluator``)."""
    return self.evaluator.evaluate(self.model, limit)

  def evaluate_with_lines(self, when: str) -> dict[str, float]:
    """``evaluate`` between a start line and a result line: on CPU an evaluation takes
    as long as several steps, and a user should see it run and what it measured."""
    self.log(f"eval {when} on {self.evaluator.examples()} held-out examples ...")
    evaluation = self.evaluate()
    self.evaluator.log_result(when, evaluation)
    return evaluation

  def warmup(self) -> float:
    """Compiles every sampler / learner shape ahead of time; returns seconds."""
    start = time.perf_counter()
    self.log("warm-up: tracing and compiling every program of the run ...")
    # Every executable of the run in one pool (the evaluator knows which passes run).
    n = compilation.warm(self.components.sampler.warmup_jobs(self.model)
                         + self.evaluator.warmup_jobs(self.model) + self.learner.warmup_jobs(),
                         log=self.log)
    n += distributed.warm_host_gathers(largest_host_gather(
        self.config, self.components, len(self.inputs.reward_fn.term_names)))
    prepare_checksums(abstract_like(self.learner.params), abstract_like(self.learner.opt_state))
    seconds = time.perf_counter() - start
    r = self.config.rollout
    self.log(f"warm-up: {n} executables for row buckets {self.components.row_buckets}, "
             f"prompt buckets {r.prompt_buckets}, response buckets {r.response_buckets} "
             f"in {seconds:.1f} s")
    return seconds

  # ------------------------------------------------------------------- loop
  def run(self, max_steps: int | None = None) -> dict[str, Any]:
    """Trains until ``train.steps`` (or ``max_steps`` more steps), or until the step
    that spends ``train.time_budget_s``; returns a summary."""
    c, stoppable = self.config, self.supervisor.stoppable
    try:
      with stoppable("warm-up", every_process=True):
        self.warmup()
      if self.step == 0 and not self.eval_history:
        with stoppable("the evaluation before RL", every_process=True):  # before the line: a
          evaluation = (self.before_rl(self) if self.before_rl     # signal sent on it
                        else self.evaluate_with_lines("before RL"))   # stops here
        self.state.record_evaluation(evaluation, self.evaluator.sampled_correct)
        self.metrics.write({"step": 0, **evaluation})     # metrics.jsonl, TensorBoard, W&B
      elif self.state.evaluation_missing(self.config.train):
        # A stop signal skipped the evaluation after this step (its step was
        # checkpointed without it): measure it now, or the run never reports it.
        self.log(f"the evaluation after step {self.step} was stopped before it finished; "
                 "running it now")
        with stoppable(f"the evaluation after step {self.step}", every_process=True):
          evaluation = self.evaluate_with_lines(f"after step {self.step}")
        self.state.record_evaluation(evaluation, self.evaluator.sampled_correct)
        self.metrics.add_to_row(self.step, evaluation)   # the step's row, logged before
        if self.history:
          self.history[-1].update(evaluation)
    except StopRequested as stopped:
      # Nothing new exists yet: the newest checkpoint (if any) holds all there is.
      return self._stopped_at_once(stopped)
    end = c.train.steps if max_steps is None else min(c.train.steps, self.step + max_steps)
    # Processes leave the loop on the flag they agreed on (a signal reaches each host
    # on its own, maybe during warm-up): one leaving alone would wait forever in a
    # collective the others never enter.
    stop = self.supervisor.agree_on_stop(self.log)
    spent = budget_spent(c.train, self.state.step_seconds())   # then from each step's row
    if spent:
      self.log(f"the time budget is spent: {self.state.step_seconds():.1f} s of step time "
               f"by step {self.step} (train.time_budget_s={c.train.time_budget_s:g}); "
               "raise it to train on")
    while self.step < end and not stop and not spent:
      before_s = self.state.step_seconds()
      try:
        result = self.train_step()
      except StopRequested as stopped:
        # The step is abandoned (a resume redoes it); the finished ones are kept below.
        self.log(f"stopped during {stopped.phase}: step {self.step + 1} is abandoned")
        self.stopped_in = stopped.phase
        stop = True
        break
      row, interrupted = result.row, False
      row["time_cumulative_s"] = before_s + row["time_total_s"]
      spent = budget_spent(c.train, row["time_cumulative_s"])
      if spent:
        self.log(f"step {self.step}: the time budget is spent ({row['time_cumulative_s']:.1f} "
                 f"s of step time, train.time_budget_s={c.train.time_budget_s:g}); this is "
                 "the run's last step")
      if evaluation_due(c.train, self.step, before_s, row["time_cumulative_s"]):
        try:
          with stoppable(f"the evaluation after step {self.step}"):
            evaluation = self.evaluate_with_lines(f"after step {self.step}")
        except StopRequested:
          # The step itself is done: keep its row and checkpoint it, without the
          # evaluation (a resume does not redo it).
          self.log(f"step {self.step}: evaluation skipped; checkpointing the step")
          interrupted = True
        else:
          self.state.record_evaluation(evaluation, self.evaluator.sampled_correct)
          row.update(evaluation)
      self.history.append(row)
      self.metrics.write(row)
      every = c.train.log_completions_every
      if every and self.step % every == 0:
        self.metrics.write_completions(self.step, result.completions)
      if self.step % c.train.log_every == 0:
        self.metrics.progress(row)
      self.state.check_skipped_updates(row)   # before this step can be checkpointed
      self.checkpointer.check()               # a failed background save stops the run
      if self.step % c.train.checkpoint_every == 0 or self.step == c.train.steps or spent:
        self.state.save()
      if c.train.export_every and self.step % c.train.export_every == 0 and not interrupted:
        try:
          with stoppable(f"the export of step {self.step}"):
            self.supervisor.export_policy(self.model, self.inputs.model_cfg, self.step,
                                          self.log)
        except StopRequested:
          self.log(f"step {self.step}: export stopped (its checkpoint is kept; "
                   f"`python -m sagc_jax.export --workdir {self.workdir} --step {self.step} "
                   "--out <folder>` writes it)")
          interrupted = True
      stop = interrupted or self.supervisor.agree_on_stop(self.log)
    if stop and not self.state.nothing_new():   # e.g. a rollout abandoned between checkpoints
      self.log(f"checkpointing step {self.step} before stopping")
      self.state.save()
    elif self.stopped_in is not None:
      self.log(f"nothing new to checkpoint (the newest checkpoint is "
               f"{f'step {self.step}' if self.step else 'none: no step ran'})")
    self.checkpointer.wait()
    return self._finish(preempted=stop)

  def _stopped_at_once(self, stopped: StopRequested) -> dict[str, Any]:
    """The end of a run stopped before its first step of this start."""
    newest = self.checkpointer.all_steps()
    self.log(f"stopped during {stopped.phase}: nothing new to checkpoint (the newest "
             f"checkpoint is {f'step {newest[-1]}' if newest else 'none: no step ran'}); "
             "rerun the same command to go on")
    self.stopped_in = stopped.phase
    return self._finish(preempted=True)

  def _finish(self, preempted: bool) -> dict[str, Any]:
    """The run's summary, written to ``summary.json`` (process 0); ``preempted``: the run
    stopped early on an agreed signal."""
    summary = self.state.summary(self.config.train, preempted=preempted)
    if self.is_primary:
      write_text(self.workdir / "summary.json", json.dumps(summary, indent=1))
    if distributed.is_multiprocess() and self.stopped_in is None:
      self.state.write_process_fingerprint(self.workdir)
    return summary

  def close(self) -> None:
    try:
      if self.state is not None:
        self.checkpointer.close()
        self.metrics.close()
      if hasattr(self, "inputs"):
        self.inputs.close()
    finally:
      self.supervisor.close()
