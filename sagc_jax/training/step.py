"""One synchronous RL step with straggler-aware group control::

    plan = controller.plan(context)                         # G, or a size per prompt
    prompts = loader.next_batch(P(G))                       # P = prompts or rollouts / G
    samples = sampler.generate(policy, prompts, G)          # + per-group max / median, from
                                                            #   the in-jit host callback
    rewards = reward_fn(decoded responses, answers)         # host, as rows finish (overlaps
                                                            #   the tail's decoding)
    batch = rollout_batch(samples, rewards)                 # DAPO: rounds of informative groups
    learner.update(batch)                                   # advantages, loss, optax
    controller.observe_step(max, median of every round's groups)   # + prompt ids, rewards,
                                                            #   the step's seconds

Every controller kind is called through one protocol (``control.protocol``). The
contextual kinds (docs/controllers.md) read the step's upcoming prompts when they
plan (``BatchContext``: the loader's next prompts, peeked without advancing it,
their source indices as stable ids and their token lengths) and each group's prompt
id and pass rate when they observe.

Each sampling round returns its batch together with its statistics (``RoundStats``):
the controller's observations travel as an explicit value of the round, not through
shared state a caller must remember to drain. Everything random is a function of
``(config.seed, step, round)``, so a resumed run redraws exactly what the
uninterrupted one drew. The loop around this step (evaluation, metrics, checkpoints,
signals) is ``sagc_jax.training.loop``.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, ContextManager

import jax
import numpy as np

from sagc_jax.runtime import compilation
from sagc_jax.runtime import distributed
from sagc_jax.runtime.stop import StopRequested
from sagc_jax.training.build import RLComponents, rollout_batch
from sagc_jax.control.context import BatchContext
from sagc_jax.control.protocol import GroupController, StepGroups, StepTime
from sagc_jax.control.stragglers import step_straggler_stats
from sagc_jax.data import PromptLoader
from sagc_jax.runtime.seeding import seed_for
from sagc_jax.rl.dynamic_sampling import collect_informative_groups
from sagc_jax.rewards.mix import MixedReward
from sagc_jax.rewards.streaming import StreamingScorer
from sagc_jax.rl.rollout import RolloutBatch
from sagc_jax.training.inputs import RunInputs

__all__ = ["RLStep", "RoundStats", "StepResult", "metrics_row", "step_groups"]


@dataclasses.dataclass
class StepResult:
  """What one step returns to the loop: its metrics row and a few sampled
  completions (the first round's) for the completion log."""
  row: dict[str, Any]
  completions: list[dict[str, Any]]


@dataclasses.dataclass
class RoundStats:
  """What one sampling round tells the step besides its batch: the controller's
  observations (per real group, delivered by the sampler's host callback and shared
  across processes), the real rows' lengths and rewards, and its timings."""
  group_max: np.ndarray
  group_median: np.ndarray
  lengths: np.ndarray
  rewards: MixedReward       # of every real row, gathered from every process
  prompt_ids: np.ndarray     # [groups] int64, the prompts' source indices (stable ids)
  group_sizes: np.ndarray    # [groups] int64, rows per group
  records: list[dict[str, Any]]   # a few of this process's completions, for the log
  decode_slots: int
  rollout_s: float             # sampling, with any scoring that overlapped it
  reward_s: float              # scoring after sampling returned: what the step waits for
  reward_overlapped_s: float = 0.0   # scoring of finished rows while the rest decoded


class RLStep:
  """propose -> sample -> reward -> advantages and update -> observe, as one call."""

  def __init__(self, inputs: RunInputs, components: RLComponents,
               controller: GroupController, loader: PromptLoader):
    self.inputs = inputs
    self.config = inputs.config
    self.components = components
    self.controller = controller
    self.loader = loader

  def sample_round(self, step: int, g: int, round_index: int,
                   group_sizes: np.ndarray | None = None) -> tuple[RolloutBatch, RoundStats]:
    """One sampling round of P(G) fresh prompts for the step after ``step``, scored.

    Each process reads, encodes, decodes and scores its own share of the
    prompts (``P / process_count``, contiguous in process order); prompt ids
    and rewards are gathered so that every process holds the whole batch.
    ``group_sizes`` (``per_prompt``): rows per prompt, in that (process-major)
    order, instead of G each.
    """
    inputs = self.inputs
    t0 = time.perf_counter()
    processes, me = jax.process_count(), jax.process_index()
    share = self.config.rollout.prompts_for(g) // processes
    if group_sizes is not None:
      # A plan's sizes cover the prompts it consumes (on one process: its kind's
      # ``needs.one_process``); a size of 0 is a skipped prompt, consumed, not sampled.
      consumed = self.loader.next_indices(len(group_sizes))
      group_sizes = np.asarray(group_sizes, np.int64)
      indices = [i for i, size in zip(consumed, group_sizes) if size > 0]
      group_sizes = group_sizes[group_sizes > 0]
      share = len(indices)
    else:
      indices = self.loader.next_indices(share)
    local = [self.loader.source[i] for i in indices]
    prompts = distributed.allgather_token_lists(inputs.encode(local), inputs.pad_id)
    sizes = (np.full(share * processes, g, np.int64) if group_sizes is None
             else np.asarray(group_sizes, np.int64))
    # The example of each of this process's rows, which start at ``first_row``.
    owner = np.repeat(np.arange(len(local)), sizes[me * share:(me + 1) * share])
    first_row = int(sizes[:me * share].sum())
    overlap = self.config.rollout.overlap_rewards
    scorer = self._scorer(local, owner, first_row, background=overlap)
    try:
      samples = self.components.sampler.generate(
          inputs.model, prompts, g, seed=seed_for(self.config.seed, step, round_index),
          listener=scorer if overlap else None, group_sizes=group_sizes)
      t1 = time.perf_counter()
      texts, own = scorer.finish(samples.response_tokens, samples.lengths)
    except BaseException as err:   # a slow reward chunk must not hold up a stop
      scorer.close(wait=not isinstance(err, StopRequested))
      raise
    scorer.close()
    rewards = MixedReward(*(distributed.allgather_rows(x) for x in own))
    t2 = time.perf_counter()
    group_max, group_median = distributed.share_sink_stats(
        samples.group_max, samples.group_median, num_groups=samples.num_prompts)
    records = self._completion_records(local, owner, me * share, texts, own,
                                       samples.lengths[first_row:])
    stats = RoundStats(group_max=group_max, group_median=group_median,
                       lengths=samples.lengths[:samples.num_rows], rewards=rewards,
                       prompt_ids=distributed.allgather_rows(np.asarray(indices, np.int64)),
                       group_sizes=sizes, records=records, decode_slots=samples.decode_slots,
                       rollout_s=t1 - t0, reward_s=t2 - t1,
                       reward_overlapped_s=scorer.overlapped_s)
    return rollout_batch(samples, rewards.scores), stats

  def _scorer(self, local: list[dict], owner: np.ndarray, first_row: int,
              background: bool) -> StreamingScorer:
    """The round's scorer of this process's rows (``first_row`` on, row i of example
    ``owner[i]``), on a worker thread when ``background`` and the reward allows it."""
    answers = [local[i]["answer"] for i in owner]
    prompts = [local[i]["prompt"] for i in owner]
    fields = {key: [local[i][key] for i in owner]
              for key in (local[0] if local else {}) if key != "prompt"}

    def score(rows, texts):
      pick = lambda values: [values[r] for r in rows]
      return self.inputs.reward_fn(texts, pick(answers), prompts=pick(prompts),
                                   fields={k: pick(v) for k, v in fields.items()})
    return StreamingScorer(range(first_row, first_row + len(answers)), self.inputs.detokenize,
                           score,
                           background=background and not self.inputs.reward_fn.needs_main_thread)

  def _completion_records(self, local: list[dict], owner: np.ndarray, first_group: int,
                          texts: list[str], own: MixedReward,
                          lengths: np.ndarray) -> list[dict[str, Any]]:
    """``train.log_completions`` of this process's completions (``lengths`` from its
    first row on), evenly spread over its rows (so both ends of the batch show), as
    (prompt, completion, reward) records."""
    count = min(self.config.train.log_completions, len(texts))
    if count <= 0:
      return []
    names = self.inputs.reward_fn.term_names
    out = []
    for r in np.linspace(0, len(texts) - 1, count).round().astype(int):
      terms = {n: float(v) for n, v in zip(names, own.terms[r]) if not np.isnan(v)}
      example = local[owner[r]]
      out.append({"group": int(first_group + owner[r]), "prompt": example["prompt"],
                  "completion": texts[r], "answer": example["answer"],
                  "reward": float(own.scores[r]), "terms": terms,
                  "correct": bool(own.correct[r]), "length": int(lengths[r])})
    return out

  def __call__(self, step: int, log: Callable[[str], None],
               phase: Callable[[str], ContextManager]) -> StepResult:
    """Runs the step after ``step`` (steps done so far): its metrics row and completions.

    ``phase(part)`` wraps the step's two parts, ``"rollout"`` (propose, sample, score)
    and ``"update"`` (the learner): the trainer's stop-signal handling
    (``training.loop``) may abandon the first and not always the second."""
    start = time.perf_counter()
    compiles_before = collections.Counter(compilation.counts_by_function())
    with phase("rollout"):
      batch, rounds, g, rows = self._rollout(step, log)
    learner_metrics: dict[str, float] = {}
    t_learn = time.perf_counter()
    if batch is not None:
      with phase("update"):
        learner_metrics = self.components.learner.update(batch, seed=self.config.seed)
    time_learner = time.perf_counter() - t_learn
    # Process 0's seconds on every process: every process's controller decides alike,
    # and a time budget (train.time_budget_s) ends every process at the same step.
    rollout_s, time_learner, time_total = (float(x) for x in distributed.allgather_rows(
        np.array([[sum(r.rollout_s + r.reward_s for r in rounds), time_learner,
                   time.perf_counter() - start]]))[0])
    groups = step_groups(rounds, StepTime(rollout_s, time_learner, time_total))
    controller = self.config.controller
    measured = step_straggler_stats(groups.group_max, groups.group_median, groups.group_sizes,
                                    tau=controller.tau, event=controller.event)
    diagnostics = self.controller.observe_step(groups)   # the one place it observes
    compiled = collections.Counter(compilation.counts_by_function()) - compiles_before
    if compiled:     # after warm-up every program should exist: name what did not
      log(f"step {step + 1}: {sum(compiled.values())} new compilation(s): "
          + ", ".join(f"{name} x{n}" for name, n in sorted(compiled.items())))
    row = metrics_row(step + 1, {**measured, **diagnostics}, groups, rounds,
                      prompts=self.config.rollout.prompts_for(g), rows=rows,
                      learner_metrics=learner_metrics, update_skipped=batch is None,
                      time_learner=time_learner, time_total=time_total,
                      compiled=compiled, term_names=self.inputs.reward_fn.term_names)
    # The first round's sampled completions, for the run's completion log.
    return StepResult(row, rounds[0].records)

  def _rollout(self, step: int, log) -> tuple[RolloutBatch | None, list[RoundStats], int, int]:
    """(batch, its rounds' statistics, G, row bucket) of the step after ``step``."""
    learner = self.components.learner
    plan = self.controller.plan(self._batch_context)
    g, sizes = plan.group_size, plan.sizes
    if sizes is not None:
      # Sizes per prompt of the context (in the step's prompt order; such a plan runs
      # on one process: its kind's ``needs.one_process``).
      distributed.assert_same_on_all(int(sizes @ np.arange(1, sizes.size + 1)),
                                     f"the group sizes of step {step + 1}")
    distributed.assert_same_on_all(g, f"the group size of step {step + 1}")
    rows = self.components.sampler.row_bucket_for(self.config.rollout.prompts_for(g) * g)
    lc = learner.config
    if lc.dynamic_sampling:
      # Extra rounds (prompts past the proposal's context) take the base size.
      result = collect_informative_groups(
          lambda i: self.sample_round(step, g, i, sizes if i == 0 else None),
          lambda b: learner.prepare(b)[1],
          target_groups=self.config.rollout.prompts_for(g), rows=rows,
          max_rounds=lc.dynamic_max_rounds)
      batch, rounds = result.batch, result.round_stats
      if result.message:
        log(f"step {step + 1}: {result.message}")
    else:
      batch, first = self.sample_round(step, g, 0, sizes)
      rounds = [first]
    return batch, rounds, g, rows

  def _batch_context(self) -> BatchContext:
    """The prompts the loader hands out next, as many as the candidate needing most
    takes, with their source indices and token lengths; gathered over processes and
    interleaved (each process's first, then each one's second, ...), so that the first
    P(G) are exactly the prompts a step at size G samples (each process its first
    P(G) / processes)."""
    most = max(self.config.rollout.prompts_for(g) for g in self.config.group_sizes())
    most *= self.config.controller.needs.peek     # a kind that skips looks further
    processes = jax.process_count()
    ids = np.asarray(self.loader.peek_indices(most // processes), np.int64)
    tokens = self.inputs.encode([self.loader.source[i] for i in ids])
    lengths = np.asarray([len(t) for t in tokens], np.int64)
    interleave = lambda x: distributed.allgather_rows(x).reshape(processes, -1).T.reshape(-1)
    return BatchContext(interleave(ids), interleave(lengths))


def step_groups(rounds: list[RoundStats], seconds: StepTime | None = None) -> StepGroups:
  """What the controller observes of a step: every round's groups, in order, with their
  rewards, and the step's ``seconds``."""
  sizes = np.concatenate([r.group_sizes for r in rounds])
  correct = np.concatenate([r.rewards.correct for r in rounds]).astype(np.float64)
  scores = np.concatenate([r.rewards.scores for r in rounds]).astype(np.float64)
  return StepGroups(np.concatenate([r.group_max for r in rounds]),
                    np.concatenate([r.group_median for r in rounds]),
                    prompt_ids=np.concatenate([r.prompt_ids for r in rounds]),
                    pass_rates=np.add.reduceat(correct, np.cumsum(sizes) - sizes) / sizes,
                    group_sizes=sizes, rewards=np.split(scores, np.cumsum(sizes)[:-1]),
                    time=seconds)


def metrics_row(step: int, controller_metrics: dict[str, float], groups: StepGroups,
                rounds: list[RoundStats], *, prompts: int, rows: int,
                learner_metrics: dict[str, float], update_skipped: bool,
                time_learner: float, time_total: float, compiled: dict[str, int],
                term_names: tuple[str, ...]) -> dict[str, Any]:
  """The metrics row of step ``step``: a function of what the step produced."""
  lengths = np.concatenate([r.lengths for r in rounds])
  rewards = MixedReward(*map(np.concatenate, zip(*(r.rewards for r in rounds))))
  generated = float(lengths.sum())
  decode_slots = float(sum(r.decode_slots for r in rounds))
  # Groups whose rewards vary carry a gradient (GRPO's advantages are zero elsewhere;
  # DAPO keeps up to ``prompts`` of them): the learning signal a second buys.
  varied = sum(float(np.ptp(r) > 0) for r in groups.rewards if r.size)
  row = {"step": step, **controller_metrics}
  row.update(
      time_rollout_s=sum(r.rollout_s for r in rounds),
      time_reward_s=sum(r.reward_s for r in rounds),
      time_reward_overlapped_s=sum(r.reward_overlapped_s for r in rounds),
      time_learner_s=time_learner, time_total_s=time_total,
      generated_tokens=generated, decode_slots=decode_slots,
      # Decode iterations: each round decodes until its longest row is done.
      decode_longest=float(sum(r.lengths.max() for r in rounds if r.lengths.size)),
      informative_groups=min(varied, float(prompts)),
      padding_efficiency=generated / decode_slots if decode_slots else 0.0,
      reward_mean=float(rewards.scores.mean()), accuracy=float(rewards.correct.mean()),
      format_rate=float(rewards.formatted.mean()),
      response_len_mean=float(lengths.mean()), response_len_median=float(np.median(lengths)),
      response_len_max=float(lengths.max()),
      # The straggler statistic itself (the event is ratio > tau), averaged over groups.
      group_max_over_median=float(np.mean(groups.group_max
                                          / np.maximum(groups.group_median, 1.0))),
      sampling_rounds=float(len(rounds)), prompts=float(prompts), rows=float(rows),
      rollouts=float(lengths.size), new_compilations=float(sum(compiled.values())),
      update_skipped=float(update_skipped))
  for j, name in enumerate(term_names):
    applicable = rewards.terms[:, j][~np.isnan(rewards.terms[:, j])]
    if applicable.size:              # left out when no completion had a value
      row[f"reward/{name}"] = float(applicable.mean())
  row["reward/errors"] = float(rewards.errors.sum())
  row.update({f"learner/{k}": v for k, v in learner_metrics.items()})
  return row
