"""Bad inputs that a probe of the tools found let through, or answered without naming
what was wrong: each is now refused naming the setting or the file.

Why a file of its own: each test pins one defect of that probe where it was fixed (a
check, a reader, a writer). The command lines' exact one-line messages are cases of
``test_cli_errors``' snapshot (``train.time_budget_s_inf``, ``cli.config_no_get_config``,
``cli.config_missing``, ``simulate.learning_damaged``, ``simulate.learning_no_pairs``,
``calibrate.signal_checks_damaged``).
"""

from __future__ import annotations

import errno
import json
import math
import re
import textwrap
from pathlib import Path

import pytest

from sagc_jax.base import checks
from sagc_jax.config import run_config, tiny_cpu_config

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- inf and nan settings
@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize("key", [
    "train.time_budget_s", "train.stop_grace_s", "train.metrics_sync_secs", "sft.lr",
    "model.init_std", "reward.format_weight", "reward.timeout_s", "learner.kl_coef",
    "learner.clip_high", "controller.cell_prior_strength"])   # a key another kind reads
def test_a_non_finite_setting_is_refused_by_name(key, value):
  """inf passed every check of these keys: ``train.time_budget_s=inf`` ran with no
  evaluation point ever reached and wrote ``Infinity`` into config.json."""
  config = tiny_cpu_config()
  section, name = key.split(".")
  with config.unlocked():
    config[section][name] = value
  with pytest.raises(ValueError, match=rf"^{key}={value!r} must be"):
    run_config(config)


def test_a_simulator_setting_must_be_finite_too():
  """``checks.number_in`` serves the simulator's ``sim`` / ``pool`` / ``cost`` keys."""
  with pytest.raises(ValueError, match=r"^sim\.sigma_start=inf must be a finite number$"):
    checks.number_in({"sim": {"sigma_start": math.inf}}, "sim.sigma_start", 0.0)
  with pytest.raises(ValueError, match=r"^sim\.sigma_start=-1 must be in \[0\.0, inf\)$"):
    checks.number_in({"sim": {"sigma_start": -1}}, "sim.sigma_start", 0.0)


def test_config_json_is_standard_json(tmp_path):
  """A value no check refused is an error, not ``Infinity`` in config.json."""
  from sagc_jax.training.run_state import write_run_config

  class Config:                          # what write_run_config reads of a RunConfig
    def to_dict(self):
      return {"train": {"time_budget_s": math.inf}}
  with pytest.raises(ValueError, match="JSON compliant"):
    write_run_config(Config(), tmp_path, resuming=False, log=print)
  assert not (tmp_path / "config.json").exists()


# ------------------------------------------------------------------ damaged JSON files
def _arm_config(folder):
  from sagc_jax.experiments.arm_process import read_arm_config
  return read_arm_config(folder)


def _aot_reports(folder):
  from sagc_jax.aot.sizing_table import table
  return table(folder)


def _tiny_model_marker(folder):
  from sagc_jax.training.warm_start import starting_folder
  (folder / "init_model" / "model.safetensors").write_bytes(b"")
  return starting_folder(run_config(tiny_cpu_config()), folder)


@pytest.mark.parametrize("read, name", [
    (_arm_config, "arm_config.json"), (_aot_reports, "report.json"),
    (_tiny_model_marker, "init_model/sagc_tiny_model.json")])
def test_a_damaged_json_file_is_named(tmp_path, read, name):
  """json's own "Expecting value: line 1 column 29" named no file."""
  (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
  (tmp_path / name).write_text('{"pairs": ')
  with pytest.raises(ValueError, match=rf"^{tmp_path / name} is not valid JSON \(Expecting"):
    read(tmp_path)


def test_a_per_hour_file_without_the_pairs_is_refused_naming_the_key(tmp_path):
  """``simulate --learning`` ended in ``KeyError: 'pairs'``, minutes into the replay."""
  from sagc_jax.experiments.signals import read_per_hour

  path = tmp_path / "per_hour.json"
  pair = {"first": "grpo_sagc", "second": "grpo_static4"}
  for body, missing in [({}, "pairs"), ({"pairs": {"grpo": {}}}, "pairs.grpo.pairs"),
                        ({"pairs": {"grpo": {"pairs": [pair]}}},
                         "pairs.grpo.pairs[0].mean_accuracy_over_h")]:
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=rf"^{path} lacks the key '{re.escape(missing)}'"):
      read_per_hour(path)
  whole = {"pairs": {"grpo": {"pairs": [{**pair, "mean_accuracy_over_h": {"mean": None}}]}}}
  path.write_text(json.dumps(whole))       # an unresolved pair's mean is null
  assert read_per_hour(path) == whole


