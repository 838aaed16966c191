"""The refill sampler in the AOT report: its pool sized to the chip, its rollout projected.

Pool. With ``rollout.kv_pages=0`` the tool sizes each lane's pool from HBM: it
compiles the programs that hold the pools (the largest segment and prefill) with the
smallest legal pool (one longest row plus the scratch page), reads their peaks
without the pool, and gives the pool what the hungriest leaves under 90% of HBM
(capped at the no-eviction pool, every slot holding a longest row), then compiles
both again with that pool to confirm it fits. A set
``kv_pages`` is compiled as given.

Projection. A refill call's decode steps depend on the response lengths, so the
rollout is projected per *length model*: lengths are drawn (``replay.worlds.LengthProcess``,
the synthetic world, parameters below) for every candidate G's ``P(G) x G`` rows, and the
decoder's own host policy (``refill_schedule.simulate_refill``: admission, page
reservation, eviction) is run on them. A decode step costs the segment program's
roofline (XLA counts its loop body, one step, once, plus the page copies around it;
on the XLA path that includes attention over full-width slot views) plus, with the
Pallas kernel, whose reads XLA cannot see, the keys the fullest lane holds at that
point x the bytes a device stores per key / HBM bandwidth; each prefill round costs
the largest prefill program. The bound it is compared with is
``(sum(lengths) / slots + max(lengths)) x the mean step``: every token decoded at full
slot occupancy, plus the longest row's own decode time. ``rollout_over_bound`` is
projection / bound per model; ``cap`` (every response at the cap) is the worst case
the step projection uses.

Slots. ``--refill_slots_search`` (``search_slots``) repeats the sizing and the
projection for a few slot counts and keeps the fastest one that meets the goal of
every length model within 1.3x of its bound: more slots decode more rows at once but
leave less HBM for pages, so past some count the pool evicts.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from flax import nnx

from sagc_jax.replay.worlds import LengthProcess
from sagc_jax.sampling.refill_schedule import simulate_refill

__all__ = ["LENGTH_MODELS", "draw_lengths", "format_lines", "project_refill", "refill_projection",
           "ROLLOUT_OVER_BOUND_GOAL", "search_slots",
           "refill_rows", "size_pool", "summary"]

GIB = 2.0 ** 30

# Response-length models, as fractions of the response cap (LengthProcess, steady).
LENGTH_MODELS: dict[str, dict[str, float]] = {
    # Log-normal fitted to the p50 and p90 of SmolLM2-135M-Instruct's sampled
    # word-problem rollouts before RL, as fractions of their 512-token cap
    # (docs/results.md, "SmolLM2: natural lengths and stragglers"): median = p50,
    # sigma = ln(p90 / p50) / 1.2816.
    "smollm2_natural": dict(median=0.203, sigma=0.60, tail_prob=0.0, tail_min=1.0,
                            tail_max=1.0),
    # A stand-in for the long-CoT regime DAPO reports (mean response length growing to
    # about a quarter of its 20k cap, with responses at the cap): median 0.15 of the
    # cap, sigma 0.8, 5% of responses 3-6x longer (clipped at the cap). Not a fit to
    # their data.
    "dapo_like": dict(median=0.15, sigma=0.80, tail_prob=0.05, tail_min=3.0, tail_max=6.0),
    # Every response at the cap: the worst case.
    "cap": dict(median=1e9, sigma=0.0, tail_prob=0.0, tail_min=1.0, tail_max=1.0),
}


def draw_lengths(model: str, cap: int, prompts: int, group: int, seed: int = 0) -> np.ndarray:
  """Lengths [prompts, group] of ``LENGTH_MODELS[model]`` for a ``cap``-token cap."""
  m = LENGTH_MODELS[model]
  process = LengthProcess(
      steps=1, max_len=cap, median_start=m["median"] * cap, median_end=m["median"] * cap,
      sigma_start=m["sigma"], sigma_end=m["sigma"], tail_prob_start=m["tail_prob"],
      tail_prob_end=m["tail_prob"], tail_factor_min=m["tail_min"],
      tail_factor_max=m["tail_max"], prompt_sigma=0.0, seed=seed)
  return process.draw(0, prompts, group)


def size_pool(refill, probes: dict[str, Callable[[], dict | None]], hbm_gib: float,
              hbm_limit: float, log: Callable[[str], None], tries: int = 3) -> dict[str, Any]:
  """Sizes ``refill``'s pool (pages per lane) to the chip; returns what it chose and why.

  ``probes`` compile each program that holds the pools (the largest segment and
  prefill) for the decoder's current pool and return their report rows (peak GiB per
  device, resident state included). The first guess gives the pool what the hungriest
  program leaves at the smallest pool; a program whose peak then still exceeds the
  limit (its temporaries grow with the pool too) takes the pool down by its excess at
  its measured GiB per page, up to ``tries`` times.
  """
  auto = refill.slots_per_lane * refill.pages_per_row + 1
  smallest = refill.pages_per_row + 1
  limit = hbm_limit * hbm_gib

  rooflines: dict[str, float] = {}

  def peaks(pages: int) -> dict[str, float] | None:
    refill.resize_pool(pages)
    out = {}
    for name, probe in probes.items():
      row = probe()
      if row is not None:
        row["probe"] = True           # sizing only: the fit verdict is the final compile's
      if row is None or row.get("peak_gib") is None:
        return None
      out[name] = row["peak_gib"]
      rooflines.setdefault(name, row.get("roofline_ms"))
    return out

  base = peaks(smallest)
  if base is None:
    return dict(pages=smallest, sized=False, reason="a probe at the smallest pool failed")
  page_gib = refill.pool_bytes_per_device() / smallest / GIB
  hungriest = max(base, key=base.get)
  fit = int((limit - (base[hungriest] - page_gib * smallest)) // page_gib)
  pages = max(min(fit, auto), smallest)
  log(f"    pool: the {hungriest} program needs {base[hungriest] - page_gib * smallest:.2f} "
      f"GiB per device besides the pool; {page_gib * 1024:.2f} MiB per page (all layers, "
      f"keys and values, this device's share); {fit} pages fit under {hbm_limit:.0%} of "
      f"{hbm_gib:g} GiB, {auto} hold every slot at the cap -> {pages} pages per lane")
  history = []
  for _ in range(tries):
    got = peaks(pages)
    if got is None:
      break
    history.append(dict(pages=pages, peak_gib=got))
    over = {k: v - limit for k, v in got.items() if v > limit}
    if not over or pages == smallest:
      break
    # GiB per page each program really takes, from its two peaks.
    slope = {k: (got[k] - base[k]) / (pages - smallest) for k in over}
    cut = max(math.ceil(over[k] / max(slope[k], page_gib)) for k in over)
    log(f"    pool: {', '.join(f'{k} {got[k]:.2f} GiB' for k in over)} over the limit at "
        f"{pages} pages -> {max(pages - cut, smallest)}")
    pages = max(pages - cut, smallest)
  refill.resize_pool(pages)
  return dict(pages=pages, sized=True, pages_that_fit=fit, pages_no_eviction=auto,
              gib_without_pool={k: round(v - page_gib * smallest, 3) for k, v in base.items()},
              page_mib=page_gib * 1024, tries=history, roofline_ms_smallest_pool=rooflines)


def project_refill(config, refill, segment_ms: float, prefill_ms: float,
                   kv_ms_per_key: float, seed: int = 0) -> dict[str, Any]:
  """Projected rollout seconds of ``refill`` (a ``RefillDecoder``) and
  ``rollout_over_bound`` per length model, at the candidate G with the longest
  projection (rows ``P(G) x G``, prompts at the largest prompt bucket).

  A decode step costs ``segment_ms`` (the segment program's roofline: XLA counts its
  loop body, one step, once, with the page copies around it) plus, with the kernel
  (whose reads XLA cannot see), ``kv_ms_per_key`` per key the fullest lane holds.
  """
  r = config.rollout
  prompt_len = max(refill.prompt_buckets)
  by_model: dict[str, dict[str, Any]] = {}
  for name in LENGTH_MODELS:
    worst = None
    for g in config.group_sizes():
      prompts = r.prompts_for(g)
      lengths = draw_lengths(name, r.max_new_tokens, prompts, g, seed)
      sim = simulate_refill([prompt_len] * prompts, lengths, lanes=refill.lanes,
                            slots_per_lane=refill.slots_per_lane,
                            num_pages=refill.num_pages, page_size=refill.page_size,
                            segment=refill.segment, max_new_tokens=r.max_new_tokens)
      runs = sim.pop("segment_runs")
      decode_ms = sum(ran * (segment_ms + kv_ms_per_key * keys) for ran, keys in runs)
      step_ms = decode_ms / max(sim["decode_steps"], 1)          # the mean decode step
      seconds = (decode_ms + sim["prefill_rounds"] * prefill_ms) / 1e3
      bound = (lengths.sum() / refill.slots + lengths.max()) * step_ms / 1e3
      row = dict(group_size=g, rows=int(lengths.size), seconds=seconds, bound_s=bound,
                 over_bound=seconds / bound, step_ms=step_ms,
                 length_mean=float(lengths.mean()),
                 length_p90=float(np.percentile(lengths, 90)), length_max=int(lengths.max()),
                 **sim)
      if worst is None or seconds > worst["seconds"]:
        worst = row
    by_model[name] = worst
  return dict(by_length_model=by_model,
              rollout_over_bound={k: v["over_bound"] for k, v in by_model.items()},
              length_models=LENGTH_MODELS)


def _kv_bytes_per_key(refill) -> float:
  """What one device stores per key: keys and values of every layer, its share of heads."""
  return refill.pool_bytes_per_device() / (refill.num_pages * refill.page_size)


def _kv_ms_per_key(refill, hbm_gbps: float) -> float:
  """Milliseconds per key held, per decode step, that the Pallas kernel reads beyond
  XLA's count (0 on the XLA path, whose reads the segment program's roofline holds):
  ``_kv_bytes_per_key`` at the chip's HBM bandwidth."""
  if refill.options_for(refill.slots).paged_kernel == "xla":
    return 0.0
  return _kv_bytes_per_key(refill) / (hbm_gbps * 1e9) * 1e3


