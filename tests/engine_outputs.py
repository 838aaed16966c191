"""What a user sees from the replay engine's commands, in a form that can be saved and
compared: ``simulate`` on its default config and on ``configs/simulate_prompts.py``
(with their claims tables), ``simulate --trace`` on the committed traces under both
cost models, and ``calibrate --trace``.

Only timings are masked (the seconds a simulation took, the controllers' microseconds
per step); every other number is compared exactly. A per-step column of a simulation
(1000 steps per arm) is saved as its length and SHA-256 of its JSON, the summaries in
full.

``python tests/engine_outputs.py [NAME ...]`` rewrites ``tests/fixtures/engine/`` (or
only the named cases' folders) from the current code; ``test_engine_outputs`` checks
the code against it.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "engine"
TRACES = "configs/traces/"
BEFORE = TRACES + "smollm2_word_problems_before_rl.jsonl"
AFTER = TRACES + "smollm2_word_problems_after_rl.jsonl"
AOT = "configs/aot/llama3_2_3b_16k_v5e_4x4.json"

# name -> (module, argv with {out} for the output folder, files written under {out}).
CASES = {
    "simulate_default": ("sagc_jax.simulate", ["--out={out}/results.json", "--claims_seeds=2"],
                         ["results.json", "claims.md"]),
    "simulate_prompts": ("sagc_jax.simulate", ["--config=configs/simulate_prompts.py",
                                               "--out={out}/results.json", "--claims_seeds=2"],
                         ["results.json", "claims.md"]),
    "trace_aot_drift": ("sagc_jax.simulate", [f"--trace={BEFORE},{AFTER}", f"--cost=aot:{AOT}",
                                              "--replicates=3", "--steps=60",
                                              "--out={out}/results.json"],
                        ["results.json", "results.md"]),
    "trace_cpu_dapo": ("sagc_jax.simulate", [f"--trace={AFTER}", "--cost=cpu",
                                             "--algorithms=dapo", "--taus=1.8,2.5",
                                             "--delta=0.2", "--replicates=3", "--steps=40",
                                             "--out={out}/results.json"],
                       ["results.json", "results.md"]),
    "calibrate": ("sagc_jax.calibrate", [f"--trace={AFTER}", "--out={out}"], ["report.json"]),
}
_TIMED_KEYS = {"simulator_seconds", "controller_us", "controller_s"}
_TIMED_COLUMNS = ("ctrl_us", "controller µs / step")


def _mask_json(value, depth=0):
  """The JSON without timed keys; per-step lists (a simulation's ``traces``) as digests."""
  if isinstance(value, dict):
    return {k: _mask_json(v, depth + 1) for k, v in value.items() if k not in _TIMED_KEYS}
  if isinstance(value, list) and len(value) > 100:
    text = json.dumps(value)
    return {"length": len(value), "sha256": hashlib.sha256(text.encode()).hexdigest()}
  if isinstance(value, list):
    return [_mask_json(v, depth + 1) for v in value]
  return value


def _mask_text(text: str) -> str:
  """Text with a simulation's own seconds and the cells of a timed column ('ctrl_us' of
  a printed table, 'controller µs / step' of a markdown one) replaced by 'T'."""
  text = re.sub(r"\(\d+\.\d+ s\)", "(T s)", text)
  lines, column, markdown = [], None, False
  for line in text.splitlines():
    markdown = line.startswith("|")
    cells = line.split("|") if markdown else line.split(" ")
    if any(name in line for name in _TIMED_COLUMNS):
      column = next(i for i, c in enumerate(cells) if any(n in c for n in _TIMED_COLUMNS))
    elif markdown and column is not None and not set(line) <= set("-|"):
      cells[column] = " T "
      line = "|".join(cells)
    elif not markdown and column is not None and re.match(r"(static_G|sagc|prompt_|per_|signal_rate|oracle)", line):
      line = re.sub(r"\s*\S+$", " T", line)
    elif not markdown and not set(line) <= set("-"):
      column = None
    lines.append(line)
  return "\n".join(lines) + "\n"


def run_case(name: str) -> dict[str, str]:
  """The case's masked outputs: ``stdout`` and each of its files, as text."""
  module, argv, files = CASES[name]
  with tempfile.TemporaryDirectory() as folder:
    args = [a.replace("{out}", folder) for a in argv]
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          capture_output=True, text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    out = {"stdout.txt": _mask_text(proc.stdout.replace(folder, "OUT"))}
    for file in files:
      text = (pathlib.Path(folder) / file).read_text().replace(folder, "OUT")
      if file.endswith(".json"):
        out[file] = json.dumps(_mask_json(json.loads(text)), indent=1, sort_keys=True) + "\n"
      else:
        out[file] = _mask_text(text)
  return out


def main(names: list[str]) -> None:
  unknown = sorted(set(names) - set(CASES))
  if unknown:
    raise SystemExit(f"error: unknown case(s) {unknown}; the cases: {sorted(CASES)}")
  for name in names or CASES:
    target = FIXTURES / name
    target.mkdir(parents=True, exist_ok=True)
    for file, text in run_case(name).items():
      (target / file).write_text(text)
    print(f"wrote {target}")


if __name__ == "__main__":
  main(sys.argv[1:])
