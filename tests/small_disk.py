"""A small tmpfs and the train command on a tiny task, for the tests of a full disk.

Why: a full disk is a kernel condition (ENOSPC at whichever write comes first) that
only a small filesystem gives end to end; mounting one needs root, so the tests that
use it skip elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, free: int) -> Iterator[Path]:
  """``folder`` as a fresh tmpfs of ``size`` ('12m') with ``free`` bytes left free,
  unmounted after the block; the test skips where it cannot be mounted (needs root)."""
  folder.mkdir()
  if os.geteuid() != 0 or subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
      capture_output=True).returncode:
    pytest.skip("cannot mount a tmpfs here (needs root)")
  try:
    (folder / "filler").write_bytes(b"\0" * (shutil.disk_usage(folder).free - free))
    yield folder
  finally:
    subprocess.run(["umount", str(folder)], check=False)


def train(commands, folder: Path, workdir: Path, cache: Path, *lines: str):
  """``python -m sagc_jax.train`` (in ``commands``, the warm command server) on 100
  one-step problems with a 2-step warm start (kept in ``cache``), with ``lines`` added
  to the config file's ``get_config`` (written in ``folder``): its exit status, stdout
  and stderr."""
  config_file = folder / "cfg.py"
  config_file.write_text("\n".join([
      "from sagc_jax.config import tiny_cpu_config", "def get_config():",
      "  c = tiny_cpu_config()",
      "  c.data.synthetic.update(dict(num_train=100, num_test=20, max_ops=1))",
      "  c.sft.update(dict(steps=2, batch_size=8, seq_bucket=48, warmup_steps=1))",
      *(f"  {line}" for line in lines), "  return c", ""]))
  return commands.run("sagc_jax.train", f"--config={config_file}", f"--workdir={workdir}",
                      cwd=REPO, env={"SAGC_CACHE_DIR": str(cache)})
