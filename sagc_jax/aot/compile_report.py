"""Compile every executable of a training config for a TPU topology, on any host.

``jax.experimental.topologies`` gives abstract TPU devices (libtpu compiles for them
without a chip), the policy is built abstract from its HF ``config.json`` (shapes and
shardings, no weights), and ``build_components`` makes the same samplers and learner a
run makes. Each executable is lowered and compiled exactly as warm-up would; its
``memory_analysis()`` (per device) is checked against the chip's HBM and its
``cost_analysis()`` FLOPs and bytes give a roofline time from the chip's peak bf16
FLOP/s and HBM bandwidth (``chips.py``).

XLA's cost analysis counts a loop body once. Hence: decoding is sized from a separately
compiled single decode step (the generate executable's own figure is its prefill plus
one step); the train step's figure is one microbatch (its gradient-accumulation scan
body) plus the optimizer update, and of its LM-head chunk loop one chunk
(``logits_chunks_counted_once``: the learner figures undercount by the head's share);
with ``scan_layers`` the layer stack is counted once instead of ``num_layers`` times,
so the learner rows add ``num_layers - 1`` more layers, each costed as the difference
between the unrolled programs of a 2-layer and a 1-layer copy of the model
(``_per_layer_cost``; ``layers_scaled`` in the row).

A Pallas kernel is a custom call whose inside XLA's cost analysis does not see: with
``learner.attention="splash"`` the learner rows add the kernel's analytic FLOPs and
bytes (``splash.kernel_cost``, per layer, one microbatch like the rest of the figure)
and say so in ``kernel_flops`` / ``kernel_bytes``.

Memory: ``peak_gib`` is the executable's own peak (arguments + outputs + temporaries -
donated) plus the run's state that stays resident while it runs but is not among its
arguments (``resident_gib``: e.g. the bf16 policy and the reference during a train
step, the float32 master weights and Adam moments during sampling).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from sagc_jax.aot.chips import HBM_LIMIT, ChipSpec, generation_of
from sagc_jax.aot.hbm_traffic import hbm_traffic
from sagc_jax.aot.refill_report import refill_projection, refill_rows, search_slots
from sagc_jax.aot.refill_report import summary as refill_summary
from sagc_jax.aot.step_projection import project_step
from sagc_jax.training.build import RLComponents, build_components
from sagc_jax.aot.report_key import model_config_path, sizing_config
from sagc_jax.config import RunConfig
from sagc_jax.models.config import ModelConfig
from sagc_jax.models.splash import head_layout, kernel_cost
from sagc_jax.models.transformer import abstract_model
from sagc_jax.rl.learner import Learner
from sagc_jax.runtime.storage import read_json

__all__ = ["HBM_LIMIT", "compile_report", "topology_mesh"]

GIB = 2.0 ** 30


def topology_mesh(topology: str, mesh_shape, axes) -> tuple[Mesh, ChipSpec]:
  """An Auto-axis mesh over the abstract devices of ``topology`` and the per-device spec."""
  from jax.experimental import topologies
  chip, chips = generation_of(topology)
  try:
    topo = topologies.get_topology_desc(platform="tpu", topology_name=topology,
                                        chips_per_host_bounds=(2, 2, 1), num_slices=1)
  except Exception as err:          # libtpu missing or an unknown topology name
    raise ValueError(f"--topology={topology!r}: cannot build the abstract TPU topology "
                     f"({type(err).__name__}: {err}); install the extra: "
                     "pip install -e '.[tpu]'") from None
  devices = np.array(topo.devices)
  per_chip = max(len(devices) // chips, 1)
  shape = list(mesh_shape)
  if shape.count(-1) == 1:
    known = math.prod(s for s in shape if s != -1)
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"mesh.shape={tuple(mesh_shape)} does not use the {len(devices)} devices "
                     f"of {topology}")
  try:      # the topology-aware device order jax.make_mesh gives a real run
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh(tuple(shape), devices=list(devices))
  except Exception:  # an order mesh_utils does not know: plain order
    grid = devices.reshape(shape)
  mesh = Mesh(grid, tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))
  return mesh, chip.per_device(per_chip)


def _per_device_bytes(tree) -> float:
  total = 0.0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


def _resident_bytes(model, learner) -> dict[str, float]:
  """Per-device bytes of the state that stays in HBM for the whole run, minus what each
  executable kind receives as arguments (already in its own memory analysis)."""
  model_b = _per_device_bytes(nnx.state(model))
  master_b = 0.0 if learner.shares_master else _per_device_bytes(learner.params)
  opt_b = _per_device_bytes(learner.opt_state)
  ref_b = 0.0 if learner.reference is None else _per_device_bytes(learner.reference)
  total = model_b + master_b + opt_b + ref_b
  return {
      "learner_sync": total - master_b,       # + the new model copy it outputs
      "learner_prepare": total,
      "learner_train": total - (master_b or model_b),
      "learner_apply": total - (master_b or model_b) - opt_b,
      "learner_ref": total - ref_b,
      "": total - model_b,                     # samplers and decode steps
  }


def _times(flops: float, nbytes: float, chip: ChipSpec) -> dict[str, float]:
  """Compute-only, memory-only and roofline milliseconds of a cost on ``chip``."""
  return dict(compute_ms=flops / (chip.bf16_tflops * 1e12) * 1e3,
              memory_ms=nbytes / (chip.hbm_gbps * 1e9) * 1e3,
              roofline_ms=chip.roofline_s(flops, nbytes) * 1e3)


def _cost(compiled) -> tuple[float, float]:
  """XLA's (FLOPs, bytes accessed) of a compiled program."""
  cost = compiled.cost_analysis() or {}
  if isinstance(cost, list):      # older JAX: one dict per computation
    cost = cost[0] if cost else {}
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _analyse(name: str, compiled, chip: ChipSpec, compile_s: float,
             resident: float = 0.0) -> dict[str, Any]:
  mem = compiled.memory_analysis()
  args = mem.argument_size_in_bytes / GIB
  out = mem.output_size_in_bytes / GIB
  temp = mem.temp_size_in_bytes / GIB
  alias = mem.alias_size_in_bytes / GIB
  program_peak = args + out + temp - alias
  peak = program_peak + resident / GIB
  flops, nbytes = _cost(compiled)
  return dict(name=name, peak_gib=round(peak, 3), hbm_gib=chip.hbm_gib,
              program_peak_gib=round(program_peak, 3), resident_gib=round(resident / GIB, 3),
              args_gib=round(args, 3), out_gib=round(out, 3), temp_gib=round(temp, 3),
              alias_gib=round(alias, 3), flops=flops, bytes=nbytes,
              **_times(flops, nbytes, chip),
              compile_s=round(compile_s, 2), fits=peak <= HBM_LIMIT * chip.hbm_gib)


