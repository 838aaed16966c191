"""The projected RL step of the AOT report: rollout plus learner, from the compiled
programs' rooflines.

Why a projection and not a measurement: the report compiles for a topology this host
does not have, so the only times it can give are rooflines (``chips.ChipSpec.
roofline_s``). A step is priced at its worst case, every response at the cap: the
dense sampler's calls each decode to the cap, the refill sampler's projection is its
``cap`` length model, and the learner trains the largest microbatch shape.
"""

from __future__ import annotations

from typing import Any

from sagc_jax.training.build import RLComponents

__all__ = ["project_step"]


def _dense_rollout(config, sampler, gen: dict[str, Any], step: dict[str, Any]
                   ) -> tuple[int, float, float | None]:
  """The fused sampler's rollout at the cap: (calls per round, seconds, seconds with
  the decode step's estimated HBM traffic instead of XLA's byte count, which also
  counts on-chip reads of prefetched data: ``hbm_traffic``; None without it)."""
  r = config.rollout
  calls = 1
  for g in config.group_sizes():         # generate's own split, worst G
    bucket = sampler.row_bucket_for(r.prompts_for(g) * g)
    call_rows = sampler.call_rows(bucket)
    per_call = bucket if call_rows == bucket else (call_rows // g) * g
    calls = max(calls, -(-r.prompts_for(g) * g // per_call))

  def seconds(decode_step_ms: float) -> float:
    return calls * (gen["roofline_ms"] + (r.max_new_tokens - 1) * decode_step_ms) / 1e3

  hbm_ms = step.get("hbm_ms")
  return calls, seconds(step["roofline_ms"]), None if hbm_ms is None else seconds(hbm_ms)


def project_step(config, parts: RLComponents, train_rows, generate, decode,
                 executables: list[dict[str, Any]],
                 refill: dict[str, Any] | None = None) -> dict[str, Any]:
  """Projected RL step: rollout at the worst-case length plus the learner's updates.

  Rollout = per sampler call of the largest bucket (several when
  ``rollout.max_rows_per_call`` splits it): prefill + first step (the generate
  executable) + (max_new_tokens - 1) decode steps.
  With the refill sampler (``refill``: ``refill_report.refill_projection``), rollout =
  its projection with every response at the cap (one call; the per-length-model
  projections are in ``report["refill"]``).
  Learner = per minibatch: grad_accum x (reference pass (GRPO) + gradient step of one
  microbatch) + one optimizer update (``learner_apply``).
  """
  lc = parts.learner.config
  if refill is not None:     # the refill sampler's decode step stands for the fused one's
    gen, step = dict(roofline_ms=0.0), dict(roofline_ms=refill["decode_step_ms"])
  else:
    gen, step = generate.get("sampler"), decode.get("sampler")
  largest = max(train_rows, key=lambda s: (s[0] * s[1], s)) if train_rows else None
  train = train_rows[largest].get("train") if largest else None
  if not (gen and step and train) or None in (gen.get("roofline_ms"), step.get("roofline_ms"),
                                             train.get("roofline_ms")):
    return {"projected_step_s": None}
  rounds = 1 + (lc.dynamic_max_rounds - 1 if lc.dynamic_sampling else 0)
  if refill is not None:
    calls, rollout_s, rollout_hbm_s = 1, refill["by_length_model"]["cap"]["seconds"], None
  else:
    calls, rollout_s, rollout_hbm_s = _dense_rollout(config, parts.sampler, gen, step)
  ref = train_rows[largest].get("ref")
  apply = next((e for e in executables if e["name"] == "learner_apply"), None)
  # At the worst case (every response at the cap) a minibatch is grad_accum microbatches
  # of the largest shape, packed or not, then one optimizer update.
  per_minibatch_ms = (lc.grad_accum * (train["roofline_ms"] + (ref["roofline_ms"] if ref
                                                              else 0.0))
                      + (apply["roofline_ms"] if apply and apply.get("roofline_ms") else 0.0))
  learner_s = lc.mini_batches * lc.epochs * per_minibatch_ms / 1e3
  step_s = rollout_s + learner_s
  out: dict[str, Any] = {}
  if rollout_hbm_s is not None:
    out.update(projected_rollout_s_hbm_estimate=rollout_hbm_s,
               projected_step_s_hbm_estimate=rollout_hbm_s + learner_s,
               projected_hours_hbm_estimate=(rollout_hbm_s + learner_s)
               * config.train.steps / 3600)
  out.update(
      projected_rollout_s=rollout_s, projected_learner_s=learner_s, projected_step_s=step_s,
      projected_step_s_dapo_worst=rounds * rollout_s + learner_s, sampler_calls_per_round=calls,
      projected_hours=step_s * config.train.steps / 3600, steps=config.train.steps,
      microbatch_compute_ms=train["compute_ms"], microbatch_roofline_ms=train["roofline_ms"],
      microbatch_roofline_over_compute=(train["roofline_ms"] / train["compute_ms"]
                                        if train["compute_ms"] else None),
      generate_ms=gen["roofline_ms"], decode_step_ms=step["roofline_ms"],
      decode_ideal_ms=step.get("ideal_ms"),
      decode_bytes_over_ideal=step.get("bytes_over_ideal"),
      decode_step_hbm_ms=step.get("hbm_ms"), decode_hbm_over_ideal=step.get("hbm_over_ideal"))
  return out
