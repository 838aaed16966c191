"""Snapshots the StableHLO of every program a short training run compiles, and compares
two snapshots: evidence that a refactor of the Python internals left the compiled
programs unchanged.

  python tests/stablehlo_snapshot.py --out A.json [--config configs/tiny_cpu.py] \\
      [--config.KEY=VALUE ...]
  python tests/stablehlo_snapshot.py --all DIR [--config ...] [--config.KEY=VALUE ...]
  python tests/stablehlo_snapshot.py --compare A.json B.json     (or two --all folders)

``--out`` runs the public command ``python -m sagc_jax.train`` once (1 RL step, 2
supervised steps, in a temporary workdir and cache folder) with JAX's own IR dump on
(``JAX_DUMP_IR_TO``): JAX writes each module it hands to XLA, so the snapshot holds
what the warm-up compiles (the samplers, learner and eval programs) and the few small
programs of start-up and the supervised stage, without depending on how the library
builds them. It writes ``A.json`` (per program: sha256, the argument and result types
of ``main``) and the texts in ``A_hlo/`` (for a diff). ``--all DIR`` takes the three
sampler configurations one after another: ``DIR/fused.json`` (``rollout.decode_segment
=0``), ``DIR/segmented.json`` (the default) and ``DIR/refill.json``
(``rollout.refill_slots=16``). Extra ``--config.KEY=VALUE`` flags go to every run, after
the tool's own.

The text is hashed without source locations (``loc(...)`` annotations and ``#loc``
lines: file and line numbers, which a refactor changes legitimately); JAX is also asked
not to print them (``JAX_INCLUDE_DEBUG_INFO_IN_DUMPS=false``). A program is named by its
module (``jit_<function>``); when a name has several programs (several shapes) they
are ``name#0``, ``name#1``, ... in the order of their ``main`` signature (then of their
hash): the compile order is not stable, XLA compiles on a thread pool.

``--compare`` prints the programs that are equal, changed (with the start of a diff,
and a note when only JAX's result/argument names differ, i.e. an output pytree was
renamed), only in A and only in B; it exits 1 if any differ.
"""

import argparse
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "configs/tiny_cpu.py"
# The smallest run that still warms up every program: the warm-up does not depend on
# the number of steps. sft.warmup_steps must stay below sft.steps.
RUN_FLAGS = ["--config.train.steps=1", "--config.sft.steps=2", "--config.sft.warmup_steps=0"]
SAMPLERS = {
  "fused": ["--config.rollout.decode_segment=0"],
  "segmented": [],
  "refill": ["--config.rollout.refill_slots=16"],
}
DIFF_LINES = 40     # lines of diff shown per changed program


def strip_locations(text: str) -> str:
  """``text`` without ``#loc`` lines and ``loc(...)`` annotations (nested, quoted)."""
  lines = [line for line in text.splitlines() if not line.startswith("#loc")]
  text = "\n".join(lines) + "\n"
  out, i = [], 0
  while True:
    m = re.compile(r"(?<![\w.#])loc\(").search(text, i)
    if m is None:
      out.append(text[i:])
      break
    start = m.start()
    while start > i and text[start - 1] == " ":
      start -= 1
    out.append(text[i:start])
    j, depth, quoted = m.end(), 1, False
    while depth:
      c = text[j]
      if quoted:
        if c == "\\":
          j += 1
        elif c == '"':
          quoted = False
      elif c == '"':
        quoted = True
      elif c == "(":
        depth += 1
      elif c == ")":
        depth -= 1
      j += 1
    i = j
  return "".join(out)


def strip_names(text: str) -> str:
  """Also without JAX's pytree names of arguments and results (``jax.result_info``)."""
  return re.sub(r'jax\.(result|arg)_info = "(?:[^"\\]|\\.)*"', "", text)


def signature(text: str) -> str:
  """The types of ``main``'s arguments and results: a program's shapes."""
  m = re.search(r"func\.func public @main\((.*)$", text, re.M)
  return " ".join(re.findall(r"tensor<[^>]*>|!stablehlo\.token", m.group(1))) if m else ""


