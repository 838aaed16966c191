"""The Weights & Biases run of a training run (``train.wandb_project``).

Its id is drawn at the first start and kept in ``<workdir>/wandb_run_id``, so a resumed
run continues the same W&B run (``resume="allow"``) and a fresh run in a reused path
starts a new one. W&B keeps the first value logged at a step: rows of steps redone after
a crash keep their first version there (``metrics.jsonl`` holds the redone ones). W&B
installed but not logged in (no ``WANDB_API_KEY``, no ``wandb login``; off a terminal,
where wandb cannot ask) logs offline for a later ``wandb sync``, and says so, instead of
failing after minutes of start-up.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable

__all__ = ["start_wandb"]


def start_wandb(config: Any, workdir: Any, local_dir: Path, *, resumed: bool,
                log: Callable[[str], None]) -> Any:
  """The W&B run of ``workdir`` (``resumed``: continue the id kept there)."""
  import wandb

  id_file = workdir / "wandb_run_id"
  if resumed and id_file.exists():
    run_id = id_file.read_text().strip()
  else:
    run_id = uuid.uuid4().hex[:16]
    id_file.write_text(run_id + "\n")
  options = dict(project=config.train.wandb_project, id=run_id, resume="allow",
                 name=workdir.name, config=config.to_dict(), dir=str(local_dir))
  try:
    return wandb.init(**options)
  except wandb.errors.UsageError as err:
    if "api key" not in str(err).lower():
      raise
  run = wandb.init(mode="offline", **options)
  folder = Path(run.dir).parent           # run.dir is the run folder's files/
  log(f"W&B: not logged in (no API key), so train.wandb_project="
      f"{config.train.wandb_project!r} logs offline to {folder}; upload it later with "
      f"`wandb sync {folder}` once logged in (`wandb login`)")
  return run
