"""``python -m sagc_jax.eval --workdir DIR``: held-out accuracy of a run's policy.

Rebuilds the run from ``DIR/config.json``, restores its newest usable
checkpoint (or, with ``--hf_path``, evaluates an exported HF checkpoint folder
instead), and reports greedy held-out accuracy and mean response length on
``data.eval_split``. Read-only on the run: nothing in DIR is written, truncated or
moved (a live run can be evaluated safely); ``--out FILE`` also writes the result
as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from sagc_jax.storage import run_path


def load_run_config(workdir: Any):
  import ml_collections

  path = workdir / "config.json"
  if not path.exists():
    raise SystemExit(f"error: {path} not found: --workdir must be a training run directory")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m sagc_jax.eval", description=__doc__)
  parser.add_argument("--workdir", type=run_path, required=True,
                      help="training run directory (local or gs://)")
  parser.add_argument("--hf_path", type=run_path, default=None,
                      help="evaluate this HF checkpoint folder instead of the run's checkpoint")
  parser.add_argument("--examples", type=int, default=None, help="held-out examples to use")
  parser.add_argument("--out", type=run_path, default=None,
                      help="also write the result as JSON here (outside the run directory)")
  args = parser.parse_args(argv)
  config = load_run_config(args.workdir)
  if args.hf_path is not None:
    if not args.hf_path.is_dir():
      parser.error(f"--hf_path {args.hf_path} is not a directory")
    config.model.path = os.fspath(args.hf_path)      # gs:// is staged by the Trainer
  from sagc_jax.trainer import Trainer

  trainer = Trainer(config, args.workdir, read_only=True, log=print,
                    restore=args.hf_path is None)
  try:
    result = trainer.evaluate(limit=args.examples)
  finally:
    trainer.close()
  result["step"] = trainer.step
  result["source"] = str(args.hf_path or f"{args.workdir}/checkpoints (step {trainer.step})")
  print(f"held-out accuracy {result['eval_accuracy']:.3f} on {result['eval_examples']:.0f} "
        f"examples, mean response length {result['eval_response_len']:.1f} tokens "
        f"({result['source']})")
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