def _refill_probes(compile_one, refill, state, rows: int, tag: str):
  """Compile callbacks of the two programs that hold the pools, at their largest shapes
  (segment: widest page bucket; prefill: most prompts, longest bucket)."""
  width = refill.page_buckets()[-1]
  rung, bucket = refill.prompt_rungs()[-1], refill.prompt_buckets[-1]
  return dict(  # named at the call: the pool may have been resized since
      segment=lambda: compile_one(
          f"sampler_refill_segment{tag}[pages={width},rows={rows},kv_pages={refill.num_pages}]",
          lambda: refill.programs.get(("segment", width, rows), state)),
      prefill=lambda: compile_one(
          f"sampler_refill_prefill{tag}[prompts={rung},prompt={bucket},"
          f"kv_pages={refill.num_pages}]",
          lambda: refill.programs.get(("prefill", rung, bucket), state)))


# The goal for a projected rollout: within 1.3x its bound on every length model.
ROLLOUT_OVER_BOUND_GOAL = 1.3


def search_slots(compile_one, config, sampler, model, chip, hbm_limit: float,
                 candidates, log: Callable[[str], None]) -> tuple[dict[str, Any], dict]:
  """Chooses the refill slot count. For each candidate the pool is sized to HBM as
  ``size_pool`` sizes it (compiled at the smallest pool, then at the pool that fits,
  trimmed until it does) and the rollout is projected per length model with the
  rooflines of the smallest-pool compiles. Among the candidates within
  ``ROLLOUT_OVER_BOUND_GOAL`` of their bound on every length model, the one with the
  smallest geometric mean of the projected seconds wins (each model counts alike,
  whatever its scale); when none is, the one whose worst ``rollout_over_bound`` is
  smallest. The winner replaces ``sampler.refill`` with its sized pool, which is
  returned for ``refill_rows``. A candidate that does not split over the lanes, or
  whose programs leave no room for one longest row, is reported and skipped."""
  state = nnx.state(model)
  rows = sampler.row_buckets[-1]
  results, decoders, pools = [], {}, {}
  for slots in sorted(set(int(s) for s in candidates)):
    try:
      decoder = sampler.refill.with_slots(slots)
    except ValueError as err:
      results.append(dict(slots=slots, feasible=False, reason=str(err)))
      continue
    log(f"  slot search: {slots} slots")
    pool = size_pool(decoder, _refill_probes(compile_one, decoder, state, rows,
                                             f"_search{slots}"),
                     chip.hbm_gib, hbm_limit, log)
    roofline = pool.get("roofline_ms_smallest_pool", {})
    if (not pool["sized"] or pool["pages_that_fit"] < decoder.pages_per_row + 1
        or None in roofline.values()):
      results.append(dict(slots=slots, feasible=False, reason=pool.get(
          "reason", f"its programs leave room for {pool.get('pages_that_fit')} pages per "
          f"lane, fewer than one longest row ({decoder.pages_per_row + 1})")))
      continue
    projection = project_refill(config, decoder, roofline["segment"], roofline["prefill"],
                                _kv_ms_per_key(decoder, chip.hbm_gbps))
    seconds = {k: v["seconds"] for k, v in projection["by_length_model"].items()}
    over = projection["rollout_over_bound"]
    results.append(dict(slots=slots, feasible=True, kv_pages=decoder.num_pages,
                        seconds=seconds, rollout_over_bound=over,
                        evictions={k: v["evictions"]
                                   for k, v in projection["by_length_model"].items()},
                        geomean_s=float(np.exp(np.mean(np.log(list(seconds.values()))))),
                        within_goal=bool(max(over.values()) <= ROLLOUT_OVER_BOUND_GOAL)))
    decoders[slots], pools[slots] = decoder, pool
  feasible = [r for r in results if r["feasible"]]
  if not feasible:
    raise ValueError(f"refill slot search: no candidate of {list(candidates)} fits: "
                     + "; ".join(f"{r['slots']}: {r['reason']}" for r in results))
  within = [r for r in feasible if r["within_goal"]]
  if within:
    chosen = min(within, key=lambda r: r["geomean_s"])["slots"]
    rule = (f"the smallest geometric mean of the projected rollout seconds over the length "
            f"models, among the candidates within {ROLLOUT_OVER_BOUND_GOAL}x of their bound "
            "on every model")
  else:
    chosen = min(feasible, key=lambda r: max(r["rollout_over_bound"].values()))["slots"]
    rule = (f"no candidate is within {ROLLOUT_OVER_BOUND_GOAL}x of its bound on every "
            "length model: the one whose worst rollout_over_bound is smallest")
  sampler.refill = decoders[chosen]
  log(f"  slot search: {chosen} slots ({rule})")
  return dict(candidates=results, chosen=chosen, criterion=rule), pools[chosen]


