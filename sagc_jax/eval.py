"""``python -m sagc_jax.eval --workdir DIR``: held-out accuracy of a run's policy.

Rebuilds the run from ``DIR/config.json``, restores its newest usable
checkpoint (or, with ``--hf_path``, evaluates an exported HF checkpoint folder
instead), and reports held-out accuracy (greedy, sampled, and pass@j / mean@k with
``--config.train.eval_k=K``) and the response length distribution on
``data.eval_split``. ``--config.KEY=VALUE`` changes any setting for this
evaluation. Read-only on the run: nothing in DIR is written, truncated or moved (a
live run can be evaluated safely); ``--out FILE`` also writes the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from sagc_jax.runtime.storage import run_path


def main(argv: list[str] | None = None) -> int:
  from sagc_jax.cli import apply_config_overrides

  parser = argparse.ArgumentParser(
      prog="python -m sagc_jax.eval", description=__doc__,
      epilog="Any --config.KEY=VALUE changes a setting of the run's config for this "
             "evaluation only, e.g. --config.train.eval_k=8 (pass@k) or "
             "--config.data.eval_split=test[:100].")
  parser.add_argument("--workdir", type=run_path, required=True,
                      help="training run directory (local or gs://)")
  parser.add_argument("--hf_path", type=run_path, default=None,
                      help="evaluate this HF checkpoint folder instead of the run's checkpoint")
  parser.add_argument("--examples", type=int, default=None, help="held-out examples to use")
  parser.add_argument("--out", type=run_path, default=None,
                      help="also write the result as JSON here (outside the run directory)")
  args, overrides = parser.parse_known_args(argv)
  # JAX only once the arguments parse: --help and argument errors answer at once.
  from sagc_jax.training.evaluation import evaluate_run, load_run_config

  if args.examples is not None and args.examples < 1:
    parser.error(f"--examples {args.examples} must be >= 1 (leave it out for the run's "
                 "data.eval_examples)")
  try:
    config = apply_config_overrides(load_run_config(args.workdir), overrides)
  except ValueError as err:
    parser.error(str(err))
  if args.hf_path is not None:
    if not args.hf_path.is_dir():
      parser.error(f"--hf_path {args.hf_path} is not a directory")
    config.model.path = os.fspath(args.hf_path)      # gs:// is staged by build_run_inputs
  try:
    result = evaluate_run(config, args.workdir, restore=args.hf_path is None,
                          limit=args.examples)
  except (ValueError, OSError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  result["source"] = str(args.hf_path or f"{args.workdir}/checkpoints (step {result['step']})")
  print(format_result(result))
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
  return 0


def format_result(result: dict[str, Any]) -> str:
  """The eval report: accuracies, pass@k / mean@k when measured, length percentiles."""
  greedy = (f"{result['eval_accuracy']:.3f} greedy, " if "eval_accuracy" in result else "")
  lines = [f"held-out accuracy {greedy}{result['eval_sampled_accuracy']:.3f} sampled, on "
           f"{result['eval_examples']:.0f} examples ({result['source']})"]
  at_k = [f"{key.removeprefix('eval_')} {value:.3f}" for key, value in result.items()
          if key.startswith(("eval_pass@", "eval_mean@"))]
  if at_k:
    lines.append("  " + "   ".join(at_k))
  for label, prefix in (("greedy", "eval_response_len"),
                        ("sampled", "eval_sampled_response_len")):
    if prefix not in result:
      continue
    lines.append(f"  response length, {label}: mean {result[prefix]:.1f}  p50 "
                 f"{result[prefix + '_p50']:.0f}  p90 {result[prefix + '_p90']:.0f}  max "
                 f"{result[prefix + '_max']:.0f} tokens")
  for key in sorted((key for key in result if key.endswith("_group_straggler_rate")),
                    key=lambda key: int(key.split("_")[1][1:])):
    g = key.split("_")[1]
    lines.append(f"  G={g[1:]}: max/median p50 {result[f'eval_{g}_ratio_p50']:.2f}  p90 "
                 f"{result[f'eval_{g}_ratio_p90']:.2f}  max {result[f'eval_{g}_ratio_max']:.2f}"
                 f"; straggler rate (tau {result['eval_straggler_tau']}) {result[key]:.3f} of {result[f'eval_{g}_groups']:.0f} "
                 f"groups, {result[f'eval_{g}_step_straggler_rate']:.3f} of steps of "
                 f"{result[f'eval_{g}_groups_per_step']:.0f} groups")
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