def sha(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def snapshot(out: Path, config: str, extra: list[str]) -> dict:
  """Runs the trainer once with the IR dump on; writes ``out`` and ``<out stem>_hlo/``."""
  with tempfile.TemporaryDirectory(prefix="hlo_snapshot_") as tmp:
    tmp = Path(tmp)
    cmd = [sys.executable, "-m", "sagc_jax.train", "--config", config,
           "--workdir", str(tmp / "workdir"), *RUN_FLAGS, *extra]
    env = {**os.environ, "JAX_DUMP_IR_TO": str(tmp / "dump"), "JAX_DUMP_IR_MODES": "stablehlo",
           "JAX_INCLUDE_DEBUG_INFO_IN_DUMPS": "false", "SAGC_CACHE_DIR": str(tmp / "cache"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    print(" ".join(cmd), flush=True)
    t = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
      sys.exit(f"the run failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    by_name: dict[str, list[tuple[str, str, str]]] = {}
    for f in sorted((tmp / "dump").glob("*_compile.mlir")):
      text = strip_locations(f.read_text())
      name = re.match(r"jax_ir\d+_(.*)_compile\.mlir$", f.name).group(1)
      by_name.setdefault(name, []).append((signature(text), sha(text), text))
  programs, texts = {}, {}
  for name, items in sorted(by_name.items()):
    items.sort(key=lambda item: item[:2])
    for index, (sig, digest, text) in enumerate(items):
      key = name if len(items) == 1 else f"{name}#{index}"
      programs[key] = {"sha256": digest, "sha256_without_names": sha(strip_names(text)),
                       "signature": sig}
      texts[key] = text
  folder = out.with_name(out.stem + "_hlo")
  folder.mkdir(parents=True, exist_ok=True)
  for old in folder.glob("*.mlir"):
    old.unlink()
  for key, text in texts.items():
    (folder / f"{key}.mlir").write_text(text)
  import jax
  result = {"command": cmd[1:4] + ["TMP"] + cmd[5:], "jax": jax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "texts": folder.name,
            "programs": programs}
  out.write_text(json.dumps(result, indent=1))
  print(f"{len(programs)} programs in {time.time() - t:.0f} s -> {out} (texts in {folder})",
        flush=True)
  return result


def compare(a: Path, b: Path) -> bool:
  """Prints the differences of two snapshots; True if every program is equal."""
  left, right = json.loads(a.read_text())["programs"], json.loads(b.read_text())["programs"]
  equal = [k for k in left if k in right and left[k]["sha256"] == right[k]["sha256"]]
  changed = [k for k in left if k in right and left[k]["sha256"] != right[k]["sha256"]]
  only_a = [k for k in left if k not in right]
  only_b = [k for k in right if k not in left]
  print(f"{a} vs {b}: {len(equal)} equal, {len(changed)} changed, {len(only_a)} only in A, "
        f"{len(only_b)} only in B")
  for key in changed:
    texts = [p.with_name(json.loads(p.read_text())["texts"]) / f"{key}.mlir" for p in (a, b)]
    found = all(t.exists() for t in texts)
    names = (strip_names(texts[0].read_text()) == strip_names(texts[1].read_text()) if found
             else left[key]["sha256_without_names"] == right[key]["sha256_without_names"])
    print(f"  changed: {key}" + ("  (only result/argument names differ)" if names else ""))
    if found:
      diff = list(difflib.unified_diff(texts[0].read_text().splitlines(),
                                       texts[1].read_text().splitlines(),
                                       str(texts[0]), str(texts[1]), n=1, lineterm=""))
      for line in diff[:DIFF_LINES]:
        print(f"    {line[:200]}")
      if len(diff) > DIFF_LINES:
        print(f"    ... ({len(diff) - DIFF_LINES} more lines: diff -u {texts[0]} {texts[1]})")
  for key in only_a:
    print(f"  only in A: {key}  {left[key]['signature'][:150]}")
  for key in only_b:
    print(f"  only in B: {key}  {right[key]['signature'][:150]}")
  return not (changed or only_a or only_b)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument("--out", type=Path, help="snapshot of one run: FILE.json (+ FILE_hlo/)")
  group.add_argument("--all", type=Path, metavar="DIR",
                     help="snapshots of the three samplers: DIR/{" + ",".join(SAMPLERS) + "}.json")
  group.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"),
                     help="two snapshots (files), or two --all folders")
  parser.add_argument("--config", default=DEFAULT_CONFIG)
  args, extra = parser.parse_known_args()
  unknown = [flag for flag in extra if not flag.startswith("--config.")]
  if unknown:
    parser.error(f"unknown arguments {unknown} (only --config.KEY=VALUE pass through)")
  if args.out:
    snapshot(args.out, args.config, extra)
  elif args.all:
    for name, flags in SAMPLERS.items():
      snapshot(args.all / f"{name}.json", args.config, flags + extra)
  else:
    a, b = args.compare
    pairs = ([(a / f"{n}.json", b / f"{n}.json") for n in SAMPLERS] if a.is_dir() else [(a, b)])
    same = [compare(x, y) for x, y in pairs]
    sys.exit(0 if all(same) else 1)


if __name__ == "__main__":
  main()
