"""Per-step metrics: ``metrics.jsonl``, TensorBoard event files, console progress,
sampled completions (``completions.jsonl`` and TensorBoard text), optional W&B.

Every step appends one JSON object per line to ``<workdir>/metrics.jsonl``
(flushed, so a killed run keeps every finished step; in a ``gs://`` workdir the
object is rewritten every ``train.metrics_sync_secs`` and at each checkpoint) and writes the same
scalars to TensorBoard event files under ``<workdir>/tensorboard`` (tensorboardX's
event format: no TensorFlow needed). The console gets a progress bar with ETA
and the key figures. Only the primary process writes.

Every ``train.log_completions_every`` steps a few sampled completions (prompt,
completion, reward and its terms, length) go to ``completions.jsonl`` and to
TensorBoard's text tab: reading them is how reward hacking is caught. With
``train.wandb_project`` set (and ``wandb`` installed) rows and completions are also
sent to Weights & Biases.

Every write happens on the caller's thread, so a failure (a full disk) is raised in
the training loop as ``MetricsWriteError`` naming the file. tensorboardX's own
``SummaryWriter`` writes from a background thread: when that thread died on a full
disk, the next ``add_scalar`` blocked forever on its bounded queue, and neither the
run nor a pod's SIGTERM could end it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from sagc_jax.runtime.storage import FolderUpload, is_remote, line_file, run_path

__all__ = ["MetricsWriteError", "MetricsWriter", "deterministic_view", "load_evaluation_before_rl",
           "load_history", "parse_jsonl", "read_jsonl", "summarize"]

# Wall-clock fields besides the ``time_*`` ones.
_TIMING_KEYS = ("learner_seconds", "eval_seconds", "learner/learner_seconds")

KEY_FIGURES = (("G", "g", "{:.0f}"), ("lam", "lambda", "{:.2f}"),
               ("strag", "group_straggler_rate", "{:.2f}"), ("S_t", "step_straggler", "{:.0f}"),
               ("reward", "reward_mean", "{:.3f}"),
               ("acc", "accuracy", "{:.3f}"), ("len", "response_len_mean", "{:.1f}"),
               ("s/step", "time_total_s", "{:.2f}"))


def parse_jsonl(lines: Sequence[str], path: Any, warn=None) -> list[tuple[str, dict]]:
  """``(line, row)`` of each non-empty line of a JSON-lines file.

  A kill -9 or a full disk can leave the last line half-written: a torn last line is
  dropped, with one warning naming the file (``warn``, default stderr), since every
  row after the last checkpoint is rewritten by the resumed run anyway. A bad line
  anywhere else is damage, not a torn write: a ``ValueError`` names the file and line.
  """
  numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
  parsed = []
  for k, (number, line) in enumerate(numbered):
    try:
      parsed.append((line, json.loads(line)))
    except json.JSONDecodeError as err:
      if k + 1 < len(numbered):
        raise ValueError(f"{path}:{number}: not a JSON row ({err.msg}); only a torn last "
                         "line is dropped by itself: fix or remove this line") from None
      message = (f"warning: {path}: dropping its torn last line {number} "
                 f"({len(line)} characters, {err.msg}): a write was cut short")
      (warn or (lambda m: print(m, file=sys.stderr, flush=True)))(message)
  return parsed


def read_jsonl(path: str | os.PathLike, warn=None) -> list[dict[str, Any]]:
  """Rows of a JSON-lines file (local or ``gs://``); a torn last line is dropped."""
  file = run_path(path)
  return [row for _, row in parse_jsonl(file.read_text(encoding="utf-8").splitlines(), file,
                                        warn)]


class MetricsWriteError(RuntimeError):
  """Writing ``metrics.jsonl`` or the TensorBoard events failed (e.g. the disk is full)."""


@contextlib.contextmanager
def _writing(path: Any):
  """An OS error inside becomes ``MetricsWriteError`` naming ``path``."""
  try:
    yield
  except OSError as err:
    raise MetricsWriteError(f"writing metrics to {path} failed: {err}") from err


class _SummaryEvents:
  """TensorBoard summary events appended to one event file, synchronously."""

  def __init__(self, logdir: Path):
    from tensorboardX.event_file_writer import EventsWriter
    logdir.mkdir(parents=True, exist_ok=True)
    self._writer = EventsWriter(os.fspath(logdir / "events"))
    self.path = Path(self._writer._file_name)   # pylint: disable=protected-access

  def add(self, kind: str, tag: str, value: Any, step: int) -> None:
    """One summary of ``kind`` ("scalar", "text": tensorboardX.summary's functions)."""
    from tensorboardX import summary
    from tensorboardX.proto.event_pb2 import Event
    self._writer.write_event(Event(wall_time=time.time(), step=step,
                                   summary=getattr(summary, kind)(tag, value)))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class MetricsWriter:
  """Writes metric rows for steps ``first_step..total_steps``.

  ``workdir`` may be local or remote (``gs://``). Locally each row is appended
  and flushed; in a bucket the file is rewritten at most every ``sync_secs``
  and on ``flush`` (see ``storage.RewrittenObject``); TensorBoard event files
  are written under ``local_dir`` and uploaded on ``flush`` and ``close``.
  """

  def __init__(self, workdir: str | os.PathLike, total_steps: int, *, enabled: bool = True,
               tensorboard: bool = True, stream=None, sync_secs: float = 30.0,
               local_dir: str | os.PathLike | None = None):
    self.enabled = enabled
    self.total_steps = total_steps
    self.stream = stream or sys.stdout
    self._start = time.perf_counter()
    self._first_step: int | None = None
    self._jsonl = self._completions = self._tb = self._wandb = None
    if not enabled:
      return
    self._jsonl = line_file(run_path(workdir) / "metrics.jsonl", sync_secs)
    self._completions = line_file(run_path(workdir) / "completions.jsonl", sync_secs)
    if tensorboard:
      # Event files are appended, so they are written locally (the run's local mirror
      # when the workdir is a bucket) and uploaded on flush/close. tensorboardX's own
      # gs:// writer re-uploads from __del__, after close, which hangs a process whose
      # network is gone.
      if is_remote(workdir) and local_dir is None:
        raise ValueError(f"workdir {workdir}: a bucket workdir needs local_dir for the "
                         "TensorBoard event files")
      remote_tb = run_path(workdir) / "tensorboard"
      local_tb = Path(local_dir) / "tensorboard" if is_remote(workdir) else remote_tb
      with _writing(local_tb):
        self._tb = _SummaryEvents(local_tb)
      self._tb_upload = FolderUpload(local_tb, remote_tb if is_remote(workdir) else None)

  def attach_wandb(self, run: Any) -> None:
    """Also sends every row and completion to this ``wandb`` run (primary only)."""
    if self.enabled:
      self._wandb = run

  def _publish(self, step: int, values: dict[str, Any]) -> None:
    """``values`` of ``step`` to TensorBoard (the finite numbers) and W&B."""
    if self._tb is not None:
      with _writing(self._tb.path):
        for key, value in values.items():
          if isinstance(value, (int, float)) and math.isfinite(value):
            self._tb.add("scalar", key, value, step)
    if self._wandb is not None:
      self._wandb.log(dict(values), step=step)

  def truncate_after(self, step: int) -> None:
    """Drops rows of steps > ``step`` (a resumed run rewrites them exactly)."""
    if not self.enabled:
      return
    for file in (self._jsonl, self._completions):
      lines = file.lines
      kept = [line for line, row in parse_jsonl(lines, file.path, self.log)
              if row.get("step", 0) <= step]
      if kept != lines:
        file.replace(kept)

  def add_to_row(self, step: int, values: dict[str, Any]) -> None:
    """Adds ``values`` to the logged row of ``step`` (rewriting ``metrics.jsonl``) and
    to TensorBoard and W&B: an evaluation of a step that was logged before it ran."""
    if not self.enabled:
      return
    lines = [json.dumps({**row, **values}) if row.get("step") == step else line
             for line, row in parse_jsonl(self._jsonl.lines, self._jsonl.path, lambda m: None)]
    with _writing(self._jsonl.path):
      self._jsonl.replace(lines)
    self._publish(step, values)

  def logged_steps(self) -> set[int]:
    """The steps that have a row in ``metrics.jsonl``."""
    if not self.enabled:
      return set()
    return {int(row.get("step", 0))
            for _, row in parse_jsonl(self._jsonl.lines, self._jsonl.path, lambda m: None)}

  def flush(self) -> None:
    """Makes every written row durable (called when a checkpoint is saved)."""
    for file in (self._jsonl, self._completions) if self._jsonl is not None else ():
      with _writing(file.path):
        file.flush()
    if self._tb is not None:
      with _writing(self._tb.path):
        self._tb.flush()
      with _writing(self._tb.path.parent):
        self._tb_upload.sync()

  def write(self, row: dict[str, Any]) -> None:
    if not self.enabled:
      return
    with _writing(self._jsonl.path):
      self._jsonl.append(json.dumps(row))
    self._publish(int(row["step"]), {k: v for k, v in row.items() if k != "step"})

  def write_completions(self, step: int, records: Sequence[dict[str, Any]]) -> None:
    """Appends ``records`` (prompt, completion, reward, ...) of ``step`` to
    ``completions.jsonl`` (one line each), TensorBoard's text tab and W&B."""
    if not self.enabled or not records:
      return
    with _writing(self._completions.path):
      for record in records:
        self._completions.append(json.dumps({"step": step, **record}, ensure_ascii=False))
    if self._tb is not None:
      with _writing(self._tb.path):
        self._tb.add("text", "completions", "\n\n".join(map(_completion_markdown, records)),
                     step)
    if self._wandb is not None:
      import wandb
      columns = ["group", "prompt", "completion", "answer", "reward", "correct", "length"]
      table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in records])
      self._wandb.log({"completions": table}, step=step)

  def progress(self, row: dict[str, Any]) -> None:
    """One console line: bar, step, ETA and the key figures."""
    if not self.enabled:
      return
    step = int(row["step"])
    if self._first_step is None:
      self._first_step = step - 1
      self._start = time.perf_counter() - row.get("time_total_s", 0.0)
    done = step - self._first_step
    elapsed = time.perf_counter() - self._start
    eta = int(max((self.total_steps - step) * elapsed / max(done, 1), 0))
    width = 20
    filled = int(width * step / max(self.total_steps, 1))
    bar = "#" * filled + "." * (width - filled)
    figures = "  ".join(f"{label} {fmt.format(row[key])}" for label, key, fmt in KEY_FIGURES
                        if key in row and row[key] is not None)
    self.stream.write(f"[{bar}] step {step}/{self.total_steps}  eta {eta // 60:d}m"
                      f"{eta % 60:02d}s  {figures}\n")
    self.stream.flush()

  def log(self, message: str) -> None:
    if self.enabled:
      self.stream.write(message + "\n")
      self.stream.flush()

  def close(self) -> None:
    """Closes both files; the first failure is raised after both were tried."""
    pending = [(file.close, file.path) for file in (self._jsonl, self._completions)
               if file is not None]
    if self._tb is not None:
      tb, upload = self._tb, self._tb_upload
      pending.append((lambda: (tb.close(), upload.sync()), tb.path))
    if self._wandb is not None:
      pending.append((self._wandb.finish, "wandb"))
    self._jsonl = self._completions = self._tb = self._wandb = None
    failures = []
    for action, path in pending:
      try:
        with _writing(path):
          action()
      except MetricsWriteError as err:
        failures.append(err)
    if failures:
      raise failures[0]


