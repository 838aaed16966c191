"""``python -m sagc_jax.figures --out runs/figures``: every documented figure and table, fresh.

One command reruns each measurement the docs report, with the same CLI a reader
would use by hand, and writes everything under ``--out``:

* ``machine.json``: the machine (CPU model, cores, jax version); every PNG carries
  it in its footer and every comparison table in its caption;
* ``index.md``: per job its command, status, wall-clock and output folder;
* one folder per job (``<out>/<job>/``) with its JSON, markdown and PNG files and its
  console output (``log.txt``).

Jobs run one after another as subprocesses (timings would be meaningless with two
sharing the cores), a failed job is reported and the others go on, and a finished job
(its ``done.json``) is skipped when the command is rerun, so an interrupted
regeneration resumes. ``--only`` / ``--skip`` pick jobs; ``--list`` prints them with
their expected duration on the reference machine of docs/results.md and the section
of docs/results.md each one regenerates (``Job.section``; that section names the job).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from sagc_jax.experiments.machine import machine_info, machine_line
from sagc_jax.runtime.storage import read_json

__all__ = ["JOBS", "Job", "regenerate"]

_PY = sys.executable


@dataclasses.dataclass(frozen=True)
class Job:
  name: str
  what: str                                  # the documented figure / table it produces
  minutes: float                             # expected duration, reference machine
  command: Callable[[Path], list[str]]       # argv, given the job's output folder
  section: str                               # the docs/results.md section it regenerates
  needs: str = ""                            # an importable module the job requires


def _simulate(extra: Sequence[str] = (), claims: int = 0) -> Callable[[Path], list[str]]:
  seeds = [f"--claims_seeds={claims}"] if claims else []
  return lambda d: [_PY, "-m", "sagc_jax.simulate", f"--out={d / 'results.json'}", *seeds,
                    *extra]


def _aot(preset: str, topology: str = "v5e:4x4") -> Callable[[Path], list[str]]:
  return lambda d: [_PY, "-m", "sagc_jax.aot", f"--config=configs/{preset}.py",
                    f"--topology={topology}", "--largest_only", "--markdown",
                    f"--out={d / 'aot.json'}"]


# The sizing table (docs/scale.md, "Sizing a slice"): each row one compile, its report
# stored in configs/aot/ as <config>_<topology>.json, where the pod launcher's
# pre-flight reads it instead of compiling (``python -m sagc_jax.aot --reuse``).
SIZING = (
    ("qwen3_8b_16k", "v6e:4x4", ()),
    ("qwen3_8b_16k", "v5p:2x2x4", ("--config.rollout.kv_pages=0",)),
    ("qwen2_5_3b_32k", "v6e:4x4", ()),
    ("llama3_2_3b_16k", "v5e:4x4", ()),
    ("qwen2_5_3b_16k", "v5e:4x4", ()),
    ("llama3_2_3b_16k", "v6e:4x4", ("--config.rollout.kv_pages=0",
                                    "--config.rollout.refill_slots=128")),
    ("qwen2_5_3b_16k", "v6e:4x4", ("--config.rollout.kv_pages=0",)),
)


def stored_report(preset: str, topology: str) -> str:
  return f"configs/aot/{preset}_{topology.replace(':', '_')}.json"


def _sizing(preset: str, topology: str, overrides: Sequence[str]
            ) -> Callable[[Path], list[str]]:
  return lambda d: [_PY, "-m", "sagc_jax.aot", f"--config=configs/{preset}.py",
                    f"--topology={topology}", "--largest_only", *overrides,
                    f"--out={stored_report(preset, topology)}"]


def _compare(config: str, override: Sequence[str] = (),
             arms: Sequence[str] = ()) -> Callable[[Path], list[str]]:
  return lambda d: [_PY, "-m", "sagc_jax.compare", f"--config=configs/{config}.py", *override,
                    f"--workdir={d}", *arms]


# The docs/results.md sections the jobs regenerate (each names its jobs' command).
_EVENT = "Simulator: which straggler event"
_STEP, _DELTA_HALF = "--config.controller.event=step", "--config.controller.delta=0.5"
_4_PROMPTS = "--config.sim.prompts_per_step=4"
_PROMPTS = "Simulator: prompt heterogeneity"
_AOT = "AOT: the 3B presets on v5e:4x4"
_AOT_16K = "AOT: 16k-token responses on v5e:4x4"
_SIZING = "AOT: the sizing table"

_CALIBRATION = "Calibration: SmolLM2-135M-Instruct before RL"
_REPLAY_POD = "Trace replay: SmolLM2 rollouts at a v5e:4x4 3B-16k step's cost"
_REPLAY_CPU = "Trace replay: SmolLM2 rollouts at CPU cost"
_TRACES = "configs/traces/smollm2_word_problems_before_rl.jsonl," \
          "configs/traces/smollm2_word_problems_after_rl.jsonl"
_POD_COST = "aot:configs/aot/llama3_2_3b_16k_v5e_4x4.json"
# tau 1.8 (the SmolLM2 config's, and calibrate's recommendation under the CPU cost) and 2
# (calibrate's recommendation under the pod's cost; docs/results.md).
_POD_TAUS = _CPU_TAUS = "1.8,2"


def _replay(cost: str, taus: str) -> Callable[[Path], list[str]]:
  return lambda d: [_PY, "-m", "sagc_jax.simulate", f"--trace={_TRACES}", f"--cost={cost}",
                    f"--taus={taus}", "--delta=0.1", f"--out={d / 'replay.json'}"]


JOBS = (
    Job("main_job", "Quickstart command 1: the tiny GRPO + SAGC run and its plot", 7.0,
        lambda d: [_PY, "-m", "sagc_jax.train", "--config=configs/tiny_cpu.py",
                   f"--workdir={d / 'run'}"],
        section="The main job, three seeds"),
    Job("simulate", "Simulator table (hold_prompts, group event) + its claims table "
        "(5 seeds)", 0.2, _simulate(claims=5),
        section="Simulator: default run and the paper's claims"),
    *(Job(f"simulate_{name}", f"Which straggler event: {what}", 0.1, _simulate(overrides),
          section=_EVENT)
      for name, what, overrides in (
          ("event_step", "32 prompts, step event, delta 0.25", [_STEP]),
          ("event_step_delta50", "32 prompts, step, delta 0.5", [_STEP, _DELTA_HALF]),
          ("4prompts_group", "4 prompts, group event", [_4_PROMPTS]),
          ("4prompts_step", "4 prompts, step event", [_4_PROMPTS, _STEP]),
          ("4prompts_step_delta50", "4 prompts, step, delta 0.5",
           [_4_PROMPTS, _STEP, _DELTA_HALF]))),
    Job("simulate_prompts", "Prompt heterogeneity: static, SAGC, prompt_aware, per_prompt, "
        "hold_prompts (3 seeds)", 0.5,
        _simulate(["--config=configs/simulate_prompts.py"], claims=3), section=_PROMPTS),
    Job("simulate_prompts_rollouts", "Prompt heterogeneity, hold_rollouts (3 seeds)", 0.5,
        _simulate(["--config=configs/simulate_prompts.py", "--config.sim.mode=hold_rollouts"],
                  claims=3), section=_PROMPTS),
    Job("simulate_prompts_infeasible", "Prompt heterogeneity, even G = 4 above delta "
        "(3 seeds)", 0.5,
        _simulate(["--config=configs/simulate_prompts.py", "--config.sim.tail_prob_start=0.2",
                   "--config.sim.tail_prob_end=0.3"], claims=3), section=_PROMPTS),
    *(Job(f"bench_{bench}", f"Benchmarks: {title}", minutes,
          lambda d, bench=bench: [_PY, "-m", "sagc_jax.bench", bench, f"--out={d / 'bench.json'}"],
          section=section)
      for bench, title, minutes, section in (
          ("controller", "controller overhead", 0.5, "Controller overhead"),
          ("sampler", "sampler vs transformers", 12.0, "Sampler vs transformers"),
          ("learner", "learner packed vs padded", 6.0, "Learner: packed vs padded vs Tunix"),
          ("overlap", "scoring while the tail decodes", 2.5, "Scoring while the tail decodes"))),
    Job("compare_quick", "Comparing GRPO and DAPO: the quick tiny comparison (3 seeds of "
        "40 steps)", 16.0,
        _compare("compare_tiny_cpu", ["--config.compare.time_budget_s=0",
                                      "--config.train.steps=40", "--config.train.eval_every=40"]),
        section="Quick comparison: SAGC vs static G = 16"),
    Job("compare_paper_regime", "The paper's regime: the best model per hour (8 seeds, "
        "every arm 30 s of step time)", 85.0, _compare("compare_paper_regime_cpu"),
        section="The paper's regime: the best model per hour"),
    Job("calibrate_smollm2", "Calibration: SmolLM2-135M-Instruct before RL, 32 prompts x 32 "
        "responses, recommended under the CPU cost", 40.0,
        lambda d: [_PY, "-m", "sagc_jax.calibrate", "--config=configs/smollm2_cpu.py",
                   "--prompts=32", f"--out={d}"], section=_CALIBRATION),
    Job("calibrate_smollm2_pod", "Calibration: the committed SmolLM2 trace, recommended under "
        "the v5e:4x4 3B-16k cost", 0.5,
        lambda d: [_PY, "-m", "sagc_jax.calibrate", f"--trace={_TRACES.split(',')[0]}",
                   f"--cost={_POD_COST}", f"--out={d}"], section=_CALIBRATION),
    Job("replay_smollm2_pod", "Trace replay: SmolLM2 before/after RL, GRPO and DAPO, under "
        "the v5e:4x4 3B-16k compiled cost", 2.0, _replay(_POD_COST, _POD_TAUS),
        section=_REPLAY_POD),
    Job("replay_smollm2_cpu", "Trace replay: SmolLM2 before/after RL, GRPO and DAPO, under "
        "the CPU cost", 1.0,
        _replay(f"cpu:{_TRACES.split(',')[1]}", _CPU_TAUS), section=_REPLAY_CPU),
    *(Job(f"aot_{preset}", f"Sizing a 3B run: {title} on v5e:4x4 (TPU AOT)", 8.0,
          _aot(preset), section=section, needs="libtpu")
      for preset, title, section in (
          ("llama3_2_3b", "Llama 3.2 3B", _AOT), ("qwen2_5_3b", "Qwen2.5 3B", _AOT),
          ("llama3_2_3b_16k", "Llama 3.2 3B, 16k-token responses", _AOT_16K),
          ("qwen2_5_3b_16k", "Qwen2.5 3B, 16k-token responses", _AOT_16K))),
    *(Job(f"size_{preset}_{topology.replace(':', '_')}", f"Sizing table row: {preset} on "
          f"{topology}, its report stored in configs/aot/ (TPU AOT)",
          50.0 if "8b" in preset else 15.0, _sizing(preset, topology, overrides),
          section=_SIZING, needs="libtpu")
      for preset, topology, overrides in SIZING),
)


def select_jobs(only: str | None, skip: str | None) -> list[Job]:
  names = [j.name for j in JOBS]
  wanted = [n.strip() for n in (only.split(",") if only else names) if n.strip()]
  unwanted = {n.strip() for n in (skip.split(",") if skip else []) if n.strip()}
  unknown = sorted((set(wanted) | unwanted) - set(names))
  if unknown:
    raise ValueError(f"unknown job(s) {unknown}; the jobs are: {', '.join(names)}")
  return [j for j in JOBS if j.name in wanted and j.name not in unwanted]


def regenerate(out: Path, jobs: Sequence[Job], *, force: bool = False,
               log: Callable[[str], None] = print) -> list[dict]:
  """Runs ``jobs`` into ``out``; returns one status record per job (also index.md)."""
  out.mkdir(parents=True, exist_ok=True)
  machine = machine_info()
  (out / "machine.json").write_text(json.dumps(machine, indent=1) + "\n")
  records = []
  for i, job in enumerate(jobs, 1):
    folder = out / job.name
    done = folder / "done.json"
    command = job.command(folder)
    if done.exists() and not force:
      record = read_json(done)
      log(f"[{i}/{len(jobs)}] {job.name}: done before ({record['seconds']:.0f} s), skipped")
    elif job.needs and importlib.util.find_spec(job.needs) is None:
      record = {"job": job.name, "status": f"skipped: needs {job.needs} (pip install "
                f"\"jax[tpu]==<this jax>\")", "seconds": 0.0}
      log(f"[{i}/{len(jobs)}] {job.name}: {record['status']}")
    else:
      if force and folder.exists():
        shutil.rmtree(folder)
      folder.mkdir(parents=True, exist_ok=True)
      log(f"[{i}/{len(jobs)}] {job.name}: {job.what} (~{job.minutes:g} min): "
          f"{' '.join(command[1:])}")
      start = time.perf_counter()
      with open(folder / "log.txt", "w", encoding="utf-8") as f:
        rc = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)
      record = {"job": job.name, "status": "ok" if rc == 0 else f"failed (exit {rc})",
                "seconds": time.perf_counter() - start, "machine": machine}
      if rc == 0:
        done.write_text(json.dumps(record, indent=1) + "\n")
      log(f"    {record['status']} in {record['seconds']:.0f} s "
          f"(log: {folder / 'log.txt'})")
    records.append({**record, "what": job.what, "command": " ".join(command[1:]),
                    "folder": str(folder)})
  lines = [f"Regenerated with `python -m sagc_jax.figures --out {out}` on "
           f"{machine_line(machine)}.", "", "| job | what | status | seconds | command |",
           "|---|---|---|---|---|"]
  lines += [f"| {r['job']} | {r['what']} | {r['status']} | {r['seconds']:.0f} | "
            f"`{r['command']}` |" for r in records]
  (out / "index.md").write_text("\n".join(lines) + "\n")
  return records