# --------------------------------------------------------------------------- full disk
def test_a_run_file_that_cannot_be_written_is_named(tmp_path, monkeypatch):
  """A write that fails after the open (a full disk) raised "[Errno 28] No space left
  on device", naming no file: Python's error for it has none."""
  from sagc_jax.training.run_state import write_run_config

  def full_disk(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(Path, "write_text", full_disk)
  with pytest.raises(OSError) as raised:
    write_run_config(run_config(tiny_cpu_config()), tmp_path, resuming=False,
                     log=lambda m: None)
  assert raised.value.errno == errno.ENOSPC
  assert raised.value.filename == str(tmp_path / "config.json")


def test_a_full_disk_while_writing_the_tiny_model_is_an_os_error_leaving_no_model(
    tmp_path, monkeypatch):
  """safetensors reports a full disk as its own error type (a traceback at the command
  line), and the half-written model.safetensors was taken for a built model later."""
  from safetensors import SafetensorError

  from sagc_jax.models import hf_io
  from sagc_jax.training.warm_start import starting_folder

  def full_disk(tensors, filename, metadata=None):
    Path(filename).write_bytes(b"\0" * 100)
    raise SafetensorError("Error while serializing: I/O error: No space left on device "
                          "(os error 28)")
  monkeypatch.setattr(hf_io, "save_file", full_disk)
  with pytest.raises(OSError) as raised:
    starting_folder(run_config(tiny_cpu_config()), tmp_path)
  assert raised.value.errno == errno.ENOSPC
  assert raised.value.filename == str(tmp_path / "init_model" / "model.safetensors")
  assert not (tmp_path / "init_model").exists()


# One process per start: JAX opens its persistent cache once per process (a forked child
# of the warm command server, ``commands``, which imports jax but compiles nothing).
# ``python -m cache_run CACHE MODE``; "full" makes every cache entry's write stop
# halfway with ENOSPC, as a full disk does.
_CACHE_RUN = """
import errno, sys, types
sys.path.insert(0, {repo!r})
import jax, numpy as np
from jax._src import path as jax_path
from sagc_jax.training.inputs import configure_compilation_cache

cache, mode = sys.argv[1:]
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
train = types.SimpleNamespace(compilation_cache=True, compilation_cache_dir="")
configure_compilation_cache(types.SimpleNamespace(train=train), cache)
if mode == "full":
  kind = type(jax_path.Path(cache))
  write = kind.write_bytes

  def full_disk(self, data):
    write(self, data[:len(data) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")
  kind.write_bytes = full_disk

def double(x):
  return 2 * x

try:
  jax.jit(double)(np.arange(3.0)).block_until_ready()     # the one program compiled
except OSError as err:
  print(f"error: {{err}}")
  sys.exit(3)
"""


def _start(commands, cache: Path, mode: str):
  """A new JAX process (a forked child) started on ``cache``: its exit status, stdout and
  stderr."""
  script = cache.parent / "cache_run.py"
  script.write_text(textwrap.dedent(_CACHE_RUN.format(repo=str(REPO))))
  return commands.run("cache_run", str(cache), mode, cwd=cache.parent)


def test_a_compilation_cache_entry_that_cannot_be_written_is_removed_in_one_error(
    commands, tmp_path):
  """A full disk: JAX warned (two lines per program) and left the truncated entry,
  and the run went on towards its next failed write."""
  cache = tmp_path / "jax_cache"
  proc = _start(commands, cache, "full")
  assert proc.returncode == 3, proc.stdout + proc.stderr
  assert proc.stdout.startswith(f"error: no space left on the disk of the compilation cache "
                                f"{cache}: the compiled program jit_double could not be kept")
  assert "Error writing persistent compilation cache" not in proc.stderr
  assert list(cache.iterdir()) == []


def test_a_truncated_compilation_cache_entry_is_replaced_once(commands, tmp_path):
  """An entry a killed process (or an older version) left half-written: JAX warned on
  every later start and never replaced it. The next start replaces it; the one after
  reads it without a warning."""
  cache = tmp_path / "jax_cache"
  assert _start(commands, cache, "ok").returncode == 0
  [entry] = cache.iterdir()
  whole = entry.read_bytes()
  entry.write_bytes(whole[:len(whole) // 2])
  proc = _start(commands, cache, "ok")
  assert proc.returncode == 0, proc.stderr
  assert "Error reading persistent compilation cache entry for 'jit_double'" in proc.stderr
  assert entry.stat().st_size == len(whole)
  again = _start(commands, cache, "ok")
  assert again.returncode == 0 and "persistent compilation cache" not in again.stderr, (
      again.stderr)


def test_a_full_compilation_cache_disk_ends_the_train_command_in_one_line(commands, tmp_path):
  """The train command whose compilation cache is on a tmpfs with 16 KiB free (the
  workdir elsewhere; four pages: the entries of its first small programs, so that it
  fails seconds into its start-up): one ``error:`` line naming the cache folder (not
  JAX's warnings, two lines a program, and the next failed write's error), exit 2, no
  entry left truncated. Needs root and tmpfs (skipped elsewhere)."""
  from jax._src.compilation_cache import decompress_executable
  from small_disk import tmpfs, train

  with tmpfs(tmp_path / "small", "2m", free=16 << 10) as small:
    proc = train(commands, tmp_path, tmp_path / "run", tmp_path / "cache",
                 "c.train.update(dict(steps=1, eval_every=1))",
                 f"c.train.compilation_cache_dir = {str(small / 'jax_cache')!r}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: no space left on the disk of the compilation "
                                  f"cache {small / 'jax_cache'}: "), proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    for entry in (small / "jax_cache").glob("*-cache"):
      decompress_executable(entry.read_bytes())         # whole: a truncated one raises