def _completion_markdown(record: dict[str, Any]) -> str:
  """One completion as TensorBoard markdown (text in code blocks: no rendering)."""
  terms = ", ".join(f"{k} {v:.3g}" for k, v in record.get("terms", {}).items())
  return (f"**group {record['group']}**, reward {record['reward']:.3f} ({terms}), "
          f"correct {record['correct']}, {record['length']} tokens, answer "
          f"`{record['answer']}`\n\n    " + record["prompt"].replace("\n", "\n    ")
          + "\n\n    " + record["completion"].replace("\n", "\n    "))


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Run-level figures from the per-step rows (used by the summary and reports)."""
  if not rows:
    return {}
  mean = lambda values: sum(values) / len(rows)
  # Rows written before both straggler events were logged carry only the group one
  # (then in "straggler_rate"); their step event is unknown. Rows from before the
  # overlapped reward timing lack it (0 s).
  times = ("time_total_s", "time_rollout_s", "time_reward_s", "time_reward_overlapped_s",
           "time_learner_s")
  return {
      "steps": float(len(rows)),
      "straggler_rate": mean(r["straggler_rate"] for r in rows),
      "group_straggler_rate": mean(r.get("group_straggler_rate", r["straggler_rate"])
                                   for r in rows),
      "step_straggler_rate": mean(r.get("step_straggler", math.nan) for r in rows),
      "mean_g": mean(r["g"] for r in rows),
      "mean_log2_g": mean(r["log2_g"] for r in rows),
      **{key: sum(r.get(key, 0.0) for r in rows) for key in times},
      **{key: mean(r[key] for r in rows) for key in ("reward_mean", "accuracy",
                                                     "response_len_mean")},
      "new_compilations": float(sum(r["new_compilations"] for r in rows)),
  }


def finished_summary(workdir: Any, train: Any) -> dict | None:
  """A run's ``summary.json`` when the run is finished for the ``train`` section
  (``steps``, ``time_budget_s``): it did all ``train.steps`` steps, or spent this
  same time budget, and was not stopped by a signal (a run stopped at its last step
  may still owe its final evaluation); else None. Damaged or missing: None (the
  trainer rebuilds it)."""
  path = run_path(workdir) / "summary.json"
  try:
    summary = json.loads(path.read_text()) if path.exists() else None
  except (ValueError, OSError):
    return None
  if not isinstance(summary, dict) or summary.get("preempted"):
    return None
  budget = train.time_budget_s
  if summary.get("steps") == train.steps or (
      budget and summary.get("budget_spent") and summary.get("time_budget_s") == budget):
    return summary
  return None


def deterministic_view(row: dict[str, Any]) -> dict[str, Any]:
  """A metrics row without wall-clock fields (what exact resume must reproduce)."""
  return {k: v for k, v in row.items() if k not in _TIMING_KEYS and not k.startswith("time_")}


def load_history(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """The step rows of a run's ``metrics.jsonl`` (steps 1, 2, ...; the step-0 row of the
  evaluation before RL is ``load_evaluation_before_rl``)."""
  return [r for r in read_jsonl(run_path(workdir) / "metrics.jsonl") if r.get("step", 0) >= 1]


def load_evaluation_before_rl(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The step-0 row of ``metrics.jsonl``: the held-out evaluation before RL."""
  rows = [r for r in read_jsonl(run_path(workdir) / "metrics.jsonl") if r.get("step") == 0]
  return rows[-1] if rows else None
