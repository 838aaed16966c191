"""Dispatcher: ``python -m sagc_jax.bench {controller,learner,sampler} [--out FILE.json]``."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from sagc_jax.bench import controller, learner, sampler

BENCHMARKS = {"controller": controller, "learner": learner, "sampler": sampler}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m sagc_jax.bench", description=__doc__)
  parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark to run")
  parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
  parser.add_argument("--steps", type=int, default=None, help="override the number of timed steps")
  args = parser.parse_args(argv)
  module = BENCHMARKS[args.name]
  kwargs = {} if args.steps is None else {"steps": args.steps}
  if args.steps is not None and args.steps <= 0:
    parser.error(f"--steps={args.steps} must be positive")
  results = module.run(**kwargs)
  results["benchmark"] = args.name
  results["machine"] = {"python": platform.python_version(), "processor": platform.machine(),
                        "node": platform.node()}
  print(module.report(results))
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
