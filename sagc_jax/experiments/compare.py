"""``python -m sagc_jax.compare``: GRPO vs DAPO, each with every static G and SAGC.

The matrix {algorithms} x {static G for each candidate (or each of
``compare.static_sizes``), SAGC, the contextual kinds of ``compare.contextual``}
runs ``compare.seeds`` times. Every run starts from the same policy (the warm start is built once, in
``<workdir>/shared``); seed k (``config.seed + k``) sets the data order and the
sampling of every arm alike, so the arms of one seed see the same prompts in the same
order. Runs live in ``<workdir>/arms/<arm>_seed<k>`` as ordinary training runs, so a
run can go on its own machine (``--arms grpo_sagc``: every seed of that arm, or
``--arms grpo_sagc_seed1``; e.g. one per TPU slice), be copied into ``arms/`` and
merged (``--merge_only``); a finished run is skipped and an interrupted one resumes
from its checkpoint.

The report: ``results.csv`` (one row per arm and seed: both straggler rates, total
and rollout wall-clock, speedup against the same seed's largest static G of the same
algorithm, rollouts generated, final train reward, time to the reward target, held-out
accuracy, mean response length, mean G), ``results.md`` (per arm: mean and 95%
Student-t confidence interval over the seeds) and PNG plots (G and lambda over steps,
running straggler rate and reward vs wall-clock as the mean over seeds with a 95%
band, posterior straggler probability per G).
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sagc_jax.experiments.claims import (Paired, claims_markdown, format_ci, mean_ci,
                                          paired_markdown)
from sagc_jax.experiments.machine import machine_info, machine_line, stamp
from sagc_jax.runtime.metrics import finished_summary, summarize

RESULT_COLUMNS = ("arm", "seed", "run", "algorithm", "controller", "static_g", "steps",
                  "straggler_event", "straggler_rate", "group_straggler_rate",
                  "step_straggler_rate", "wall_clock_s", "rollout_s",
                  "speedup_vs_largest_static", "rollouts", "time_to_target_s",
                  "eval_accuracy_start", "eval_accuracy_end", "eval_sampled_accuracy_start",
                  "eval_sampled_accuracy_end", "final_reward",
                  "eval_sampled_gain", "response_len_mean", "response_len_start",
                  "response_len_end", "max_over_median_start", "max_over_median_end",
                  "mean_g", "reward_at_sagc_time", "sampled_accuracy_at_sagc_time")
# The contextual controllers (compare.contextual) against SAGC of the same algorithm and
# seed, in claims.md (docs/controllers.md): the quantities of the comparison's question.
CONTEXTUAL_PAIRED = (
    Paired("eval_sampled_accuracy_end", "held-out sampled accuracy at the end, arm - SAGC",
           "difference", "above"),
    Paired("sampled_accuracy_at_sagc_time", "held-out sampled accuracy when SAGC's steps "
           "ended (equal wall-clock), arm - SAGC", "difference", "above"),
    Paired("reward_at_sagc_time", "train reward when SAGC's steps ended, arm - SAGC",
           "difference", "above"),
    Paired("final_reward", "final train reward (last 10 steps), arm - SAGC", "difference",
           "above"),
    Paired("time_to_target_s", "wall-clock to compare.reward_target, arm / SAGC", "ratio",
           "below"),
    Paired("wall_clock_s", "wall-clock of the steps, arm / SAGC", "ratio", "below"),
    Paired("group_straggler_rate", "group straggler rate, arm - SAGC", "difference", "below"),
    Paired("step_straggler_rate", "step straggler rate, arm - SAGC", "difference", "below"),
    Paired("mean_g", "mean G, arm - SAGC", "difference", None, "+.2f"),
)
# What results.md reports per arm, as mean +- 95% CI over the seeds: (column, header, format).
SUMMARY_COLUMNS = (
    ("group_straggler_rate", "group straggler rate", ".3f"),
    ("step_straggler_rate", "step straggler rate", ".3f"),
    ("wall_clock_s", "wall-clock s", ".1f"), ("rollout_s", "rollout s", ".1f"),
    ("speedup_vs_largest_static", "speedup vs largest static G", ".2f"),
    ("rollouts", "rollouts generated", ".0f"),
    ("time_to_target_s", "time to reward target s", ".1f"),
    ("final_reward", "final train reward", ".3f"),
    ("eval_accuracy_end", "held-out acc greedy (end)", ".3f"),
    ("eval_sampled_accuracy_end", "held-out acc sampled (end)", ".3f"),
    ("eval_sampled_gain", "sampled acc gain", "+.3f"),
    ("response_len_mean", "mean response len", ".1f"),
    ("response_len_start", "response len, first 5 steps", ".1f"),
    ("response_len_end", "response len, last 5 steps", ".1f"),
    ("max_over_median_start", "group max/median, first 5 steps", ".2f"),
    ("max_over_median_end", "group max/median, last 5 steps", ".2f"),
    ("mean_g", "mean G", ".2f"))
TREND_WINDOW = 5       # steps averaged at each end of a run for the start / end trends
_RUN_NAME = re.compile(r"^(?P<arm>.+)_seed(?P<seed>\d+)$")

def arm_configs(config) -> dict[str, Any]:
  """``{arm name: training config}`` for the comparison matrix of ``config.compare``
  (one seed: ``config.seed``).

  Every arm runs its algorithm's published recipe: the objective keys of
  ``ALGORITHM_PRESETS`` go back to ``None`` (the preset's values), so a setting the
  comparison file tuned for one algorithm does not leak into the other's arms. The
  one key kept is a ``kl_coef`` the file sets: it tunes the GRPO arms' KL term (DAPO
  has none).
  """
  from sagc_jax.rl.config import PRESET_FIELDS

  arms = {}
  for algorithm in config.compare.algorithms:
    variants = [(f"{algorithm}_static{g}", "static", g) for g in static_sizes(config)]
    variants.append((f"{algorithm}_sagc", "sagc", None))
    variants += [(f"{algorithm}_{kind}", kind, None) for kind in contextual_kinds(config)]
    for name, kind, g in variants:
      arm = copy.deepcopy(config)
      with arm.unlocked():
        del arm["compare"]
      arm.learner.algorithm = algorithm
      for key in PRESET_FIELDS:
        if not (key == "kl_coef" and algorithm == "grpo"):
          arm.learner[key] = None
      arm.controller.update(dict(kind=kind) if g is None else dict(kind=kind, static_g=g))
      arms[name] = arm
  return arms


def static_sizes(config) -> tuple[int, ...]:
  """The static-G arms: ``compare.static_sizes`` (e.g. ``(4, 16)``: the smallest and
  largest only, where every arm costs minutes), by default every candidate G."""
  candidates = tuple(config.controller.candidates)
  sizes = config.compare.get("static_sizes") or candidates
  bad = [g for g in sizes if isinstance(g, bool) or not isinstance(g, int) or g < 2]
  if bad or len(set(sizes)) != len(sizes):
    raise ValueError(f"compare.static_sizes={tuple(sizes)!r} must be distinct ints >= 2 "
                     f"(e.g. the candidates {candidates})")
  return tuple(sizes)


CONTEXTUAL_KINDS = ("prompt_aware", "per_prompt")


def contextual_kinds(config) -> tuple[str, ...]:
  """``compare.contextual``: arms of the contextual controllers (docs/controllers.md)
  beside SAGC, e.g. ``("prompt_aware", "per_prompt")``; none by default."""
  kinds = tuple(config.compare.get("contextual", ()) or ())
  bad = [k for k in kinds if k not in CONTEXTUAL_KINDS]
  if bad or len(set(kinds)) != len(kinds):
    raise ValueError(f"compare.contextual={kinds!r} must be distinct kinds of "
                     f"{CONTEXTUAL_KINDS}")
  return kinds


def seed_count(config) -> int:
  """``compare.seeds`` (default 1), checked."""
  seeds = config.compare.get("seeds", 1)
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise ValueError(f"compare.seeds={seeds!r} must be a positive int")
  return seeds


def run_configs(config) -> dict[str, Any]:
  """``{"<arm>_seed<k>": training config}``: every arm of ``arm_configs`` for each of
  ``compare.seeds`` seeds (``config.seed + k``: data order and sampling)."""
  runs = {}
  for k in range(seed_count(config)):
    for name, arm in arm_configs(config).items():
      arm.seed = config.seed + k
      runs[f"{name}_seed{k}"] = arm
  return runs


def split_run_name(name: str) -> tuple[str, int]:
  """``"grpo_sagc_seed2"`` -> ``("grpo_sagc", 2)``; a name without a seed is seed 0."""
  match = _RUN_NAME.match(name)
  return (match["arm"], int(match["seed"])) if match else (name, 0)


def select_arms(all_arms: dict[str, Any], wanted: str | None) -> dict[str, Any]:
  """The runs named in ``wanted`` (comma-separated; an arm name selects all its seeds)."""
  if not wanted:
    return all_arms
  names = [n.strip() for n in wanted.split(",") if n.strip()]
  chosen, unknown = {}, []
  for name in names:
    hits = {n: c for n, c in all_arms.items() if n == name or split_run_name(n)[0] == name}
    if not hits:
      unknown.append(name)
    chosen.update(hits)
  if unknown:
    arms = sorted({split_run_name(n)[0] for n in all_arms})
    raise ValueError(f"--arms: unknown arm(s) {unknown}; this comparison has {arms} "
                     f"(each with seeds _seed0.._seed{max(split_run_name(n)[1] for n in all_arms)})")
  return chosen


def run_arms(config, workdir: Path, arms: dict[str, Any], log=print) -> None:
  """Runs (or resumes, or skips when finished) each run from one shared warm start."""
  from sagc_jax.data import builder_options, load_split
  from sagc_jax.runtime.storage import cache_root
  from sagc_jax.training.inputs import policy_source
  from sagc_jax.training.warm_start import prepare_policy

  data_dir = config.data.data_dir or str(workdir / "tfds")
  shared = workdir / "shared"
  shared.mkdir(parents=True, exist_ok=True)
  train = load_split(config.data.name, "train", data_dir, config.data.manual_dir or None,
                     **builder_options(config.data))
  # A GGUF source (a .gguf file or a built-in name) is converted once, here, so that
  # every arm starts from the same local folder.
  cache = cache_root(config.train.local_cache_dir)
  start = policy_source(config, cache, log)
  policy = prepare_policy(config, shared, train, log, model_path=start, cache=cache)
  for index, (name, arm) in enumerate(arms.items()):
    arm_dir = workdir / "arms" / name
    if finished_summary(arm_dir, arm.train.steps) is not None:
      log(f"[{index + 1}/{len(arms)}] {name}: finished earlier, skipped")
      continue
    log(f"[{index + 1}/{len(arms)}] {name}")
    arm.model.path = str(policy.absolute())
    arm.data.data_dir = data_dir
    if arm.train.compilation_cache and not arm.train.compilation_cache_dir:
      arm.train.compilation_cache_dir = str(workdir / "jax_cache")   # arms share programs
    if not arm.train.initial_eval_dir:        # the runs of a seed share their first evaluation
      arm.train.initial_eval_dir = str(shared / "initial_eval")
    if _train_arm(arm, arm_dir).get("preempted"):
      log(f"{name}: stopped by SIGTERM or Ctrl-C after a checkpoint; rerun the same command to "
          "resume this arm and the ones after it")
      raise SystemExit(0)


def _train_arm(config, arm_dir: Path) -> dict[str, Any]:
  """One run, in its own process (``arm_process``: memory is returned between runs)."""
  from sagc_jax.experiments.arm_process import run_in_child

  return run_in_child(config, arm_dir)


# ------------------------------------------------------------------ report
def load_arm(arm_dir: str | os.PathLike) -> dict[str, Any]:
  """An arm's config, metrics rows, eval history and summary from its run directory."""
  from sagc_jax.runtime.metrics import load_history

  arm_dir = Path(arm_dir)
  config = json.loads((arm_dir / "config.json").read_text())
  summary_path = arm_dir / "summary.json"
  return {"name": arm_dir.name, "dir": str(arm_dir), "config": config,
          "rows": load_history(arm_dir),          # step rows (not the step-0 evaluation)
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
  seen: dict[tuple[str, int], str] = {}
  for arm in arms:         # "grpo_sagc" (before seeds) is seed 0 of "grpo_sagc_seed0"
    key = split_run_name(arm["name"])
    if key in seen:
      raise ValueError(f"{arms_dir}: {seen[key]} and {arm['name']} are both seed {key[1]} of "
                       f"arm {key[0]}; move one of them out of arms/")
    seen[key] = arm["name"]
  if not arms:
    raise FileNotFoundError(f"no finished arm (metrics.jsonl + config.json) under {arms_dir}")
  return arms


def time_to_target(metrics: Sequence[dict[str, Any]], target: float | None,
                   window: int = 5) -> float:
  """The cumulative step wall-clock at which the ``window``-step trailing mean of the
  train reward first reaches ``target`` (nan: never, or no target)."""
  if target is None or len(metrics) < window:
    return float("nan")
  reward = np.array([r["reward_mean"] for r in metrics], float)
  clock = np.cumsum([r["time_total_s"] for r in metrics])
  trailing = np.convolve(reward, np.ones(window) / window, mode="valid")
  hits = np.flatnonzero(trailing >= target)
  return float(clock[hits[0] + window - 1]) if hits.size else float("nan")


def _steps_done_by(metrics: Sequence[dict[str, Any]], seconds: float) -> int | None:
  """How many steps a run had done when its cumulative step wall-clock reached
  ``seconds`` (a relative 1e-9 absorbs the rounding of summing the same times in
  another order); None when ``seconds`` is not finite or the run ended before it (it
  would have gone on)."""
  clock = np.cumsum([r["time_total_s"] for r in metrics])
  if not len(metrics) or not math.isfinite(seconds) or clock[-1] < seconds * (1 - 1e-9):
    return None
  return int(np.searchsorted(clock, seconds * (1 + 1e-9), side="right"))


def reward_at_time(metrics: Sequence[dict[str, Any]], seconds: float,
                   window: int = 10) -> float:
  """The train reward of a run when its cumulative step wall-clock reached ``seconds``:
  the mean over the ``window`` steps ending at the last step done by then (nan when
  none was, or when the run ended before ``seconds``)."""
  done = _steps_done_by(metrics, seconds)
  if not done:
    return float("nan")
  return float(np.mean([r["reward_mean"] for r in metrics[max(0, done - window):done]]))


def sampled_accuracy_at_time(metrics: Sequence[dict[str, Any]], seconds: float) -> float:
  """The held-out sampled accuracy of the last evaluation a run made within its first
  ``seconds`` of step wall-clock (nan when it made none, or ended before then)."""
  done = _steps_done_by(metrics, seconds)
  evals = [r["eval_sampled_accuracy"] for r in metrics[:done or 0]
           if "eval_sampled_accuracy" in r]
  return float(evals[-1]) if evals else float("nan")


def window_mean(metrics: Sequence[dict[str, Any]], key: str, end: str,
                window: int = TREND_WINDOW) -> float:
  """Mean of ``key`` over the first (``end="start"``) or last ``window`` steps that
  carry it (nan when none do): how a run's lengths and straggler ratio moved."""
  values = [r[key] for r in metrics if key in r]
  values = values[:window] if end == "start" else values[-window:]
  return float(np.mean(values)) if values else float("nan")


def results_table(arms: Sequence[dict[str, Any]],
                  reward_target: float | None = None) -> list[dict[str, Any]]:
  """One result row per run (arm and seed; see ``RESULT_COLUMNS``)."""
  rows = []
  for arm in arms:
    cfg, metrics = arm["config"], arm["rows"]
    stats = summarize(metrics)
    evals = [r for r in metrics if "eval_sampled_accuracy" in r]
    controller = cfg["controller"]["kind"]
    name, seed = split_run_name(arm["name"])
    rows.append({
        "arm": name, "seed": seed, "run": arm["name"],
        "algorithm": cfg["learner"]["algorithm"], "controller": controller,
        "static_g": cfg["controller"]["static_g"] if controller == "static" else "",
        "steps": len(metrics),
        "straggler_event": cfg["controller"].get("event", "group"),
        "straggler_rate": stats.get("straggler_rate", float("nan")),
        "group_straggler_rate": stats.get("group_straggler_rate", float("nan")),
        "step_straggler_rate": stats.get("step_straggler_rate", float("nan")),
        "wall_clock_s": stats.get("time_total_s", float("nan")),
        "rollout_s": stats.get("time_rollout_s", float("nan")),
        "rollouts": (float(sum(r["rollouts"] for r in metrics))
                     if metrics and all("rollouts" in r for r in metrics) else float("nan")),
        "time_to_target_s": time_to_target(metrics, reward_target),
        "eval_accuracy_start": arm["summary"].get("eval_accuracy_start", float("nan")),
        "eval_accuracy_end": evals[-1].get("eval_accuracy", float("nan")) if evals
        else float("nan"),
        "eval_sampled_accuracy_start": arm["summary"].get("eval_sampled_accuracy_start",
                                                          float("nan")),
        "eval_sampled_accuracy_end": evals[-1].get("eval_sampled_accuracy", float("nan"))
        if evals else float("nan"),
        "final_reward": float(np.mean([r["reward_mean"] for r in metrics[-10:]]))
        if metrics else float("nan"),
        "response_len_mean": stats.get("response_len_mean", float("nan")),
        "mean_g": stats.get("mean_g", float("nan")),
    })
    row = rows[-1]
    row["eval_sampled_gain"] = (row["eval_sampled_accuracy_end"]
                                - row["eval_sampled_accuracy_start"])
    # The final posterior means of the smallest and largest candidate (claims.py).
    candidates = sorted(cfg["controller"]["candidates"])
    last = metrics[-1] if metrics else {}
    row["p_smallest_end"] = last.get(f"p_mean/G{candidates[0]}", float("nan"))
    row["p_largest_end"] = last.get(f"p_mean/G{candidates[-1]}", float("nan"))
    for key, column in (("response_len_mean", "response_len"),
                        ("group_max_over_median", "max_over_median")):
      for end in ("start", "end"):
        row[f"{column}_{end}"] = window_mean(metrics, key, end)
  for row, arm in zip(rows, arms):
    # Against the same seed's static run at the largest candidate G (nan if that run is
    # not in the comparison, e.g. a partial merge).
    largest_g = max(arm["config"]["controller"]["candidates"])
    largest = [r for r in rows if r["algorithm"] == row["algorithm"]
               and r["seed"] == row["seed"] and r["controller"] == "static"
               and r["static_g"] == largest_g]
    row["speedup_vs_largest_static"] = (largest[0]["wall_clock_s"] / row["wall_clock_s"]
                                        if largest else float("nan"))
    # At equal wall-clock: where this run stood when the same seed's SAGC run ended
    # (the fair comparison for a method that trades rollouts for time; claims.py).
    sagc = [r for r in rows if r["algorithm"] == row["algorithm"]
            and r["seed"] == row["seed"] and r["controller"] == "sagc"]
    seconds = sagc[0]["wall_clock_s"] if sagc else float("nan")
    row["reward_at_sagc_time"] = reward_at_time(arm["rows"], seconds)
    row["sampled_accuracy_at_sagc_time"] = sampled_accuracy_at_time(arm["rows"], seconds)
  return rows


def summary_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """Per arm (in first-seen order): seeds and ``(mean, half-width, n)`` of every
  ``SUMMARY_COLUMNS`` column over the arm's seeds."""
  out: dict[str, dict[str, Any]] = {}
  for row in rows:
    out.setdefault(row["arm"], {"arm": row["arm"], "runs": []})["runs"].append(row)
  for arm in out.values():
    runs = arm.pop("runs")
    arm["seeds"] = len(runs)
    arm.update({key: mean_ci([r[key] for r in runs]) for key, _, _ in SUMMARY_COLUMNS})
  return list(out.values())


def write_results(rows: Sequence[dict[str, Any]], workdir: Path,
                  caption: str | None = None) -> None:
  with open(workdir / "results.csv", "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, fieldnames=RESULT_COLUMNS)
    writer.writeheader()
    writer.writerows([{k: row[k] for k in RESULT_COLUMNS} for row in rows])
  caption = f"{caption or 'Measured on: ' + machine_line()}.\n\n"
  (workdir / "results.md").write_text(caption + markdown_table(rows) + "\n", encoding="utf-8")
  (workdir / "claims.md").write_text(caption + claims_markdown(rows) + contextual_markdown(rows)
                                     + "\n", encoding="utf-8")


def contextual_markdown(rows: Sequence[dict[str, Any]]) -> str:
  """'' without contextual arms; else a section for claims.md: every contextual arm
  against SAGC of its algorithm, seed-paired (``CONTEXTUAL_PAIRED``)."""
  pairs = []
  for algorithm in dict.fromkeys(str(r["algorithm"]) for r in rows):
    kinds = dict.fromkeys(r["controller"] for r in rows if str(r["algorithm"]) == algorithm
                          and r["controller"] not in ("sagc", "static"))
    pairs += [(f"{algorithm} {kind}", f"{algorithm}_{kind}", f"{algorithm}_sagc")
              for kind in kinds]
  if not pairs:
    return ""
  seeds = len({int(r["seed"]) for r in rows})
  return ("\n\n## Contextual controllers against SAGC\n\nPer seed, the arm against SAGC of "
          f"the same algorithm and seed, then mean ± 95% CI over the {seeds} seeds:\n\n"
          + paired_markdown(rows, pairs, CONTEXTUAL_PAIRED))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
  """Per arm: mean ± 95% CI over its seeds (n = seeds) of ``SUMMARY_COLUMNS``."""
  header = "| arm | seeds | " + " | ".join(h for _, h, _ in SUMMARY_COLUMNS) + " |"
  lines = [header, "|" + "---|" * (len(SUMMARY_COLUMNS) + 2)]
  for arm in summary_table(rows):
    cells = " | ".join(format_ci(arm[key], fmt) for key, _, fmt in SUMMARY_COLUMNS)
    lines.append(f"| {arm['arm']} | {arm['seeds']} | {cells} |")
  return "\n".join(lines)


def _smooth(x: np.ndarray, window: int = 5) -> np.ndarray:
  if len(x) < window:
    return x
  return np.convolve(x, np.ones(window) / window, mode="valid")


def plot_comparison(arms: Sequence[dict[str, Any]], workdir: Path,
                    machine: dict[str, Any] | None = None) -> list[Path]:
  """Writes the four comparison plots; returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from sagc_jax.experiments.plots import line_style, outside_legend, rate_band

  paths = []
  # G, lambda and the posterior are per-run traces: the first seed of each SAGC arm.
  first_seed = {}
  for arm in arms:
    first_seed.setdefault(split_run_name(arm["name"])[0], arm)
  sagc = [a for a in first_seed.values() if a["config"]["controller"]["kind"] == "sagc"]

  def save(fig, name):
    path = workdir / name
    stamp(fig, machine)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)

  # One G panel per SAGC arm: GRPO's and DAPO's G traces often coincide, and on one
  # panel DAPO's hid GRPO's. Lambda shares a panel, in line styles that keep both visible.
  fig, axes = plt.subplots(len(sagc) + 1, 1, figsize=(10, 2.2 * len(sagc) + 3), sharex=True,
                           squeeze=False)
  axes = axes[:, 0]
  for i, arm in enumerate(sagc):
    steps = [r["step"] for r in arm["rows"]]
    axes[i].step(steps, [r["g"] for r in arm["rows"]], where="post", color=f"C{i}",
                 label=arm["name"])
    axes[i].set_ylabel("G")
    axes[-1].plot(steps, [r["lambda"] for r in arm["rows"]], color=f"C{i}", label=arm["name"],
                  **line_style(i))
  axes[-1].set_ylabel("lambda")
  axes[-1].set_xlabel("step")
  for ax in axes:
    outside_legend(ax)
  save(fig, "g_lambda.png")

  by_arm: dict[str, list[dict[str, Any]]] = {}
  for arm in arms:
    by_arm.setdefault(split_run_name(arm["name"])[0], []).append(arm)

  def algorithm(name):
    return (by_arm[name][0]["config"].get("learner") or {}).get("algorithm") or \
        name.split("_")[0]

  # One panel per algorithm (its arms of one G would overlap the other's); each variant
  # (static G, SAGC) keeps its colour and line style in every panel.
  algorithms = list(dict.fromkeys(algorithm(n) for n in by_arm))
  variants = list(dict.fromkeys(n.removeprefix(algorithm(n) + "_") for n in by_arm))

  def panels(ylabel):
    fig, axes = plt.subplots(len(algorithms), 1, figsize=(10, 3.2 * len(algorithms) + 0.6),
                             sharex=True, sharey=True, squeeze=False)
    for alg, ax in zip(algorithms, axes[:, 0]):
      ax.set_title(alg, fontsize=9)
      ax.set_ylabel(ylabel)
    return fig, dict(zip(algorithms, axes[:, 0]))

  def band(axes, name, x, curves, low=-np.inf, high=np.inf):
    """Mean over seeds with a 95% t band clipped to [low, high] (curves cut to the
    shortest run)."""
    n = min(len(c) for c in curves)
    stats = [mean_ci([c[i] for c in curves]) for i in range(n)]
    mean = np.array([m for m, _, _ in stats])
    k = variants.index(name.removeprefix(algorithm(name) + "_"))
    ax = axes[algorithm(name)]
    ax.plot(x[:n], mean, color=f"C{k}", label=f"{name} (n={len(curves)})", **line_style(k))
    if len(curves) > 1:
      lower, upper = rate_band(mean, np.array([h for _, h, _ in stats]), low, high)
      ax.fill_between(x[:n], lower, upper, color=f"C{k}", alpha=0.15, lw=0)

  events = sorted({a["config"]["controller"].get("event", "group") for a in arms})
  unit = {"group": "straggling groups / groups", "step": "steps with a straggler / steps"}
  fig, axes = panels("running straggler rate\n(" + "; ".join(unit[e] for e in events) + ")")
  for name, runs in by_arm.items():
    curves = []
    for run in runs:
      rate = np.array([r["straggler_rate"] for r in run["rows"]])
      curves.append(np.cumsum(rate) / np.arange(1, len(rate) + 1))
    # A rate: its band is clipped to [0, 1].
    band(axes, name, np.arange(1, max(len(c) for c in curves) + 1), curves, 0.0, 1.0)
  for ax in axes.values():
    for delta in sorted({a["config"]["controller"]["delta"] for a in arms}):
      ax.axhline(delta, color="k", ls="--", lw=0.8, label=f"delta = {delta}")
    ax.set_ylim(-0.02, None)
    outside_legend(ax, fontsize=7)
  ax.set_xlabel("step")
  save(fig, "stragglers.png")

  fig, axes = panels("train reward (5-step mean)")
  for name, runs in by_arm.items():
    n = min(len(run["rows"]) for run in runs)
    clock = np.mean([np.cumsum([r["time_total_s"] for r in run["rows"][:n]]) for run in runs],
                    axis=0)
    rewards = [_smooth(np.array([r["reward_mean"] for r in run["rows"][:n]])) for run in runs]
    # Not clipped: a custom reward term (a penalty) can make the reward negative.
    band(axes, name, clock[n - len(rewards[0]):], rewards)
  for ax in axes.values():
    outside_legend(ax, fontsize=7)
  ax.set_xlabel("wall-clock s (cumulative step time, mean over seeds)")
  save(fig, "reward_vs_time.png")

  fig, axes = plt.subplots(max(len(sagc), 1), 1, figsize=(10, 3 * max(len(sagc), 1)),
                           squeeze=False)
  for ax, arm in zip(axes[:, 0], sagc):
    keys = sorted((k for k in arm["rows"][0] if k.startswith("p_mean/G")),
                  key=lambda k: int(k.split("G")[-1]))
    for i, key in enumerate(keys):
      ax.plot([r["step"] for r in arm["rows"]], [r[key] for r in arm["rows"]],
              label=key.split("/")[1], **line_style(i))
    ax.set_title(arm["name"], fontsize=9)
    ax.set_ylabel("posterior mean p(G)")
    outside_legend(ax)
  save(fig, "posterior.png")
  return paths


def report(workdir: Path, log=print) -> list[dict[str, Any]]:
  arms = load_comparison(workdir)
  settings = workdir / "compare.json"
  settings = json.loads(settings.read_text()) if settings.exists() else {}
  target = settings.get("reward_target")
  # The machine the arms ran on (recorded when they were launched), not this one.
  machine = settings.get("machine")
  if machine is None:
    caption = (f"Measured on: not recorded (the runs predate machine records); report "
               f"built on {machine_line(machine_info())}")
  else:
    caption = f"Measured on: {machine_line(machine)}"
  rows = results_table(arms, target)
  write_results(rows, workdir, caption)
  plot_comparison(arms, workdir, machine)
  log(markdown_table(rows))
  log(claims_markdown(rows) + contextual_markdown(rows))
  log(f"wrote {workdir / 'results.csv'} (one row per arm and seed), {workdir / 'results.md'} "
      f"(mean ± 95% CI over seeds), {workdir / 'claims.md'} (the paper's claims, per "
      f"seed-paired comparison) and plots in {workdir}")
  return rows