def _add_attention_kernel(row: dict[str, Any] | None, chip: ChipSpec, cfg: ModelConfig,
                          learner, mesh: Mesh, rows: int, seq_len: int, *,
                          backward: bool, log: Callable[[str], None]) -> None:
  """Adds the splash kernel's analytic cost (one microbatch of the learner) to ``row``."""
  lc = learner.config
  if row is None or row.get("roofline_ms") is None or lc.attention != "splash":
    return
  _, repeats = head_layout(cfg.num_heads, cfg.num_kv_heads, mesh.shape.get("model", 1))
  layers = cfg.num_layers       # a scanned stack's row already counts every layer
  cost = kernel_cost(rows=rows, seq_len=seq_len, num_heads=cfg.num_heads,
                     num_kv_heads=cfg.num_kv_heads * repeats, head_dim=cfg.head_dim,
                     block=lc.attention_block, itemsize=jnp.dtype(learner.compute_dtype).itemsize,
                     backward=backward, recompute_forward=backward and lc.remat != "none",
                     devices=len(mesh.devices.flat))
  row["kernel_flops"] = layers * cost["flops"]
  row["kernel_bytes"] = layers * cost["bytes"]
  row["flops"] += row["kernel_flops"]
  row["bytes"] += row["kernel_bytes"]
  row.update(_times(row["flops"], row["bytes"], chip))
  log(f"    + splash kernel (analytic, XLA cannot see it): {row['kernel_flops'] / 1e12:.2f} "
      f"TFLOP, {row['kernel_bytes'] / 1e9:.2f} GB -> {row['flops'] / 1e12:.2f} TFLOP, "
      f"{row['bytes'] / 1e9:.2f} GB, roofline {row['roofline_ms']:.2f} ms")


def _per_layer_cost(config: RunConfig, cfg: ModelConfig, dtype, mesh: Mesh, learner,
                    program: str, shape: tuple[int, int, int]) -> dict[str, float]:
  """XLA's FLOPs and bytes of one decoder layer of a learner ``program`` ("train" or
  "ref") at ``shape``: the unrolled programs of 2-layer and 1-layer copies of the model,
  differenced. XLA counts a scanned layer stack once, so a scanned program's figure plus
  ``num_layers - 1`` of these is the whole stack's."""
  lc = dataclasses.replace(learner.config, scan_layers=False)
  costs, start = [], time.perf_counter()
  for layers in (1, 2):
    small = abstract_model(dataclasses.replace(cfg, num_layers=layers), dtype, mesh=mesh)
    probe = Learner(small, lc, learner.row_buckets, config.rollout.prompt_buckets,
                    config.rollout.response_buckets, mesh=mesh)
    compile_program = probe.compile_train if program == "train" else probe.compile_reference
    costs.append(_cost(compile_program(*shape)))
  return dict(flops=costs[1][0] - costs[0][0], bytes=costs[1][1] - costs[0][1],
              compile_s=round(time.perf_counter() - start, 2))


