"""What an AOT report was compiled for, and the stored report of the same.

A report is a function of the resolved run config, the model's ``config.json``, the
topology, the scope (``--largest_only``, ``--only``, ``--refill_slots_search``), the
compiler (jax, jaxlib, libtpu) and the code that builds the programs (the model,
sampler and learner packages). ``digest`` hashes all of them, leaving out the places a
run reads from and writes to (``model.path``, ``*_dir``, ``train.wandb_project``),
which change no program. An 8B compile takes most of an hour of a small host, so
``python -m sagc_jax.aot --reuse configs/aot`` (the pod launcher's pre-flight) reads a
stored report with the same digest instead of compiling again; any change to the
config, the model, the versions or the program code makes it compile.

A stored report is trusted only as far as it can be checked (``check_stored``):

* Checksum. Every report the tool writes carries a ``checksum`` field, the SHA-256
  of its canonical JSON without that field (``checksum()``); a stored report whose content no
  longer matches it was edited after it was written, and reusing it is refused.
  A report without one (written before checksums existed) is reused with a printed
  warning that its content cannot be verified.
* Peaks. With or without a checksum, an executable the report says fits must peak
  within the fits rule of the compile (``chips.HBM_LIMIT`` of the chip's
  per-device HBM, from ``chips.py`` for the report's topology, not the report's own
  ``hbm_gib``); one that does not, or a report that says it fits while an
  executable does not, is refused.

A file of the folder that is not a JSON object (a truncated write) is skipped with a
printed line naming it and why. Imports no JAX: the digest check answers at once (the
peak check imports the compile's threshold, and with it JAX).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any, Callable

from sagc_jax.aot.chips import HBM_LIMIT, generation_of
from sagc_jax.config import RunConfig, run_config
from sagc_jax.runtime.storage import read_json

__all__ = ["PROGRAM_SOURCES", "REPO_ROOT", "check_stored", "checksum", "digest", "find_stored",
           "model_config_path", "sizing_config", "with_checksum"]

REPO_ROOT = Path(__file__).resolve().parents[2]
# The code the compiled programs come from (a change here may change any program).
PROGRAM_SOURCES = ("sagc_jax/models", "sagc_jax/sampling", "sagc_jax/rl",
                   "sagc_jax/training/build.py")


def sizing_config(config: Any) -> RunConfig:
  """The run config as the AOT tool reads it: no weights and no data needed."""
  values = config.to_dict()              # a ConfigDict or a RunConfig
  values["model"]["require_path"] = False     # sizing needs the config.json, not the weights
  if not values["data"]["manual_dir"]:        # ... and no data
    values["data"]["manual_dir"] = "(not read by the AOT tool)"
  return run_config(values)


def model_config_path(config: RunConfig, override: str | None) -> Path:
  """The HF config.json to size: ``--model_config``, else ``model.config_json``, else
  ``model.path``/config.json. Relative paths also resolve against the repository."""
  candidates = [override] if override else []
  candidates += [config.model.config_json]
  if config.model.path:
    candidates.append(str(Path(config.model.path) / "config.json"))
  for c in candidates:
    if not c:
      continue
    for p in (Path(c), REPO_ROOT / c):
      if p.is_file():
        return p
    raise ValueError(f"model config {c!r} not found (from --model_config, model.config_json "
                     "or model.path)")
  raise ValueError("no model config: pass --model_config=configs/models/NAME.json or set "
                   "model.config_json / model.path")


def _compiled_fields(values: dict, prefix: str = "") -> dict:
  """``values`` without the fields that name where a run reads or writes."""
  out = {}
  for key, value in values.items():
    name = prefix + key
    if isinstance(value, dict):
      if value or name != "controller.options":   # a user kind's settings: none compile
        out[key] = _compiled_fields(value, name + ".")
    elif not (key.endswith("_dir") or name in ("model.path", "model.require_path",
                                                "train.wandb_project")):
      out[key] = value
  return out


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _sources_digest() -> str:
  h = hashlib.sha256()
  for source in PROGRAM_SOURCES:
    root = REPO_ROOT / source
    for path in sorted([root] if root.is_file() else root.rglob("*.py")):
      h.update(str(path.relative_to(REPO_ROOT)).encode())
      h.update(path.read_bytes())
  return h.hexdigest()


def digest(config: Any, topology: str, *, model_config: str | None = None,
           largest_only: bool = False, only: str | None = None,
           refill_slots_search: tuple[int, ...] = ()) -> str:
  """SHA-256 of everything a report depends on (module docstring)."""
  resolved = sizing_config(config)
  key = dict(
      config=_compiled_fields(resolved.to_dict()),
      model_config=hashlib.sha256(model_config_path(resolved, model_config)
                                  .read_bytes()).hexdigest(),
      topology=topology, largest_only=bool(largest_only), only=only,
      refill_slots_search=[int(s) for s in refill_slots_search],
      versions={p: _version(p) for p in ("jax", "jaxlib", "libtpu")},
      program_sources=_sources_digest())
  return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def find_stored(folder: str | Path, key: str,
                log: Callable[[str], None] = print) -> Path | None:
  """The report under ``folder`` whose ``digest`` is ``key`` (None: compile). A file
  that is not a JSON object is skipped, with a line to ``log`` naming it and why."""
  for path in sorted(Path(folder).glob("*.json")):
    try:
      stored = read_json(path)
    except ValueError as err:
      log(f"skipping {err}")
      continue
    if not isinstance(stored, dict):
      log(f"skipping {path}: not a JSON object")
    elif stored.get("digest") == key:
      return path
  return None


def checksum(report: dict) -> str:
  """SHA-256 of ``report``'s canonical JSON (sorted keys), its ``checksum`` left out."""
  body = {k: v for k, v in report.items() if k != "checksum"}
  return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                        .encode()).hexdigest()


def with_checksum(report: dict) -> dict:
  """``report`` as written: its content as JSON reads it back, and its ``checksum``."""
  body = json.loads(json.dumps({k: v for k, v in report.items() if k != "checksum"}))
  return {**body, "checksum": checksum(body)}


def check_stored(path: str | Path, report: dict, log: Callable[[str], None] = print) -> None:
  """Refuses a stored ``report`` edited after it was written, or whose verdict its
  peaks contradict (module docstring); warns of one without a checksum."""
  actual = checksum(report)
  if "checksum" not in report:
    log(f"warning: {path} has no checksum (written before checksums): its content cannot "
        "be verified; only its peaks are checked against the chip's HBM")
  elif report["checksum"] != actual:
    raise ValueError(f"stored report {path}: its content was edited after it was written "
                     f"(checksum {str(report['checksum'])[:12]} recorded, "
                     f"{actual[:12]} computed); delete it or compile without --reuse")
  chip, chips = generation_of(report["topology"])
  chip = chip.per_device(max(int(report.get("devices", chips)) // chips, 1))
  for e in report["executables"]:
    peak = e["peak_gib"]
    if e["fits"] and (peak is None or not peak <= HBM_LIMIT * chip.hbm_gib):
      why = ("failed to compile" if peak is None else f"peaks at {peak:.2f} GiB, over "
             f"{HBM_LIMIT:.0%} of the {chip.name}'s {chip.hbm_gib:g} GiB HBM per device")
      raise ValueError(f"stored report {path}: {e['name']} says it fits but {why}; delete it "
                       "or compile without --reuse")
  unfit = [e["name"] for e in report["executables"] if not e["fits"] and not e.get("probe")]
  if report["fits"] and unfit:
    raise ValueError(f"stored report {path} says it fits but {unfit[0]} does not; delete it "
                     "or compile without --reuse")
