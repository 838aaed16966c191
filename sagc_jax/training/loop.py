"""The training loop: evaluation, metrics, checkpoints, resume, signals.

A run is built from three parts, each its own module:

* ``training.inputs.build_run_inputs``: mesh, data, the starting policy (the tiny model's
  supervised warm start when needed), tokenizer, rewards;
* ``training.build.build_components``: the compiled samplers and learner, and the controller;
* ``training.step.RLStep``: one RL step (propose -> sample -> reward -> update -> observe).

This module runs the step in a loop: held-out evaluation (``evaluation.Evaluator``)
before RL and every ``train.eval_every`` steps, a metrics row per step
(``metrics.jsonl`` + TensorBoard), checkpoints every ``train.checkpoint_every`` steps,
and a bounded stop on SIGTERM or a first Ctrl-C (``runtime.stop``): the phase the
signal arrives in is abandoned when a resume redoes its work (start-up, warm-up,
evaluations, a step's rollout, an export) and what was finished before it is
checkpointed; a learner update runs to its end first. A lock file keeps a second
trainer off the run directory.

Everything random is a function of ``(config.seed, step)`` and of restored
state (controller RNG, loader position, learner step), so a run killed after
N steps and resumed from its checkpoint reproduces the uninterrupted run's
parameters and metrics exactly (wall-clock timings aside).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from sagc_jax.runtime import compilation
from sagc_jax.runtime import distributed
from sagc_jax.runtime.stop import StopGuard, StopRequested, write_now
from sagc_jax.runtime.checkpoint import Checkpointer, prepare_checksums
from sagc_jax.training.build import build_components
from sagc_jax.config import RunConfig, run_config
from sagc_jax.data import PromptLoader
from sagc_jax.training.evaluation import Evaluator, paired_gain
from sagc_jax.runtime.metrics import MetricsWriter, read_jsonl, summarize
from sagc_jax.models.sharding import abstract_like
from sagc_jax.training.export import prepare_export_root
from sagc_jax.training.step import RLStep, StepResult
from sagc_jax.training.wandb_run import start_wandb
from sagc_jax.training.inputs import build_run_inputs, configure_compilation_cache
from sagc_jax.runtime.run_lock import RunLock
from sagc_jax.runtime.storage import cache_root, local_mirror, run_path

_TIMING_KEYS = ("time_rollout_s", "time_reward_s", "time_reward_overlapped_s", "time_learner_s",
                "time_total_s", "learner_seconds", "eval_seconds")


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
  """``key: old -> new`` for every setting that differs between two config dicts."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += config_changes(a, b, f"{prefix}{key}.")
    elif a != b:
      out.append(f"{prefix}{key}: {a!r} -> {b!r}")
  return out


