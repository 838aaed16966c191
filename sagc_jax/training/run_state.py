"""What a run resumes from, and how it is saved and restored.

``RunState`` holds the finished steps' metrics rows and evaluations and the counters
a resume needs (skipped updates in a row, the checkpoint step the run restored), and
checkpoints them with the weights, the optimizer state, the controller's and the
loader's state (``runtime.checkpoint``). Everything random in a run is a function of
``(config.seed, step)`` and of this restored state, so a run killed after N steps
and resumed from its checkpoint reproduces the uninterrupted run's parameters and
metrics exactly (wall-clock timings aside). A run's ``config.json`` is written here
too, with the settings that changed since the last start logged.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

import jax
import numpy as np

from sagc_jax.models.sharding import abstract_like
from sagc_jax.runtime import distributed
from sagc_jax.training.evaluation import paired_gain
from sagc_jax.runtime.metrics import summarize
from sagc_jax.runtime.storage import read_json, write_text

__all__ = ["RunState", "budget_spent", "config_changes", "evaluation_due", "write_run_config"]


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


def write_run_config(config: Any, workdir: Any, *, resuming: bool,
                     log: Callable[[str], None]) -> None:
  """Writes ``config.json`` (standard JSON: no ``Infinity``, which other readers
  refuse), first logging which settings differ from the one there."""
  path = workdir / "config.json"
  new = json.dumps(config.to_dict(), indent=1, allow_nan=False)
  if path.exists():
    try:
      old = read_json(path)
    except ValueError as err:
      log(f"warning: {err}; replaced by this run's settings (the changes from the "
          "damaged file cannot be listed)")
      old = json.loads(new)
    changes = config_changes(old, json.loads(new))
    if changes:
      log(f"{'resuming' if resuming else 'restarting'} with {len(changes)} changed "
          f"setting(s): " + "; ".join(changes))
  write_text(path, new)


def budget_spent(train: Any, seconds: float) -> bool:
  """Whether ``seconds`` of cumulative step time have used ``train.time_budget_s``
  (never, without a budget): the one rule for where a time-boxed run ends, read by
  the loop, the evaluation schedule and the summary alike."""
  return bool(train.time_budget_s) and seconds >= train.time_budget_s


def evaluation_due(train: Any, step: int, before_s: float, after_s: float) -> bool:
  """Whether step ``step``, which took the run's cumulative step time from
  ``before_s`` to ``after_s``, is followed by an evaluation: every
  ``train.eval_every`` steps, at the last step (``train.steps`` or the step that
  spent ``train.time_budget_s``), and at the first step boundary after each of the
  ``train.eval_points`` evenly spaced points ``j * budget / eval_points``."""
  if step % train.eval_every == 0 or step == train.steps or budget_spent(train, after_s):
    return True
  budget, points = train.time_budget_s, train.eval_points
  if not budget or not points:
    return False

  def passed(seconds: float) -> int:          # points j * budget / points <= seconds
    return min(points, math.floor(seconds * points / budget))
  return passed(after_s) > passed(before_s)


class RunState:
  """The resumable state of a run around its learner, controller and loader."""

  def __init__(self, checkpointer, learner, controller, loader, metrics,
               max_consecutive_skipped: int, log: Callable[[str], None]):
    self.checkpointer, self.learner, self.metrics = checkpointer, learner, metrics
    self.controller, self.loader = controller, loader
    self.max_consecutive_skipped = max_consecutive_skipped
    self.log = log
    self.step = 0
    self.checkpointed_step = 0       # the newest step saved or restored (0: none ran)
    self.consecutive_skipped = 0
    self.resumed_from: int | None = None    # the checkpoint step this run restored
    self.history: list[dict[str, Any]] = []
    self.eval_history: list[dict[str, Any]] = []
    self._step_start: dict[str, Any] | None = None

  def restore(self) -> None:
    """Restores the newest usable checkpoint, if any; a fresh start truncates the
    metrics file (its step-0 evaluation is redone)."""
    learner = self.learner
    restored = self.checkpointer.restore_latest(abstract_like(learner.params),
                                                abstract_like(learner.opt_state))
    if restored is None:
      self.metrics.truncate_after(-1)
      return
    step, learner.params, learner.opt_state, meta = restored
    learner.step = int(meta["learner_step"])
    learner.skipped_updates = int(meta["skipped_updates"])
    self.consecutive_skipped = int(meta.get("consecutive_skipped", 0))
    learner.sync_model()
    self.controller.load_state_dict(meta["controller"])
    self.loader.load_state_dict(meta["loader"])
    self.history = list(meta["history"])
    self.eval_history = list(meta["eval_history"])
    self.step = self.resumed_from = self.checkpointed_step = step
    self.metrics.truncate_after(step)
    # A checkpointed step whose row was lost (a torn last line: kill -9 or a full disk
    # while it was written) is not rerun: write its row again from the checkpoint.
    logged = self.metrics.logged_steps()
    for row in self.history if self.metrics.enabled else ():
      if row["step"] not in logged:
        self.metrics.write(row)
        self.log(f"metrics.jsonl: the row of step {row['step']} was missing; written again "
                 f"from checkpoint step {step}")
    self.log(f"resumed from checkpoint step {step} in {self.checkpointer.directory}")

  def step_seconds(self) -> float:
    """The run's cumulative step time: what ``train.time_budget_s`` is spent on."""
    return float(sum(row["time_total_s"] for row in self.history))

  def evaluation_missing(self, train: Any) -> bool:
    """The restored step was due an evaluation (``evaluation_due``) that the history
    lacks (a stop signal skipped it after the step was saved)."""
    if not self.step or not self.history:
      return False
    after = self.step_seconds()
    due = evaluation_due(train, self.step, after - self.history[-1]["time_total_s"], after)
    return bool(due and self.eval_history and self.eval_history[-1]["step"] != self.step)

  def record_evaluation(self, evaluation: dict[str, float], sampled_correct: Any) -> None:
    """Keeps an evaluation in the history (checkpointed), with its per-example sampled
    correctness, from which the summary's paired accuracy gain is computed."""
    self.eval_history.append({"step": self.step, **evaluation,
                              "sampled_correct": np.asarray(sampled_correct).tolist()})

  def begin_step(self) -> None:
    """Keeps the controller's and loader's state at a step's start: a step a stop
    signal abandons is checkpointed as not begun."""
    self._step_start = self._positions()

  def _positions(self) -> dict[str, Any]:
    """The controller's and the loader's state (checkpointed with the step)."""
    return {"controller": self.controller.state_dict(), "loader": self.loader.state_dict()}

  def end_step(self) -> None:
    self._step_start = None
    self.step += 1

  def save(self) -> None:
    """Checkpoints the finished steps (during an abandoned step: the controller and
    loader state of its start, with the weights its rollout has not touched)."""
    state = self._step_start or self._positions()
    meta = {"step": self.step, "learner_step": self.learner.step,
            "skipped_updates": self.learner.skipped_updates,
            "consecutive_skipped": self.consecutive_skipped, **state,
            "history": self.history, "eval_history": self.eval_history}
    self.checkpointer.save(self.step, self.learner.params, self.learner.opt_state, meta)
    self.checkpointed_step = self.step
    self.metrics.flush()         # the rows of every checkpointed step are durable too

  def nothing_new(self) -> bool:
    """Every finished step is checkpointed (or none ran): a stop loses nothing."""
    return self.step == self.checkpointed_step

  def describe(self) -> str:
    """What a stop at this moment keeps (the stop watchdog's last line)."""
    writing = self.checkpointed_step and self.checkpointer.saving()
    if self.nothing_new() and not writing:
      return (f"Nothing is lost: the newest checkpoint is step {self.step}." if self.step
              else "No step had run.")
    if self.nothing_new():
      return (f"Step {self.step}'s checkpoint was still being written: a resume starts from "
              "it if the write finished, else from the checkpoint before it.")
    first, last = self.checkpointed_step + 1, self.step
    lost = f"Step {last} was" if first == last else f"Steps {first}-{last} were"
    start = f"step {first - 1} (if its write finished)" if first > 1 else "the beginning"
    return f"{lost} not checkpointed; a resume starts from {start}."

  def check_skipped_updates(self, row: dict[str, Any]) -> None:
    """Counts updates skipped in a row (steps whose every update was non-finite) and
    stops the run at ``train.max_consecutive_skipped``: the checkpoints saved from
    then on would hold a policy that no longer learns and rotate the good ones out."""
    updates = row.get("learner/updates", 0.0)
    skipped = row.get("learner/skipped_updates", 0.0)
    if updates:
      self.consecutive_skipped = (self.consecutive_skipped + int(skipped)
                                  if skipped == updates else 0)
    limit = self.max_consecutive_skipped
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

  def summary(self, train: Any, preempted: bool) -> dict[str, Any]:
    """The run's summary: the step rows' means, accuracy before / after RL, the
    paired accuracy gain over the same held-out examples and, with a
    ``train.time_budget_s``, whether the run spent it (then it is finished)."""
    out: dict[str, Any] = {**summarize(self.history), "steps": self.step,
                           "preempted": preempted}
    if train.time_budget_s:
      out.update(time_budget_s=train.time_budget_s,
                 budget_spent=budget_spent(train, self.step_seconds()))
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

  def write_process_fingerprint(self, workdir: Any) -> None:
    """Per-process record of the G sequence and a parameter checksum (multi-process
    runs): every process must have made the same decisions and hold the same policy."""
    leaves = jax.tree.leaves(distributed.to_host(self.learner.params))
    (workdir / f"process_{jax.process_index()}.json").write_text(json.dumps({
        "process": jax.process_index(), "processes": jax.process_count(),
        "g": [r["g"] for r in self.history],
        "param_checksums": [float(np.asarray(x, np.float64).sum()) for x in leaves]}))