def refill_rows(compile_one, sampler, model, chip, hbm_limit: float,
                log: Callable[[str], None], pool: dict[str, Any] | None = None
                ) -> dict[str, Any]:
  """Compiles the refill sampler's programs (pool sized first when ``kv_pages`` is
  auto, unless ``pool``, the slot search's sizing, is given); returns the rows the
  projection needs."""
  refill = sampler.refill
  state = nnx.state(model)
  rows = sampler.row_buckets[-1]
  out: dict[str, Any] = dict(slots=refill.slots, lanes=refill.lanes, page_size=refill.page_size,
                             segment=refill.segment, pages_per_row=refill.pages_per_row,
                             kernel=refill.options_for(refill.slots).paged_kernel)
  if pool is not None:
    out["pool"] = pool                 # sized by the slot search: the decoder holds it
  elif refill.pages_auto:
    out["pool"] = size_pool(refill, _refill_probes(compile_one, refill, state, rows, "_probe"),
                            chip.hbm_gib, hbm_limit, log)
  final = _refill_probes(compile_one, refill, state, rows, "")   # at the chosen pool
  out.update(program_segment=final["segment"](), kv_pages=refill.num_pages,
             pool_gib_per_device=refill.pool_bytes_per_device() / GIB,
             kv_bytes_per_key=_kv_bytes_per_key(refill), hbm_gbps=chip.hbm_gbps,
             program_prefill=final["prefill"]())
  return out