def _scale_layers(row: dict[str, Any] | None, per_layer: dict[str, float], layers: int,
                  chip: ChipSpec, log: Callable[[str], None]) -> None:
  """Adds ``layers - 1`` layers of ``per_layer`` cost to a scanned program's ``row``."""
  if row is None or row.get("roofline_ms") is None:
    return
  row["flops"] += (layers - 1) * per_layer["flops"]
  row["bytes"] += (layers - 1) * per_layer["bytes"]
  row["layers_scaled"] = dict(layers=layers, **per_layer)
  row.update(_times(row["flops"], row["bytes"], chip))
  log(f"    + {layers - 1} more scanned layers at {per_layer['flops'] / 1e12:.3f} TFLOP, "
      f"{per_layer['bytes'] / 1e9:.2f} GB each (2- minus 1-layer unrolled, "
      f"{per_layer['compile_s']:.0f} s) -> roofline {row['roofline_ms']:.2f} ms")


def _failed(name: str, err: Exception, chip: ChipSpec, compile_s: float) -> dict[str, Any]:
  """A compile that failed (RESOURCE_EXHAUSTED when a program cannot fit)."""
  message = str(err).splitlines()[0][:300]
  return dict(name=name, peak_gib=None, hbm_gib=chip.hbm_gib, flops=0.0, bytes=0.0,
              roofline_ms=None, compile_s=round(compile_s, 2), fits=False, error=message)


class _Compiler:
  """Compiles named thunks, timing each, printing one progress line per executable."""

  def __init__(self, chip: ChipSpec, log: Callable[[str], None],
               resident: dict[str, float] | None = None):
    self.chip = chip
    self.log = log
    self.resident = resident or {}
    self.rows: list[dict[str, Any]] = []

  def _resident_for(self, name: str) -> float:
    for prefix, value in self.resident.items():
      if prefix and name.startswith(prefix):
        return value
    return self.resident.get("", 0.0)

  def __call__(self, name: str, thunk: Callable[[], Any], *,
               hbm: bool = False) -> dict[str, Any] | None:
    """``hbm``: also estimate the program's HBM traffic from its compiled HLO
    (``hbm_traffic``; loop-free programs only): ``hbm_bytes`` / ``hbm_ms``."""
    self.log(f"  compiling {name} ...")
    start = time.perf_counter()
    try:
      compiled = thunk()
    except Exception as err:  # XLA raises its own error types for RESOURCE_EXHAUSTED
      row = _failed(name, err, self.chip, time.perf_counter() - start)
      self.log(f"    FAILED after {row['compile_s']:.1f} s: {row['error']}")
      self.rows.append(row)
      return row
    if compiled is None:
      return None
    row = _analyse(name, compiled, self.chip, time.perf_counter() - start,
                   self._resident_for(name))
    self.log(f"    {row['compile_s']:6.1f} s  peak {row['peak_gib']:6.2f} / {row['hbm_gib']:g} GiB"
             f"  {row['flops'] / 1e12:8.2f} TFLOP  {row['bytes'] / 1e9:8.2f} GB"
             f"  roofline {row['roofline_ms']:9.2f} ms" + ("" if row["fits"] else "  DOES NOT FIT"))
    if hbm:
      row["hbm_bytes"] = hbm_traffic(compiled.as_text())["bytes"]
      row["hbm_ms"] = _times(0.0, row["hbm_bytes"], self.chip)["memory_ms"]
      self.log(f"    HBM traffic (estimated from the compiled HLO): "
               f"{row['hbm_bytes'] / 1e9:.2f} GB, {row['hbm_ms']:.2f} ms")
    self.rows.append(row)
    return row


def _learner_shapes(learner, largest_only: bool) -> list[tuple[int, int, int]]:
  """The learner microbatch shapes to compile: the largest; or, per sequence length, the
  largest row count (packed microbatches of fewer rows need less of everything)."""
  shapes = learner.batch_shapes()
  if largest_only:
    return [max(shapes, key=lambda s: (s[0] * s[1], s))]
  if learner.config.packing:
    return [max(s for s in shapes if s[1] == t) for t in sorted({s[1] for s in shapes})]
  return shapes


