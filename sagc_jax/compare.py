"""``python -m sagc_jax.compare``: GRPO vs DAPO, each with every static G and SAGC.

The matrix {algorithms} x {static G for each candidate, SAGC} runs on identical
data order and seeds: every arm starts from the same policy (the warm start is
built once, in ``<workdir>/shared``), reads the same TFDS data in the same
per-seed order, and samples with the same per-step seeds. Arms live in
``<workdir>/arms/<name>`` as ordinary training runs, so an arm can be run on its
own machine (``--arms grpo_sagc``; e.g. one per TPU slice), copied into
``arms/`` and merged (``--merge_only``); a finished arm is skipped and an
interrupted one resumes from its checkpoint.

The report: ``results.csv`` / ``results.md`` (per arm: straggler rate, total and
rollout wall-clock, speedup against the largest static G of the same
algorithm, final held-out accuracy and reward, mean response length, mean G)
and PNG plots (G and lambda over steps, straggler events, reward vs
wall-clock, posterior straggler probability per G).
"""

from __future__ import annotations

import copy
import csv
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sagc_jax.cli import reject_positional, run_absl_tool
from sagc_jax.metrics import read_jsonl, summarize
from sagc_jax.storage import is_remote

RESULT_COLUMNS = ("arm", "algorithm", "controller", "static_g", "steps", "straggler_event",
                  "straggler_rate", "group_straggler_rate", "step_straggler_rate",
                  "wall_clock_s", "rollout_s", "speedup_vs_largest_static",
                  "eval_accuracy_start", "eval_accuracy_end", "eval_sampled_accuracy_start",
                  "eval_sampled_accuracy_end", "final_reward",
                  "response_len_mean", "mean_g")


def arm_configs(config) -> dict[str, Any]:
  """``{arm name: training config}`` for the comparison matrix of ``config.compare``."""
  from sagc_jax.config import apply_algorithm

  arms = {}
  candidates = tuple(config.controller.candidates)
  for algorithm in config.compare.algorithms:
    variants = [(f"{algorithm}_static{g}", "static", g) for g in candidates]
    variants.append((f"{algorithm}_sagc", "sagc", None))
    for name, kind, g in variants:
      arm = copy.deepcopy(config)
      with arm.unlocked():
        del arm["compare"]
      apply_algorithm(arm, algorithm)
      arm.controller.kind = kind
      if g is not None:
        arm.controller.static_g = g
      arms[name] = arm
  return arms


def select_arms(all_arms: dict[str, Any], wanted: str | None) -> dict[str, Any]:
  if not wanted:
    return all_arms
  names = [n.strip() for n in wanted.split(",") if n.strip()]
  unknown = [n for n in names if n not in all_arms]
  if unknown:
    raise ValueError(f"--arms: unknown arm(s) {unknown}; this comparison has "
                     f"{sorted(all_arms)}")
  return {n: all_arms[n] for n in names}


def run_arms(config, workdir: Path, arms: dict[str, Any], log=print) -> None:
  """Runs (or resumes, or skips when finished) each arm from one shared warm start."""
  from sagc_jax.data import load_split
  from sagc_jax.warm_start import prepare_policy

  data_dir = config.data.data_dir or str(workdir / "tfds")
  shared = workdir / "shared"
  shared.mkdir(parents=True, exist_ok=True)
  builder_kwargs = ({"config": config.data.synthetic.to_dict()}
                    if config.data.name == "synthetic" else {})
  train = load_split(config.data.name, "train", data_dir, config.data.manual_dir or None,
                     **builder_kwargs)
  policy = prepare_policy(config, shared, train, log)
  for index, (name, arm) in enumerate(arms.items()):
    arm_dir = workdir / "arms" / name
    summary = arm_dir / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("steps") == arm.train.steps:
      log(f"[{index + 1}/{len(arms)}] {name}: finished earlier, skipped")
      continue
    log(f"[{index + 1}/{len(arms)}] {name}")
    arm.model.path = str(policy.absolute())
    arm.data.data_dir = data_dir
    if arm.train.compilation_cache and not arm.train.compilation_cache_dir:
      arm.train.compilation_cache_dir = str(workdir / "jax_cache")   # arms share programs
    if _train_arm(arm, arm_dir).get("preempted"):
      log(f"{name}: stopped by SIGTERM or Ctrl-C after a checkpoint; rerun the same command to "
          "resume this arm and the ones after it")
      raise SystemExit(0)


def _train_arm(config, arm_dir: Path) -> dict[str, Any]:
  from sagc_jax.trainer import Trainer

  trainer = Trainer(config, arm_dir)
  try:
    return trainer.run()
  finally:
    trainer.close()