def refill_projection(config, sampler, rows: dict[str, Any]) -> dict[str, Any] | None:
  """``project_refill`` from the compiled rows (None when one of them failed)."""
  seg, pre = rows.get("program_segment"), rows.get("program_prefill")
  if any(x is None or x.get("roofline_ms") is None for x in (seg, pre)):
    return None
  # The XLA path's attention reads are inside the segment program (full-width views);
  # the kernel's are not: they are added per key held, at the chip's HBM bandwidth.
  kv_ms = _kv_ms_per_key(sampler.refill, rows["hbm_gbps"])
  out = project_refill(config, sampler.refill, seg["roofline_ms"], pre["roofline_ms"], kv_ms)
  out.update(segment_ms=seg["roofline_ms"], prefill_ms=pre["roofline_ms"],
             kv_ms_per_key=kv_ms, decode_step_ms=out["by_length_model"]["cap"]["step_ms"])
  return out


def summary(rows: dict[str, Any], projection: dict[str, Any] | None) -> dict[str, Any]:
  """The JSON-ready part of the report (compiled rows are in ``executables``)."""
  keep = {k: v for k, v in rows.items() if not k.startswith("program_")}
  if projection is not None:
    keep.update(projection)
  return keep


def format_lines(refill: dict[str, Any]) -> list[str]:
  lines = [f"refill: {refill['slots']} slots in {refill['lanes']} lanes, {refill['kv_pages']} "
           f"pages of {refill['page_size']} per lane ({refill['pool_gib_per_device']:.2f} GiB "
           f"per device), segment {refill['segment']}"]
  search = refill.get("slot_search")
  for row in (search or {}).get("candidates", ()):
    mark = " (chosen)" if row["slots"] == search["chosen"] else ""
    lines.append(f"  search {row['slots']:4d} slots{mark}: " + (
        f"{row['kv_pages']} pages per lane; projected " + ", ".join(
            f"{k} {v:.1f} s (x{row['rollout_over_bound'][k]:.2f})"
            for k, v in row["seconds"].items()) if row["feasible"] else row["reason"]))
  for name, row in refill.get("by_length_model", {}).items():
    lines.append(f"  {name:16s} G={row['group_size']:<3d} mean {row['length_mean']:7.0f} "
                 f"max {row['length_max']:6d}: rollout {row['seconds']:7.1f} s, bound "
                 f"{row['bound_s']:7.1f} s, x{row['over_bound']:.2f} ({row['decode_steps']} "
                 f"steps, {row['evictions']} evictions)")
  return lines