def _sampler_kinds(parts: RLComponents, largest_only: bool):
  kinds = [("sampler", parts.sampler), ("eval_greedy", parts.eval_sampler),
           ("eval_sampled", parts.eval_sampled_sampler)]
  for kind, sampler in kinds:
    rows = sorted({sampler.call_rows(b) for b in sampler.row_buckets})
    rows = rows[-1:] if largest_only else rows
    prompts = sampler.prompt_buckets[-1:] if largest_only else sampler.prompt_buckets
    for r in rows:
      for p in prompts:
        yield kind, sampler, r, p


def compile_report(config: Any, topology: str, *,
                   model_config: str | None = None, largest_only: bool = False,
                   only: str | None = None, refill_slots_search: Sequence[int] = (),
                   log: Callable[[str], None] = print) -> dict[str, Any]:
  """Compiles the run's executables for ``topology``; returns the report dict.

  ``only``: ``"learner"`` or ``"samplers"`` compiles one side (no step projection).
  ``refill_slots_search``: slot counts the refill sampler is tried with
  (``refill_report.search_slots``); the fastest within 1.3x of its bound on every
  length model is compiled and reported.
  """
  if only not in (None, "learner", "samplers"):
    raise ValueError(f"only={only!r} is not one of (None, 'learner', 'samplers')")
  if refill_slots_search:
    if only == "learner":
      raise ValueError(f"refill_slots_search={tuple(refill_slots_search)} sizes the refill "
                       "sampler, which only='learner' does not compile")
    if not config.rollout.refill_slots:
      raise ValueError(f"refill_slots_search={tuple(refill_slots_search)}: the config's "
                       "rollout.refill_slots is 0 (no refill sampler to size); set it to "
                       "one of the candidates")
    if config.rollout.kv_pages:
      raise ValueError(f"refill_slots_search={tuple(refill_slots_search)} sizes the pool "
                       f"per candidate: set rollout.kv_pages=0 (it is "
                       f"{config.rollout.kv_pages})")
    bad = [s for s in refill_slots_search if isinstance(s, bool) or not isinstance(s, int)
           or s <= 0]
    if bad:
      raise ValueError(f"refill_slots_search={tuple(refill_slots_search)}: {bad} are not "
                       "positive ints")
  config = sizing_config(config)
  path = model_config_path(config, model_config)
  cfg = ModelConfig.from_hf_dict(read_json(path))
  mesh, chip = topology_mesh(topology, config.mesh.shape, config.mesh.axes)
  dtype = jnp.bfloat16 if config.model.dtype == "bfloat16" else jnp.float32
  model = abstract_model(cfg, dtype, mesh=mesh)
  stop_ids = tuple(cfg.eos_token_ids) or (0,)
  pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
  parts = build_components(config, model, mesh, stop_ids=stop_ids, pad_id=pad_id)
  learner = parts.learner
  lc = learner.config
  log(f"AOT compile for {topology}: {len(mesh.devices.flat)} devices, mesh "
      f"{dict(mesh.shape)}, {chip.name} {chip.hbm_gib:g} GiB HBM / device; model "
      f"{path.name} ({cfg.num_layers} layers, {dtype.__name__}); scan_layers={lc.scan_layers}, "
      f"remat={lc.remat}, attention={lc.attention}, fsdp={lc.fsdp}")
  compile_one = _Compiler(chip, log, _resident_bytes(model, learner))

  learner_side = only in (None, "learner")
  if learner_side:
    compile_one("learner_sync", learner.compile_sync)
    compile_one("learner_apply", learner.compile_apply)
  row_buckets = learner.row_buckets[-1:] if largest_only else learner.row_buckets
  for rows in (row_buckets if learner_side else ()):
    compile_one(f"learner_prepare[rows={rows}]", lambda: learner.compile_prepare(rows))
  train_rows: dict[tuple, dict] = {}
  for r, t, n in (_learner_shapes(learner, largest_only) if learner_side else ()):
    tag = f"rows={r},seq={t},targets={n}"
    pair = {"train": compile_one(f"learner_train[{tag}]", lambda: learner.compile_train(r, t, n))}
    if learner.reference is not None:
      pair["ref"] = compile_one(f"learner_ref[{tag}]",
                                lambda: learner.compile_reference(r, t, n))
    for program, row in pair.items():
      if lc.scan_layers and row is not None and row.get("roofline_ms") is not None:
        _scale_layers(row, _per_layer_cost(config, cfg, dtype, mesh, learner, program,
                                           (r, t, n)), cfg.num_layers, chip, log)
      _add_attention_kernel(row, chip, cfg, learner, mesh, r, t, backward=program == "train",
                            log=log)
    train_rows[(r, t, n)] = pair

  decode: dict[str, dict] = {}
  generate: dict[str, dict] = {}
  samplers = _sampler_kinds(parts, largest_only) if only in (None, "samplers") else ()
  refill: dict[str, Any] | None = None
  for kind, sampler, r, p in samplers:
    if kind == "sampler" and sampler.refill is not None:
      if refill is None:           # the refill programs, once (they serve every bucket)
        search, pool = (None, None) if not refill_slots_search else search_slots(
            compile_one, config, sampler, model, chip, HBM_LIMIT, refill_slots_search, log)
        refill = refill_rows(compile_one, sampler, model, chip, HBM_LIMIT, log, pool)
        if search is not None:
          refill["slot_search"] = search
      continue
    # The fused program: every row decodes to the cap over the full cache, the worst
    # case of the segmented sampler too, so the projection below uses it.
    generate[kind] = compile_one(f"{kind}[rows={r},prompt={p}]",
                                 lambda: sampler.compile(model, r, p))
    seg = sampler.segmented
    largest = r == sampler.call_rows(sampler.row_buckets[-1]) and p == sampler.prompt_buckets[-1]
    if seg is not None and largest:
      for key in seg.peak_keys(r, p, sampler.group_sizes_for(r)):
        compile_one(f"{kind}_segmented_{key[0]}{list(key[1:])}",
                    lambda key=key: seg.compile(key, nnx.state(model)))
    if largest and kind != "eval_sampled":
      decode[kind] = compile_one(f"{kind}_decode_step[rows={r},prompt={p}]",
                                 lambda: sampler.compile_decode_step(model, r, p), hbm=True)
      # Ideal decode step: read this device's share of the weights and of a full cache
      # (the live cache of the rollout's last token, the fused program's every step).
      ideal = (_per_device_bytes(nnx.state(model))
               + _per_device_bytes(sampler.abstract_cache(r, p)))
      row = decode[kind]
      if row and row.get("bytes"):
        row.update(ideal_bytes=ideal, ideal_ms=_times(0.0, ideal, chip)["memory_ms"],
                   bytes_over_ideal=row["bytes"] / ideal, hbm_over_ideal=row["hbm_bytes"] / ideal)

  executables = compile_one.rows
  # Probes (the refill pool's sizing compiles) size; the compiles after them decide.
  fits = all(e["fits"] for e in executables if not e.get("probe"))
  report: dict[str, Any] = dict(
      topology=topology, devices=len(mesh.devices.flat), mesh=dict(mesh.shape),
      chip=dict(name=chip.name, hbm_gib=chip.hbm_gib, bf16_tflops=chip.bf16_tflops,
                hbm_gbps=chip.hbm_gbps, source=chip.source),
      model_config=str(path), num_layers=cfg.num_layers, dtype=config.model.dtype,
      learner=dict(remat=lc.remat, scan_layers=lc.scan_layers, attention=lc.attention,
                   attention_block=lc.attention_block, logits_chunk=lc.logits_chunk,
                   fsdp=lc.fsdp, mini_batches=lc.mini_batches, grad_accum=lc.grad_accum,
                   epochs=lc.epochs),
      # The rollout budget the projection assumes (``simulate --trace --cost aot:`` replays
      # traces under it).
      rollout=dict(mode=config.rollout.mode, rollouts_per_step=config.rollout.rollouts_per_step,
                   prompts_per_step=config.rollout.prompts_per_step,
                   max_new_tokens=config.rollout.max_new_tokens,
                   prompt_buckets=list(config.rollout.prompt_buckets),
                   group_sizes=list(config.group_sizes()),
                   dynamic_max_rounds=lc.dynamic_max_rounds),
      largest_only=largest_only, only=only, hbm_limit_fraction=HBM_LIMIT,
      executables=executables, fits=fits,
      not_fitting=[e["name"] for e in executables if not e["fits"] and not e.get("probe")],
      compile_s_total=round(sum(e["compile_s"] + e.get("layers_scaled", {}).get("compile_s", 0)
                                for e in executables), 1),
      # The LM-head chunk loop is a loop too: 1 of this many chunks is in the figures.
      logits_chunks_counted_once=-(-max(s[2] for s in learner.batch_shapes())
                                   // lc.logits_chunk))
  projection = None if refill is None else refill_projection(config, parts.sampler, refill)
  if refill is not None:
    report["refill"] = refill_summary(refill, projection)
  report.update(project_step(config, parts, train_rows, generate, decode, executables,
                             projection))
  return report