class Trainer:
  """Builds every component from a validated config and runs the step loop."""

  def __init__(self, config: RunConfig, workdir: str | os.PathLike, *,
               log: Callable[[str], None] | None = None, read_only: bool = False,
               restore: bool = True, stop_deadline: bool = False,
               before_rl: Callable[["Trainer"], dict[str, float]] | None = None):
    """``read_only``: a reader of the run (eval): nothing in ``workdir`` is created,
    rewritten, truncated or moved (no config.json, metrics or compilation cache writes;
    damaged checkpoints are skipped in place). ``restore=False`` keeps the policy
    the config names instead of the run's newest checkpoint.

    A trainer handles SIGTERM / SIGINT from here to ``close()`` (a writer on the main
    thread); a signal during start-up raises ``StopRequested``. ``stop_deadline``
    (the command line): end the process ``train.stop_grace_s`` after the first
    signal whatever it is doing (``runtime.stop``). ``before_rl(trainer)``: returns the
    evaluation before RL in place of running it (a comparison reuses one per seed)."""
    config = run_config(config)     # the command line built it; a ConfigDict is checked here
    self.read_only = read_only
    self.before_rl = before_rl
    self.config = config
    # The workdir may be a bucket (gs://): every run file goes through storage.run_path.
    # Rebuildable files that need a real filesystem (TFDS data, the tiny model's warm
    # start) go to a local mirror; gs:// inputs are staged into the local cache.
    self.workdir = run_path(workdir)
    self.cache_root = cache_root(config.train.local_cache_dir)
    self.local_dir = local_mirror(workdir, self.cache_root)
    self.is_primary = jax.process_index() == 0
    self._lock = None
    self.step = 0
    self._checkpointed_step = 0       # the newest step saved or restored (0: none ran)
    self._step_start_state: dict[str, Any] | None = None
    prefix = f"[process {jax.process_index()}] " if jax.process_index() else ""
    self.guard = StopGuard(lambda message: write_now(message, prefix),
                           grace_s=(config.train.stop_grace_s or None) if stop_deadline
                           else None,
                           describe_state=self._describe_checkpoints)
    self.log = log or print           # until the metrics writer exists
    if not read_only:
      self.guard.install()
    try:
      if not read_only:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.is_primary:         # before anything in the workdir is written
          self._lock = RunLock(self.workdir, log=log or print)
          self._lock.acquire()
      with self._stoppable("start-up", every_process=True):
        self._build(config, log, read_only, restore)
    except BaseException:
      # A refused or stopped start (a bad config, a checkpoint mismatch, a signal)
      # leaves no lock or signal handler behind.
      self.guard.uninstall()
      if self._lock is not None:
        self._lock.release()
      raise

  def _build(self, config: RunConfig, log: Callable[[str], None] | None,
             read_only: bool, restore: bool) -> None:
    """The rest of ``__init__``, once the run directory is this trainer's."""
    if config.train.export_every and self.is_primary and not read_only:
      prepare_export_root(config, self.workdir, log or print)   # before any run file
    self.metrics = MetricsWriter(self.workdir, config.train.steps,
                                 enabled=self.is_primary and not read_only,
                                 sync_secs=config.train.metrics_sync_secs,
                                 local_dir=self.local_dir)
    self.log = log or (print if read_only else self.metrics.log)
    compilation.install()
    configure_compilation_cache(config, self.workdir, self.cache_root, read_only)
    self.inputs = build_run_inputs(config, self.local_dir, self.cache_root, self.log)
    self.model = self.inputs.model
    self.loader = PromptLoader(self.inputs.train_source, seed=config.seed,
                               shard_index=jax.process_index(), num_shards=jax.process_count())
    self.controller = config.build_controller()
    processes = jax.process_count()
    self.controller.check_process_count(processes)
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
                                     config.train.keep_checkpoints, log=self.log,
                                     read_only=read_only)
    self.consecutive_skipped = 0
    self.resumed_from: int | None = None    # the checkpoint step this run restored
    self.history: list[dict[str, Any]] = []
    self.eval_history: list[dict[str, Any]] = []
    self._stopped_by_signal = False   # the run stopped early on an agreed signal
    self.stopped_in: str | None = None   # the phase a stop signal ended at once
    # Restoring rewrites metrics.jsonl (rows after the checkpoint) and config.json: a
    # stop signal there waits for the writes (a truncated file would lose rows that
    # cannot be rebuilt) and takes effect at warm-up.
    with self.guard.stoppable("restoring the run", when=lambda: False):
      if restore:
        self._restore()
      # Only once the checkpoints are known to fit this config: a refused resume leaves
      # the run's config.json (and everything else) as it was.
      self._write_config()
    if config.train.wandb_project and self.is_primary and not read_only:
      self.metrics.attach_wandb(start_wandb(config, self.workdir, self.local_dir,
                                            resumed=bool(self.step), log=self.log))

  def export_policy(self) -> str:
    """Writes the current policy as a Hugging Face folder (``train.export_every``):
    ``<train.export_dir or workdir/exports>/step_<N>``, replaced when a resumed run
    reaches the same step again. Every process must call it (weights are gathered)."""
    from sagc_jax.training.export import base_folder, write_hf_folder

    root = self.config.train.export_dir or os.fspath(self.workdir / "exports")
    out = f"{root.rstrip('/')}/step_{self.step}"
    start = time.perf_counter()
    # Only process 0 writes (and copies the starting folder's files); all gather.
    folder = base_folder(self.config, os.fspath(self.workdir)) if self.is_primary else None
    write_hf_folder(self.model, self.inputs.model_cfg, folder, out, replace=True)
    self.log(f"step {self.step}: exported the policy to {out} "
             f"({time.perf_counter() - start:.1f} s)")
    return out

  # ------------------------------------------------------------------ setup
  def _write_config(self) -> None:
    """Writes config.json, first logging which settings differ from the one there."""
    if not self.is_primary or self.read_only:
      return
    path = self.workdir / "config.json"
    new = json.dumps(self.config.to_dict(), indent=1)
    if path.exists():
      try:
        old = json.loads(path.read_text())
      except (ValueError, UnicodeDecodeError) as err:
        self.log(f"warning: {path} is not valid JSON ({err}); replaced by this run's "
                 "settings (the changes from the damaged file cannot be listed)")
        old = json.loads(new)
      changes = config_changes(old, json.loads(new))
      if changes:
        self.log(f"{'resuming' if self.step else 'restarting'} with {len(changes)} changed "
                 f"setting(s): " + "; ".join(changes))
    path.write_text(new)

  # -------------------------------------------------------------- checkpoint
  def _restore(self) -> None:
    restored = self.checkpointer.restore_latest(abstract_like(self.learner.params),
                                                abstract_like(self.learner.opt_state))
    if restored is None:
      self.metrics.truncate_after(-1)     # a fresh start: its step-0 evaluation is redone
      return
    step, params, opt_state, meta = restored
    self.learner.params = params
    self.learner.opt_state = opt_state
    self.learner.step = int(meta["learner_step"])
    self.learner.skipped_updates = int(meta["skipped_updates"])
    self.consecutive_skipped = int(meta.get("consecutive_skipped", 0))
    self.learner.sync_model()
    self.controller.load_state_dict(meta["controller"])
    self.loader.load_state_dict(meta["loader"])
    self.history = list(meta["history"])
    self.eval_history = list(meta["eval_history"])
    self.step = step
    self.resumed_from = self._checkpointed_step = step
    self.metrics.truncate_after(step)
    # A checkpointed step whose row was lost (a torn last line: kill -9 or a full disk
    # while it was written) is not rerun: write its row again from the checkpoint.
    logged = self.metrics.logged_steps() if self.metrics.enabled else None
    for row in self.history if logged is not None else ():
      if row["step"] not in logged:
        self.metrics.write(row)
        self.log(f"metrics.jsonl: the row of step {row['step']} was missing; written again "
                 f"from checkpoint step {step}")
    self.log(f"resumed from checkpoint step {step} in {self.checkpointer.directory}")

  def save_checkpoint(self) -> None:
    """Checkpoints the finished steps. During a step (a stop signal abandoned it) the
    controller and loader have moved on: their state at the step's start is saved,
    with the weights, which the abandoned rollout has not touched."""
    state = self._step_start_state or {"controller": self.controller.state_dict(),
                                       "loader": self.loader.state_dict()}
    meta = {
        "step": self.step,
        "learner_step": self.learner.step,
        "skipped_updates": self.learner.skipped_updates,
        "consecutive_skipped": self.consecutive_skipped,
        **state,
        "history": self.history,
        "eval_history": self.eval_history,
    }
    self.checkpointer.save(self.step, self.learner.params, self.learner.opt_state, meta)
    self._checkpointed_step = self.step
    self.metrics.flush()         # the rows of every checkpointed step are durable too

  def _nothing_new(self) -> bool:
    """Every finished step is checkpointed (or none ran): a stop loses nothing."""
    return self.step == self._checkpointed_step

  def _describe_checkpoints(self) -> str:
    """What a stop at this moment keeps (the watchdog's last line)."""
    writing = self._checkpointed_step and self.checkpointer.saving()
    if self._nothing_new() and not writing:
      return (f"Nothing is lost: the newest checkpoint is step {self.step}." if self.step
              else "No step had run.")
    if self._nothing_new():
      return (f"Step {self.step}'s checkpoint was still being written: a resume starts from "
              "it if the write finished, else from the checkpoint before it.")
    first, last = self._checkpointed_step + 1, self.step
    lost = f"Step {last} was" if first == last else f"Steps {first}-{last} were"
    start = (f"step {first - 1} (if its write finished)" if first > 1
             else "the beginning")
    return f"{lost} not checkpointed; a resume starts from {start}."

  # ------------------------------------------------------------- step, eval
  def train_step(self) -> StepResult:
    """Runs one RL step (``training.step.RLStep``): its metrics row and completions.

    A stop signal during the step's rollout (sampling, scoring) raises
    ``StopRequested`` at once on a single process; during the update only when every
    finished step is already checkpointed (the update overwrites donated weights)."""
    n = self.step + 1
    self._step_start_state = {"controller": self.controller.state_dict(),
                              "loader": self.loader.state_dict()}

    def phase(part: str):
      if part == "update":
        return self._stoppable(f"step {n}'s update", when=self._nothing_new)
      return self._stoppable(f"step {n}'s {part}")
    result = self.rl_step(self.step, log=self.log, phase=phase)
    self._step_start_state = None
    self.step = n
    return result

  def evaluate(self, limit: int | None = None) -> dict[str, float]:
    """Held-out accuracy of the current policy (``evaluation.Evaluator``)."""
    return self.evaluator.evaluate(self.model, limit)

  def evaluate_with_lines(self, when: str) -> dict[str, float]:
    """``evaluate`` between a start line and a result line: on CPU an evaluation takes
    as long as several steps, and a user should see it run and what it measured."""
    self.log(f"eval {when} on {self.evaluator.examples()} held-out examples ...")
    evaluation = self.evaluate()
    self.log_evaluation(when, evaluation)
    return evaluation

  def log_evaluation(self, when: str, evaluation: dict[str, float]) -> None:
    greedy = (f"{evaluation['eval_accuracy']:.3f} greedy, "
              if "eval_accuracy" in evaluation else "")
    self.log(f"eval {when}: held-out accuracy {greedy}"
             f"{evaluation['eval_sampled_accuracy']:.3f} sampled")

  def _evaluate_before_rl(self) -> dict[str, float]:
    """The evaluation before RL, or what the ``before_rl`` hook gives instead (a
    comparison's runs of one seed reuse one: ``experiments.initial_eval``)."""
    if self.before_rl is not None:
      return self.before_rl(self)
    return self.evaluate_with_lines("before RL")

  def _evaluation_missing(self) -> bool:
    """The restored step was due an evaluation (``train.eval_every``, the last step)
    that the history lacks."""
    steps, every = self.config.train.steps, self.config.train.eval_every
    due = self.step > 0 and (self.step % every == 0 or self.step == steps)
    return bool(due and self.eval_history and self.eval_history[-1]["step"] != self.step)

  def _record_evaluation(self, evaluation: dict[str, float]) -> None:
    """Keeps an evaluation in the history (checkpointed), with its per-example sampled
    correctness, from which the summary's paired accuracy gain is computed."""
    self.eval_history.append({"step": self.step, **evaluation,
                              "sampled_correct": self.evaluator.sampled_correct.tolist()})

  # ------------------------------------------------------------------- loop
  def _largest_host_gather(self) -> int:
    """Bytes of the largest per-step host gather of a multi-process run: the prompt
    token ids, a per-row value (or the row's reward terms), the per-group length
    stats of one round, or a [rows, sequence] int32/float32 array fetched from the
    devices (sampler tokens, learner log-probs)."""
    r = self.config.rollout
    sizes = self.config.group_sizes()
    prompts = max(self.config.rollout.prompts_for(g) for g in sizes)
    local = -(-prompts // jax.process_count())
    sequence = max(r.prompt_buckets) + max(r.response_buckets)
    per_row = max(8, 4 * len(self.inputs.reward_fn.term_names))   # the reward terms
    return max(local * max(r.prompt_buckets) * 4, local * max(sizes) * per_row,
               2 * prompts * 8,
               max(self.components.row_buckets) * sequence * 4 + 4096)

  def warmup(self) -> float:
    """Compiles every sampler / learner shape ahead of time; returns seconds."""
    start = time.perf_counter()
    self.log("warm-up: tracing and compiling every program of the run ...")
    n = self.components.warmup(self.model, self.evaluator.warmup_jobs(self.model), log=self.log)
    n += distributed.warm_host_gathers(self._largest_host_gather())
    prepare_checksums(abstract_like(self.learner.params), abstract_like(self.learner.opt_state))
    seconds = time.perf_counter() - start
    self.log(f"warm-up: {n} executables for row buckets {self.components.row_buckets}, "
             f"prompt buckets "
             f"{tuple(self.config.rollout.prompt_buckets)}, response buckets "
             f"{tuple(self.config.rollout.response_buckets)} in {seconds:.1f} s")
    return seconds

  def _stoppable(self, phase: str, when: Callable[[], bool] | None = None, *,
                 every_process: bool = False):
    """A phase that a stop signal ends at once (``StopRequested``) instead of after it,
    when ``when()`` holds (default: always). Inside the step loop only on a single
    process: on a pod every process must leave at the same point (``_agree_on_stop``),
    so there the signal waits for the step's end (``train.stop_grace_s`` bounds the
    wait). Phases before the first step (``every_process``) hold nothing new, and
    stop at once on every process that receives the signal."""
    alone = every_process or not distributed.is_multiprocess()
    return self.guard.stoppable(phase, when=lambda: alone and (when is None or when()))

  def _agree_on_stop(self) -> bool:
    """True on every process if any received a stop signal (all must call it)."""
    stop = distributed.any_on_all(self.guard.requested)
    if stop and not self.guard.requested:
      self.log("another process received a stop signal: checkpointing and stopping with it")
    return stop

  def run(self, max_steps: int | None = None) -> dict[str, Any]:
    """Trains until ``train.steps`` (or ``max_steps`` more steps); returns a summary."""
    c = self.config
    try:
      with self._stoppable("warm-up", every_process=True):
        self.warmup()
      if self.step == 0 and not self.eval_history:
        with self._stoppable("the evaluation before RL", every_process=True):     # before the line: a
          evaluation = self._evaluate_before_rl()   # signal sent on it stops here
      elif self._evaluation_missing():
        # A stop signal skipped the evaluation after this step (its step was
        # checkpointed without it): measure it now, or the run never reports it.
        self.log(f"the evaluation after step {self.step} was stopped before it finished; "
                 "running it now")
        with self._stoppable(f"the evaluation after step {self.step}", every_process=True):
          evaluation = self.evaluate_with_lines(f"after step {self.step}")
        self._record_evaluation(evaluation)
        self.metrics.add_to_row(self.step, evaluation)   # the step's row, logged before
        if self.history:
          self.history[-1].update(evaluation)
    except StopRequested as stopped:
      # Nothing new exists yet: the newest checkpoint (if any) holds all there is.
      return self._stopped_at_once(stopped)
    if self.step == 0 and not self.eval_history:
      self._record_evaluation(evaluation)
      self.metrics.write({"step": 0, **evaluation})     # metrics.jsonl, TensorBoard, W&B
    end = c.train.steps if max_steps is None else min(c.train.steps, self.step + max_steps)
    # Processes leave the loop on the flag they agreed on (a signal reaches each host
    # on its own, maybe during warm-up): one leaving alone would wait forever in a
    # collective the others never enter.
    stop = self._agree_on_stop()
    while self.step < end and not stop:
      try:
        result = self.train_step()
        row = result.row
      except StopRequested as stopped:
        # The step is abandoned (a resume redoes it); the finished ones are kept below.
        self.log(f"stopped during {stopped.phase}: step {self.step + 1} is abandoned")
        self.stopped_in = stopped.phase
        stop = True
        break
      interrupted = False
      if self.step % c.train.eval_every == 0 or self.step == c.train.steps:
        try:
          with self._stoppable(f"the evaluation after step {self.step}"):
            evaluation = self.evaluate_with_lines(f"after step {self.step}")
        except StopRequested:
          # The step itself is done: keep its row and checkpoint it, without the
          # evaluation (a resume does not redo it).
          self.log(f"step {self.step}: evaluation skipped; checkpointing the step")
          interrupted = True
        else:
          self._record_evaluation(evaluation)
          row.update(evaluation)
      self.history.append(row)
      self.metrics.write(row)
      every = c.train.log_completions_every
      if every and self.step % every == 0:
        self.metrics.write_completions(self.step, result.completions)
      if self.step % c.train.log_every == 0:
        self.metrics.progress(row)
      self._check_skipped_updates(row)        # before this step can be checkpointed
      self.checkpointer.check()               # a failed background save stops the run
      if self.step % c.train.checkpoint_every == 0 or self.step == c.train.steps:
        self.save_checkpoint()
      if c.train.export_every and self.step % c.train.export_every == 0 and not interrupted:
        try:
          with self._stoppable(f"the export of step {self.step}"):
            self.export_policy()
        except StopRequested:
          self.log(f"step {self.step}: export stopped (its checkpoint is kept; "
                   f"`python -m sagc_jax.export --workdir {self.workdir} --step {self.step} "
                   "--out <folder>` writes it)")
          interrupted = True
      stop = interrupted or self._agree_on_stop()
    if stop and not self._nothing_new():   # e.g. a rollout abandoned between checkpoints
      self.log(f"checkpointing step {self.step} before stopping")
      self.save_checkpoint()
    elif self.stopped_in is not None:
      self.log(f"nothing new to checkpoint (the newest checkpoint is "
               f"{f'step {self.step}' if self.step else 'none: no step ran'})")
    self._stopped_by_signal = stop
    self.checkpointer.wait()
    return self._finish()

  def _stopped_at_once(self, stopped: StopRequested) -> dict[str, Any]:
    """The end of a run stopped before its first step of this start."""
    newest = self.checkpointer.all_steps()
    self.log(f"stopped during {stopped.phase}: nothing new to checkpoint (the newest "
             f"checkpoint is {f'step {newest[-1]}' if newest else 'none: no step ran'}); "
             "rerun the same command to go on")
    self.stopped_in = stopped.phase
    self._stopped_by_signal = True
    return self._finish()

  def _finish(self) -> dict[str, Any]:
    """The run's summary, written to ``summary.json`` (process 0)."""
    summary = self.summary()
    if self.is_primary:
      (self.workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    if distributed.is_multiprocess() and self.stopped_in is None:
      self._write_process_fingerprint()
    return summary

  def _check_skipped_updates(self, row: dict[str, Any]) -> None:
    """Counts updates skipped in a row (steps whose every update was non-finite) and
    stops the run at ``train.max_consecutive_skipped``: the checkpoints saved from
    then on would hold a policy that no longer learns and rotate the good ones out."""
    updates = row.get("learner/updates", 0.0)
    skipped = row.get("learner/skipped_updates", 0.0)
    if updates:
      self.consecutive_skipped = (self.consecutive_skipped + int(skipped)
                                  if skipped == updates else 0)
    limit = self.config.train.max_consecutive_skipped
    if limit and self.consecutive_skipped >= limit:
      last = self.checkpointer.all_steps()
      since_resume = (self.resumed_from is not None
                      and self.step - self.resumed_from <= self.consecutive_skipped)
      restored = (f" Every update since this run resumed from checkpoint step "
                  f"{self.resumed_from} was skipped: that step's weights may be damaged; "
                  "move it aside to resume from the one before." if since_resume else "")
      raise RuntimeError(
          f"step {self.step}: {self.consecutive_skipped} learner updates in a row were skipped "
          f"(non-finite loss or gradients; train.max_consecutive_skipped={limit}). Stopped "
          f"without checkpointing this step; the newest checkpoint is step "
          f"{last[-1] if last else None}. Lower learner.lr or learner.max_grad_norm, or "
          f"check the rewards, then resume.{restored}")

  def _write_process_fingerprint(self) -> None:
    """Per-process record of the G sequence and a parameter checksum (multi-process
    runs): every process must have made the same decisions and hold the same policy."""
    leaves = jax.tree.leaves(distributed.to_host(self.learner.params))
    (self.workdir / f"process_{jax.process_index()}.json").write_text(json.dumps({
        "process": jax.process_index(), "processes": jax.process_count(),
        "g": [r["g"] for r in self.history],
        "param_checksums": [float(np.asarray(x, np.float64).sum()) for x in leaves]}))

  def summary(self) -> dict[str, Any]:
    out: dict[str, Any] = {**summarize(self.history), "steps": self.step,
                           "preempted": self._stopped_by_signal}
    if self.eval_history:
      first, last = self.eval_history[0], self.eval_history[-1]
      after = last["step"] > first["step"]        # an evaluation after RL exists
      for key in ("eval_accuracy", "eval_sampled_accuracy"):
        if key in first:
          out[f"{key}_start"] = first[key]
          if after:
            out[f"{key}_end"] = last[key]
      if after:
        out["eval_response_len_end"] = last.get("eval_response_len",
                                                last["eval_sampled_response_len"])
      if (len(self.eval_history) > 1 and "sampled_correct" in first
          and len(first["sampled_correct"]) == len(last.get("sampled_correct", ())) > 1):
        out.update(paired_gain(first["sampled_correct"], last["sampled_correct"]))
    out["skipped_updates"] = self.learner.skipped_updates
    return out

  def close(self) -> None:
    try:
      self.checkpointer.close()
      self.metrics.close()
      if hasattr(self, "inputs"):
        self.inputs.close()
    finally:
      self.guard.uninstall()
      if self._lock is not None:
        self._lock.release()
        self._lock = None


def deterministic_view(row: dict[str, Any]) -> dict[str, Any]:
  """A metrics row without wall-clock fields (what exact resume must reproduce)."""
  return {k: v for k, v in row.items() if k not in _TIMING_KEYS
          and not k.startswith("time_") and k != "learner/learner_seconds"}


def load_history(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """The step rows of a run's ``metrics.jsonl`` (steps 1, 2, ...; the step-0 row of the
  evaluation before RL is ``load_evaluation_before_rl``)."""
  return [r for r in read_jsonl(run_path(workdir) / "metrics.jsonl") if r.get("step", 0) >= 1]


def load_evaluation_before_rl(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The step-0 row of ``metrics.jsonl``: the held-out evaluation before RL."""
  rows = [r for r in read_jsonl(run_path(workdir) / "metrics.jsonl") if r.get("step") == 0]
  return rows[-1] if rows else None
