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
import copy
import json
import os
import sys
from typing import Any

from sagc_jax.runtime.storage import run_path


def load_run_config(workdir: Any):
  """The run's ``config.json`` over today's defaults: settings added since the run
  was written (e.g. ``reward.fns``, ``train.eval_k``) take their default value."""
  from sagc_jax.config import base_config

  path = workdir / "config.json"
  if not path.exists():
    raise SystemExit(f"error: {path} not found: --workdir must be a training run directory")
  config = base_config()
  config.update(json.loads(path.read_text()))
  return config


def evaluate_run(config: Any, workdir: Any, *, restore: bool = True,
                 limit: int | None = None, log=print) -> dict[str, Any]:
  """Held-out evaluation of a run's policy, building only what evaluation needs.

  The data, the starting policy and the greedy and sampled eval samplers; with
  ``restore`` the newest checkpoint's weights replace the starting ones (``step`` in
  the result; 0 when the starting policy is evaluated). No learner, optimizer state
  or controller is built, and nothing in ``workdir`` is written.
  """
  from sagc_jax.runtime import compilation
  from sagc_jax.components import build_eval_samplers
  from sagc_jax.config import validate
  from sagc_jax.evaluation import Evaluator
  from sagc_jax.runtime.compilation import warm
  from sagc_jax.run_inputs import (build_run_inputs, configure_compilation_cache,
                                   load_checkpoint_weights)
  from sagc_jax.runtime.storage import cache_root, local_mirror

  # Evaluation measures accuracy with the task verifier only: the training reward's
  # user functions (maybe not importable here) and W&B are not needed.
  config = copy.deepcopy(config)
  config.reward.update(dict(fns=(), weights=()))
  config.train.wandb_project = ""
  validate(config)
  root = cache_root(config.train.local_cache_dir)
  compilation.install()
  configure_compilation_cache(config, workdir, root, read_only=True)
  inputs = build_run_inputs(config, local_mirror(workdir, root), root, log)
  try:
    step = 0
    if restore:
      directory = config.train.checkpoint_dir or workdir / "checkpoints"
      step = load_checkpoint_weights(inputs.model, directory, log=log)
    evaluator = Evaluator(inputs, *build_eval_samplers(
        config, inputs.model, inputs.mesh, stop_ids=inputs.stop_ids, pad_id=inputs.pad_id),
                          log=log)
    warm(evaluator.warmup_jobs(inputs.model), log=log)
    return {**evaluator.evaluate(inputs.model, limit), "step": step}
  finally:
    inputs.close()


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
  lines = [f"held-out accuracy {result['eval_accuracy']:.3f} greedy, "
           f"{result['eval_sampled_accuracy']:.3f} sampled, on "
           f"{result['eval_examples']:.0f} examples ({result['source']})"]
  at_k = [f"{key.removeprefix('eval_')} {value:.3f}" for key, value in result.items()
          if key.startswith(("eval_pass@", "eval_mean@"))]
  if at_k:
    lines.append("  " + "   ".join(at_k))
  for label, prefix in (("greedy", "eval_response_len"),
                        ("sampled", "eval_sampled_response_len")):
    lines.append(f"  response length, {label}: mean {result[prefix]:.1f}  p50 "
                 f"{result[prefix + '_p50']:.0f}  p90 {result[prefix + '_p90']:.0f}  max "
                 f"{result[prefix + '_max']:.0f} tokens")
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
