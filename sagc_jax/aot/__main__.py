"""``python -m sagc_jax.aot --config CFG --topology v5e:4x4 [--model_config F] [--out F.json]``.

Compiles, on this host (a CPU is enough), every executable a training run with CFG
would compile on the given Cloud TPU topology, and reports per executable: compile
seconds, per-device argument / output / temp / peak GiB against the chip's HBM, FLOPs,
HBM bytes and the roofline time; then a projected RL step time and the hours for the
config's steps. Exits 1 naming every executable whose peak exceeds 90% of HBM (or
that failed to compile), 2 on a bad flag or config or a refused stored report
(``--reuse``: ``report_key.check_stored``). Needs ``pip install -e '.[tpu]'``.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Sequence

from sagc_jax.cli import run_absl_tool
from sagc_jax.runtime.storage import read_json


def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "ml_collections config file (get_config()).",
                                  lock_config=True)
  flags.DEFINE_string("topology", "v5e:4x4", "Cloud TPU topology, GEN:AxB[xC] "
                      "(v4, v5e, v5p, v6e), e.g. v5e:4x4 or v6e:2x2.")
  flags.DEFINE_string("model_config", None, "HF config.json to size (default: "
                      "model.config_json, else model.path/config.json).")
  flags.DEFINE_bool("largest_only", False, "Compile only the largest bucket of each "
                    "executable kind (where the memory peak is).")
  flags.DEFINE_enum("only", None, ["learner", "samplers"], "Compile only the learner's or "
                    "only the samplers' executables (quick checks of one side; no step "
                    "time is projected then).")
  flags.DEFINE_list("refill_slots_search", [], "Refill slot counts to try (comma list, e.g. "
                    "64,128,256; needs rollout.refill_slots > 0 and kv_pages=0): each gets "
                    "its pool sized to HBM and its rollout projected; the fastest within "
                    "1.3x of its bound on every length model is compiled and reported.")
  flags.DEFINE_string("out", None, "Write the report as JSON here.")
  flags.DEFINE_string("reuse", None, "A folder of stored reports (e.g. configs/aot): when "
                      "one was compiled for the same config, model, topology, scope, "
                      "versions and program code (its digest), print and write it instead "
                      "of compiling; one edited after it was written (its checksum) or "
                      "whose peaks exceed the chip's HBM is refused.")
  flags.DEFINE_bool("markdown", False, "Also print the table as Markdown (docs figures).")
  flags.mark_flags_as_required(["config"])
  return flags.FLAGS


def format_table(report: dict) -> str:
  lines = [f"{' '.join([report.get('config', '(config not recorded)'), *report.get('overrides', [])])}"
           f" on {report['topology']}: "
           f"{Path(report['model_config']).name}, {report['num_layers']} layers, responses "
           f"up to {report['rollout']['max_new_tokens']} tokens"]
  lines += [f"{'executable':58s} {'compile s':>9s} {'peak GiB':>9s} {'TFLOP':>8s} "
           f"{'GB':>8s} {'roofline ms':>11s}"]
  for e in report["executables"]:
    peak = "failed" if e["peak_gib"] is None else f"{e['peak_gib']:.2f}"
    roof = "-" if e["roofline_ms"] is None else f"{e['roofline_ms']:.2f}"
    flag = "" if e["fits"] else "  > 90% HBM" if e["peak_gib"] is not None else "  FAILED"
    flag += " (pool sizing probe)" if flag and e.get("probe") else ""
    lines.append(f"{e['name']:58s} {e['compile_s']:9.1f} {peak:>9s} {e['flops'] / 1e12:8.2f} "
                 f"{e['bytes'] / 1e9:8.2f} {roof:>11s}{flag}")
  lines.append(f"HBM per device {report['chip']['hbm_gib']:g} GiB ({report['chip']['name']}); "
               f"all compiles {report['compile_s_total']:.0f} s")
  if report.get("projected_step_s") is not None:
    lines.append(
        f"projected RL step {report['projected_step_s']:.1f} s = rollout "
        f"{report['projected_rollout_s']:.1f} s (prefill + {report['decode_step_ms']:.2f} ms x "
        f"decode steps) + learner {report['projected_learner_s']:.1f} s; {report['steps']} "
        f"steps = {report['projected_hours']:.1f} h")
    if report.get("decode_ideal_ms") is not None:
      lines.append(
          f"decode step vs ideal (weights + full cache per chip, "
          f"{report['decode_ideal_ms']:.2f} ms): XLA's bytes "
          f"x{report['decode_bytes_over_ideal']:.2f}; estimated HBM traffic "
          f"{report['decode_step_hbm_ms']:.2f} ms, x{report['decode_hbm_over_ideal']:.2f} "
          "(XLA also counts on-chip VMEM reads of prefetched data)")
    if report.get("projected_step_s_hbm_estimate") is not None:
      lines.append(
          f"with the estimated decode HBM traffic: rollout "
          f"{report['projected_rollout_s_hbm_estimate']:.1f} s, RL step "
          f"{report['projected_step_s_hbm_estimate']:.1f} s, {report['steps']} steps = "
          f"{report['projected_hours_hbm_estimate']:.1f} h")
    lines.append(f"learner microbatch: roofline {report['microbatch_roofline_ms']:.0f} ms vs "
                 f"compute-only {report['microbatch_compute_ms']:.0f} ms "
                 f"(x{report['microbatch_roofline_over_compute']:.2f})")
  if report.get("logits_chunks_counted_once", 1) > 1:
    lines.append(f"note: XLA counts the LM-head chunk loop once (1 of "
                 f"{report['logits_chunks_counted_once']} chunks): learner FLOPs / bytes "
                 "undercount by the head's share")
  if report.get("refill"):
    from sagc_jax.aot.refill_report import format_lines
    lines.extend(format_lines(report["refill"]))
  lines.append("peak = the executable's own peak + resident run state not among its "
               "arguments (policy, master weights, Adam moments, reference)")
  if report["learner"]["scan_layers"]:
    lines.append("note: scan_layers=True: XLA counts the scanned layer stack once; the "
                 "learner rows add the other layers at the cost of one unrolled layer")
  lines.append("fits: yes" if report["fits"] else
               f"fits: NO: {', '.join(report['not_fitting'])}")
  return "\n".join(lines)


def format_markdown(report: dict) -> str:
  lines = ["| executable | compile s | peak GiB / HBM | TFLOP | GB | roofline ms |",
           "|---|---|---|---|---|---|"]
  for e in report["executables"]:
    if e["peak_gib"] is None:
      lines.append(f"| {e['name']} | {e['compile_s']:.0f} | failed | | | |")
      continue
    lines.append(f"| {e['name']} | {e['compile_s']:.0f} | {e['peak_gib']:.2f} / "
                 f"{e['hbm_gib']:g} | {e['flops'] / 1e12:.1f} | {e['bytes'] / 1e9:.1f} | "
                 f"{e['roofline_ms']:.1f} |")
  return "\n".join(lines)


def stored_report(folder: str, key: str) -> dict | None:
  """The stored report of digest ``key`` under ``folder``, checked (``report_key``'s
  docstring: an edited report or one whose peaks contradict it is refused; one without
  a checksum is reused with a warning); None: compile."""
  from sagc_jax.aot.report_key import check_stored, find_stored
  if not Path(folder).is_dir():
    raise ValueError(f"--reuse={folder!r} is not a folder")
  log = functools.partial(print, flush=True)
  path = find_stored(folder, key, log=log)
  if path is None:
    log(f"no stored report in {folder} has this digest ({key[:12]}); compiling")
    return None
  report = read_json(path)
  check_stored(path, report, log=log)
  log(f"reusing {path}: compiled for the same config, model, topology, scope, versions "
      f"and program code (digest {key[:12]}); nothing compiled")
  return report


def main(argv: Sequence[str], flags) -> None:
  from absl import logging
  logging.set_verbosity(logging.WARNING)
  from sagc_jax.aot.report_key import digest, with_checksum

  try:
    search = tuple(int(s) for s in flags.refill_slots_search)
  except ValueError:
    raise ValueError(f"--refill_slots_search={','.join(flags.refill_slots_search)}: not a "
                     "comma list of ints (e.g. 64,128,256)") from None
  key = digest(flags.config, flags.topology, model_config=flags.model_config,
               largest_only=flags.largest_only, only=flags.only, refill_slots_search=search)
  report = stored_report(flags.reuse, key) if flags.reuse else None
  if report is None:
    from sagc_jax.aot.compile_report import compile_report
    report = compile_report(flags.config, flags.topology,
                            model_config=flags.model_config,
                            largest_only=flags.largest_only, only=flags.only,
                            refill_slots_search=search,
                            log=lambda m: print(m, flush=True))
    from ml_collections import config_flags
    report.update(config=config_flags.get_config_filename(flags["config"]),
                  overrides=[a for a in sys.argv[1:] if a.startswith("--config.")],
                  digest=key)
  print(format_table(report), flush=True)
  if flags.markdown:
    print(format_markdown(report), flush=True)
  if flags.out:
    Path(flags.out).parent.mkdir(parents=True, exist_ok=True)
    Path(flags.out).write_text(json.dumps(with_checksum(report), indent=1))
    print(f"report: {flags.out}")
  if not report["fits"]:
    sys.exit(1)


def run() -> None:
  run_absl_tool(main, _define_flags)


if __name__ == "__main__":
  run()