# ------------------------------------------------------------------ report
def load_arm(arm_dir: str | os.PathLike) -> dict[str, Any]:
  """An arm's config, metrics rows, eval history and summary from its run directory."""
  arm_dir = Path(arm_dir)
  config = json.loads((arm_dir / "config.json").read_text())
  summary_path = arm_dir / "summary.json"
  return {"name": arm_dir.name, "dir": str(arm_dir), "config": config,
          "rows": read_jsonl(arm_dir / "metrics.jsonl"),
          "summary": json.loads(summary_path.read_text()) if summary_path.exists() else {}}


def load_comparison(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """Every arm under ``<workdir>/arms`` (or ``workdir`` itself if it is a single run)."""
  workdir = Path(workdir)
  if (workdir / "metrics.jsonl").exists():
    return [load_arm(workdir)]
  arms_dir = workdir / "arms"
  if not arms_dir.is_dir():
    raise FileNotFoundError(f"{workdir} holds neither arms/ nor a single run's metrics.jsonl")
  arms = [load_arm(d) for d in sorted(arms_dir.iterdir())
          if (d / "metrics.jsonl").exists() and (d / "config.json").exists()]
  arms = [a for a in arms if a["rows"]]          # an arm that has not finished a step yet
  if not arms:
    raise FileNotFoundError(f"no finished arm (metrics.jsonl + config.json) under {arms_dir}")
  return arms


def results_table(arms: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """One result row per arm (see ``RESULT_COLUMNS``)."""
  rows = []
  for arm in arms:
    cfg, metrics = arm["config"], arm["rows"]
    stats = summarize(metrics)
    evals = [r for r in metrics if "eval_accuracy" in r]
    controller = cfg["controller"]["kind"]
    rows.append({
        "arm": arm["name"], "algorithm": cfg["learner"]["algorithm"], "controller": controller,
        "static_g": cfg["controller"]["static_g"] if controller == "static" else "",
        "steps": len(metrics),
        "straggler_event": cfg["controller"].get("event", "group"),
        "straggler_rate": stats.get("straggler_rate", float("nan")),
        "group_straggler_rate": stats.get("group_straggler_rate", float("nan")),
        "step_straggler_rate": stats.get("step_straggler_rate", float("nan")),
        "wall_clock_s": stats.get("time_total_s", float("nan")),
        "rollout_s": stats.get("time_rollout_s", float("nan")),
        "eval_accuracy_start": arm["summary"].get("eval_accuracy_start", float("nan")),
        "eval_accuracy_end": evals[-1]["eval_accuracy"] if evals else float("nan"),
        "eval_sampled_accuracy_start": arm["summary"].get("eval_sampled_accuracy_start",
                                                          float("nan")),
        "eval_sampled_accuracy_end": evals[-1].get("eval_sampled_accuracy", float("nan"))
        if evals else float("nan"),
        "final_reward": float(np.mean([r["reward_mean"] for r in metrics[-10:]]))
        if metrics else float("nan"),
        "response_len_mean": stats.get("response_len_mean", float("nan")),
        "mean_g": stats.get("mean_g", float("nan")),
    })
  for row in rows:
    statics = [r for r in rows if r["algorithm"] == row["algorithm"]
               and r["controller"] == "static"]
    largest = max(statics, key=lambda r: r["static_g"]) if statics else None
    row["speedup_vs_largest_static"] = (largest["wall_clock_s"] / row["wall_clock_s"]
                                        if largest else float("nan"))
  return rows


def write_results(rows: Sequence[dict[str, Any]], workdir: Path) -> None:
  with open(workdir / "results.csv", "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
    writer.writeheader()
    writer.writerows([{k: row[k] for k in RESULT_COLUMNS} for row in rows])
  (workdir / "results.md").write_text(markdown_table(rows) + "\n", encoding="utf-8")


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  header = ("| arm | group straggler rate | step straggler rate | wall-clock s | rollout s "
            "| speedup vs largest static G "
            "| held-out acc greedy (start -> end) | held-out acc sampled (start -> end) "
            "| final reward | mean response len | mean G |")
  lines = [header, "|" + "---|" * 11]
  for r in rows:
    lines.append(
        f"| {r['arm']} | {r['group_straggler_rate']:.3f} | {r['step_straggler_rate']:.3f} | "
        f"{r['wall_clock_s']:.1f} | "
        f"{r['rollout_s']:.1f} | {r['speedup_vs_largest_static']:.2f}x | "
        f"{r['eval_accuracy_start']:.3f} -> {r['eval_accuracy_end']:.3f} | "
        f"{r['eval_sampled_accuracy_start']:.3f} -> {r['eval_sampled_accuracy_end']:.3f} | "
        f"{r['final_reward']:.3f} | {r['response_len_mean']:.1f} | {r['mean_g']:.2f} |")
  return "\n".join(lines)


def _smooth(x: np.ndarray, window: int = 5) -> np.ndarray:
  if len(x) < window:
    return x
  return np.convolve(x, np.ones(window) / window, mode="valid")


def plot_comparison(arms: Sequence[dict[str, Any]], workdir: Path) -> list[Path]:
  """Writes the four comparison plots; returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  sagc = [a for a in arms if a["config"]["controller"]["kind"] == "sagc"]

  def save(fig, name):
    path = workdir / name
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)

  fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
  for arm in sagc:
    steps = [r["step"] for r in arm["rows"]]
    axes[0].step(steps, [r["g"] for r in arm["rows"]], where="post", label=arm["name"])
    axes[1].plot(steps, [r["lambda"] for r in arm["rows"]], label=arm["name"])
  axes[0].set_ylabel("G")
  axes[1].set_ylabel("lambda")
  axes[1].set_xlabel("step")
  axes[0].legend(fontsize=8)
  save(fig, "g_lambda.png")

  fig, ax = plt.subplots(figsize=(8, 4))
  for arm in arms:
    rate = np.array([r["straggler_rate"] for r in arm["rows"]])
    ax.plot(np.arange(1, len(rate) + 1), np.cumsum(rate) / np.arange(1, len(rate) + 1),
            label=arm["name"])
  deltas = {a["config"]["controller"]["delta"] for a in arms}
  for delta in deltas:
    ax.axhline(delta, color="k", ls="--", lw=0.8)
  events = sorted({a["config"]["controller"].get("event", "group") for a in arms})
  unit = {"group": "straggling groups / groups", "step": "steps with a straggler / steps"}
  ax.set_ylabel("running straggler rate\n(" + "; ".join(unit[e] for e in events) + ")")
  ax.set_xlabel("step")
  ax.legend(fontsize=7, ncol=2)
  save(fig, "stragglers.png")

  fig, ax = plt.subplots(figsize=(8, 4))
  for arm in arms:
    t = np.cumsum([r["time_total_s"] for r in arm["rows"]])
    reward = _smooth(np.array([r["reward_mean"] for r in arm["rows"]]))
    ax.plot(t[len(t) - len(reward):], reward, label=arm["name"])
  ax.set_xlabel("wall-clock s (cumulative step time)")
  ax.set_ylabel("train reward (5-step mean)")
  ax.legend(fontsize=7, ncol=2)
  save(fig, "reward_vs_time.png")

  fig, axes = plt.subplots(max(len(sagc), 1), 1, figsize=(8, 3 * max(len(sagc), 1)),
                           squeeze=False)
  for ax, arm in zip(axes[:, 0], sagc):
    keys = sorted((k for k in arm["rows"][0] if k.startswith("p_mean/G")),
                  key=lambda k: int(k.split("G")[-1]))
    for key in keys:
      ax.plot([r["step"] for r in arm["rows"]], [r[key] for r in arm["rows"]],
              label=key.split("/")[1])
    ax.set_title(arm["name"], fontsize=9)
    ax.set_ylabel("posterior mean p(G)")
    ax.legend(fontsize=8)
  save(fig, "posterior.png")
  return paths


def report(workdir: Path, log=print) -> list[dict[str, Any]]:
  arms = load_comparison(workdir)
  rows = results_table(arms)
  write_results(rows, workdir)
  plot_comparison(arms, workdir)
  log(markdown_table(rows))
  log(f"wrote {workdir / 'results.csv'}, {workdir / 'results.md'} and plots in {workdir}")
  return rows


# --------------------------------------------------------------------- CLI
def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "comparison config (a training config "
                                  "with a 'compare' section).", lock_config=False)
  flags.DEFINE_string("workdir", None, "Comparison directory.")
  flags.DEFINE_string("arms", None, "Comma-separated arms to run (default: all).")
  flags.DEFINE_bool("merge_only", False, "Only build the report from arms/ (no training).")
  flags.mark_flags_as_required(["workdir"])
  return flags.FLAGS


def main(argv: Sequence[str], flags) -> None:
  reject_positional(argv)
  from absl import logging
  import tensorflow_datasets as tfds

  logging.set_verbosity(logging.WARNING)
  tfds.disable_progress_bar()
  if is_remote(flags.workdir):
    raise ValueError(f"--workdir={flags.workdir}: a comparison runs its arms on this host and "
                     "needs a local folder (on a pod, run each arm with launch/tpu_pod.sh and "
                     "its own gs:// --workdir)")
  workdir = Path(flags.workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  if not flags.merge_only:
    if flags.config is None:
      raise ValueError("--config is required unless --merge_only")
    from sagc_jax.config import validate
    arms = select_arms(arm_configs(flags.config), flags.arms)
    for name, arm in arms.items():
      try:
        validate(arm)
      except ValueError as err:
        raise ValueError(f"arm {name}: {err}") from None
    run_arms(flags.config, workdir, arms, log=_print_now)
  report(workdir, log=_print_now)


def _print_now(message: str) -> None:
  print(message, flush=True)           # progress must reach a redirected log promptly


def run() -> None:
  """Console entry point ``sagc-compare``."""
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
