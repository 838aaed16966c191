"""Dispatcher: ``python -m sagc_jax.bench {controller,heavy_tail,learner,overlap,sampler}
[--out F]``.

``heavy_tail`` is the sampler benchmark's heavy-tailed-rollouts part alone (refill vs
sub-calls vs fused, ``sagc_jax/bench/heavy_tail.py``). ``overlap`` times a round
(sampling + scoring) on the same rows with ``rollout.overlap_rewards`` off and on
(``sagc_jax/bench/overlap.py``).

``heavy_tail --model MODEL`` runs the scenario on a real model's weights (forced
lengths from 128 prompts' greedy continuations, ``--max_new_tokens`` default 256).

``sampler`` and ``learner`` also run on a real pretrained model with ``--model MODEL``
(a local HF folder, a ``.gguf`` file or ``smollm2-135m-instruct``), on natural
rollouts of chat prompts: ``--rows`` (default 8,32,64; the learner trains at the
largest) and ``--max_new_tokens`` (default 512); ``--steps`` is then the number of
timed calls (sampler, default 1) or timed steps (learner, default 2). See
``sagc_jax/bench/real_model.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import importlib

from sagc_jax.bench import defaults
from sagc_jax.bench.peer import TUNIX_ROPE_THETA

# Imported only when run (they import JAX): --help answers at once.
BENCHMARKS = ("controller", "heavy_tail", "learner", "overlap", "sampler")
# With --model: the (run, report) functions of the real-model benchmark.
REAL_MODEL = {"learner": ("run_learner", "report_learner"),
              "sampler": ("run_sampler", "report_sampler")}
# heavy_tail --model: greedy continuations of this many prompts to force lengths from,
# and the response cap (a real model decodes far slower than the tiny one).
REAL_MODEL_POOL = 128
REAL_MODEL_HEAVY_TAIL_MAX_NEW = 256


def _rows(text: str) -> tuple[int, ...]:
  try:
    rows = tuple(int(x) for x in text.split(","))
  except ValueError:
    rows = ()
  if not rows or any(r <= 0 or r % defaults.GROUP for r in rows):
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a comma list of positive multiples of G={defaults.GROUP} "
        "(e.g. 8,32,64)")
  return rows


def _positive(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value <= 0:
    raise argparse.ArgumentTypeError(f"{text!r} is not a positive int")
  return value


def main(argv: list[str] | None = None) -> int:
  from sagc_jax.runtime.platform import prepare_process

  prepare_process()             # before JAX starts: no TPU probe on hosts without one
  parser = argparse.ArgumentParser(prog="python -m sagc_jax.bench", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("name", choices=BENCHMARKS, help="which benchmark to run")
  parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
  parser.add_argument("--steps", type=int, default=None, help="override the number of timed steps")
  parser.add_argument("--model", default=None, metavar="MODEL",
                      help="sampler/learner on a real model: a local HF folder, a .gguf file "
                      "or smollm2-135m-instruct (default: the random-weight benchmarks)")
  parser.add_argument("--rows", type=_rows, default=None,
                      help=f"with --model: row counts, comma list (default "
                      f"{','.join(map(str, defaults.DEFAULT_ROWS))})")
  parser.add_argument("--peer_python", default=None, metavar="PYTHON",
                      help="heavy_tail, learner: also run Tunix's sampler (train step) on the "
                      "same rows and weights, in this Python (a venv with google-tunix: "
                      "docs/benchmarks.md)")
  parser.add_argument("--max_new_tokens", type=_positive, default=None,
                      help=f"with --model: response cap (default "
                      f"{defaults.DEFAULT_MAX_NEW_TOKENS})")
  args = parser.parse_args(argv)
  module = importlib.import_module(f"sagc_jax.bench.{args.name}")
  kwargs = {} if args.steps is None else {"steps": args.steps}
  if args.steps is not None and args.steps <= 0:
    parser.error(f"--steps={args.steps} must be positive")
  if args.peer_python is not None:
    if args.name not in ("heavy_tail", "learner"):
      parser.error("--peer_python: only the heavy_tail and learner benchmarks have a Tunix "
                   "column")
    if args.name == "learner" and args.model is not None:
      parser.error("--peer_python: the learner's Tunix column runs on the tiny model (without "
                   "--model)")
    if not Path(args.peer_python).is_file():
      parser.error(f"--peer_python={args.peer_python!r}: no such file")
    kwargs["peer_python"] = args.peer_python
  if args.model is None:
    for flag in ("rows", "max_new_tokens"):
      if getattr(args, flag) is not None:
        parser.error(f"--{flag} needs --model (it sets the real-model benchmark)")
    run, report = module.run, module.report
  elif args.name == "heavy_tail":
    if args.rows is not None:
      parser.error("--rows: the heavy-tail scenario has 64 rows")
    real_model = importlib.import_module("sagc_jax.bench.real_model")
    try:
      folder = real_model.resolve_model(args.model)
    except (ValueError, OSError) as err:
      parser.error(f"--model={args.model!r}: {err}")
    run, report = module.run, module.report
    if args.peer_python is not None:     # Tunix's Llama applies RoPE theta 1e6 whatever
      folder = real_model.with_rope_theta(folder, TUNIX_ROPE_THETA)  # the config
      kwargs["peer_folder"] = str(folder)
    loaded = real_model.load_model(folder)
    kwargs.update(model=loaded.model, cfg=loaded.cfg, model_info=loaded.describe(args.model),
                  pool=REAL_MODEL_POOL,
                  max_new_tokens=args.max_new_tokens or REAL_MODEL_HEAVY_TAIL_MAX_NEW)
  else:
    if args.name not in REAL_MODEL:
      parser.error(f"--model={args.model!r}: the {args.name} benchmark has no real-model "
                   f"option (only {', '.join(sorted(REAL_MODEL) + ['heavy_tail'])})")
    real_model = importlib.import_module("sagc_jax.bench.real_model")
    try:
      folder = real_model.resolve_model(args.model)
    except (ValueError, OSError) as err:
      parser.error(f"--model={args.model!r}: {err}")
    run, report = (getattr(real_model, name) for name in REAL_MODEL[args.name])
    kwargs.update(folder=folder, source=args.model,
                  rows=args.rows or defaults.DEFAULT_ROWS,
                  max_new_tokens=args.max_new_tokens or defaults.DEFAULT_MAX_NEW_TOKENS)
  results = run(**kwargs)
  results["benchmark"] = args.name
  results["machine"] = {"python": platform.python_version(), "processor": platform.machine(),
                        "node": platform.node()}
  print(report(results))
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
