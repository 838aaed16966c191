"""The compiled parts of a training run, built from a config: samplers and learner.

One function decides every shape the run will compile (row buckets per candidate G,
eval batch rows, prompt and response buckets) and builds the rollout sampler, the
greedy and sampled eval samplers and the learner. The trainer calls it with the real
policy; ``sagc_jax.aot`` calls it with an abstract policy on an abstract TPU mesh, so
the executables it sizes are exactly the ones a run compiles.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from jax.sharding import Mesh

from sagc_jax.config import RunConfig
from sagc_jax.models.transformer import Transformer
from sagc_jax.rl.learner import Learner
from sagc_jax.rl.rollout import RolloutBatch
from sagc_jax.sampling import Sampler, SamplingParams, row_buckets_for
from sagc_jax.sampling.sampler import SampleBatch

__all__ = ["RLComponents", "build_components", "build_eval_samplers", "largest_host_gather",
           "rollout_batch"]


@dataclasses.dataclass
class RLComponents:
  sampler: Sampler                 # rollouts, one row bucket per candidate G
  eval_sampler: Sampler            # greedy held-out evaluation
  eval_sampled_sampler: Sampler    # sampled held-out evaluation (rollout temperature)
  learner: Learner
  row_buckets: tuple[int, ...]


def _sampler_options(config: RunConfig, mesh: Mesh) -> dict:
  """Sampler keyword arguments every sampler of a run shares."""
  r = config.rollout
  data_axis = mesh.shape["data"]
  limit = r.max_rows_per_call or None
  if limit and limit % data_axis:
    raise ValueError(f"rollout.max_rows_per_call={limit} does not divide evenly over the "
                     f"mesh 'data' axis of size {data_axis}")
  return dict(mesh=mesh, max_rows_per_call=limit,
              decode_segment=None if r.decode_segment < 0 else r.decode_segment,
              compaction=r.compaction, min_compact_rows=r.min_compact_rows)


def build_eval_samplers(config: RunConfig, model: Transformer, mesh: Mesh, *,
                        stop_ids: Sequence[int], pad_id: int) -> tuple[Sampler, Sampler]:
  """The greedy and the sampled held-out evaluation samplers (all ``eval`` needs)."""
  r = config.rollout
  data_axis = mesh.shape["data"]
  common = _sampler_options(config, mesh)
  eval_rows = -(-r.eval_batch // data_axis) * data_axis
  eval_params = dict(stop_ids=stop_ids, pad_id=pad_id)
  # Evaluation runs a few times per run: by default it uses the fused sampler, whose
  # one executable per shape compiles far faster than the segmented set.
  if not r.segmented_eval:
    common = dict(common, decode_segment=0)
  greedy = Sampler(model, SamplingParams(r.max_new_tokens, temperature=0.0, **eval_params),
                   (eval_rows,), r.prompt_buckets, **common)
  # Sampled evaluation has its own fixed batch layout, so its random numbers do not
  # depend on the G buckets: every arm of a comparison draws the same ones.
  # Its groups are 1 sample per example, or train.eval_k for pass@k (the segmented
  # sampler compiles per group size).
  k = config.train.eval_k
  sampled = Sampler(model, SamplingParams(
      r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
      **eval_params), (eval_rows,), r.prompt_buckets,
                    group_sizes=(1, k) if k > 1 else (1,), **common)
  return greedy, sampled


def build_components(config: RunConfig, model: Transformer, mesh: Mesh, *,
                     stop_ids: Sequence[int], pad_id: int) -> RLComponents:
  """Samplers and learner for ``config`` (validated) around ``model`` on ``mesh``."""
  r = config.rollout
  data_axis = mesh.shape["data"]
  row_buckets = row_buckets_for(config.group_sizes(), r.prompts_for, multiple_of=data_axis)
  common = _sampler_options(config, mesh)
  sampler = Sampler(model, SamplingParams(
      r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
      stop_ids=stop_ids, pad_id=pad_id), row_buckets, r.prompt_buckets,
      group_sizes=config.group_sizes(), prompts_for=r.prompts_for,
      refill_slots=r.refill_slots, page_size=r.page_size, kv_pages=r.kv_pages or None,
      refill_segment=r.refill_segment or None, paged_kernel=r.paged_kernel, **common)
  eval_sampler, eval_sampled_sampler = build_eval_samplers(config, model, mesh,
                                                           stop_ids=stop_ids, pad_id=pad_id)
  learner_cfg = config.learner
  platform = mesh.devices.flat[0].platform
  if r.refill_slots and r.paged_kernel == "pallas" and platform != "tpu":
    raise ValueError(f"rollout.paged_kernel='pallas' is a TPU kernel and this run's devices "
                     f"are {platform}; use rollout.paged_kernel='xla' (same tokens) off TPU")
  if learner_cfg.attention == "splash" and platform != "tpu":
    # Off TPU the kernel only runs in Pallas' (test) interpreter, orders of magnitude slower.
    raise ValueError(f"learner.attention='splash' is a TPU kernel and this run's devices are "
                     f"{platform}; use learner.attention='blocked' (same result) off TPU")
  learner = Learner(model, learner_cfg, row_buckets, r.prompt_buckets,
                    r.response_buckets, mesh=mesh)
  return RLComponents(sampler, eval_sampler, eval_sampled_sampler, learner, row_buckets)


def largest_host_gather(config: RunConfig, components: RLComponents, reward_terms: int) -> int:
  """Bytes of the largest per-step host gather of a multi-process run: the prompt
  token ids, a per-row value (or the row's reward terms), the per-group length
  stats of one round, or a [rows, sequence] int32/float32 array fetched from the
  devices (sampler tokens, learner log-probs)."""
  import jax

  r = config.rollout
  sizes = config.group_sizes()
  prompts = max(r.prompts_for(g) for g in sizes)
  local = -(-prompts // jax.process_count())
  sequence = max(r.prompt_buckets) + max(r.response_buckets)
  per_row = max(8, 4 * reward_terms)
  return max(local * max(r.prompt_buckets) * 4, local * max(sizes) * per_row,
             2 * prompts * 8, max(components.row_buckets) * sequence * 4 + 4096)


def rollout_batch(samples: SampleBatch, scores: np.ndarray) -> RolloutBatch:
  """The learner's batch from a sampler result and the rewards of its real rows
  (``[samples.num_rows]``): the one place the sampler's and the learner's batch
  types meet."""
  scores = np.asarray(scores, np.float32)
  if scores.shape != (samples.num_rows,):
    raise ValueError(f"scores has shape {scores.shape}, expected ({samples.num_rows},) "
                     "(one reward per real row)")
  padded = np.zeros(samples.row_valid.shape, np.float32)
  padded[:samples.num_rows] = scores
  return RolloutBatch(prompt_tokens=samples.prompt_tokens, prompt_mask=samples.prompt_mask,
                      response_tokens=samples.response_tokens,
                      response_mask=samples.response_mask,
                      old_logprobs=samples.response_logprobs, lengths=samples.lengths,
                      group_ids=samples.group_ids, row_valid=samples.row_valid,
                      scores=padded, group_size=samples.group_size)
