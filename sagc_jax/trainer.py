"""The synchronous RL training loop with straggler-aware group control.

Every step::

    G = controller.propose()
    prompts = loader.next_batch(P(G))                       # P = prompts or rollouts / G
    samples = sampler.generate(policy, prompts, G)          # + per-group max / median, from
                                                            #   the in-jit host callback
    rewards = reward_fn(decoded responses, answers)         # host, worker pool
    batch = rollout_batch(samples, rewards)                 # DAPO: rounds of informative groups
    learner.update(batch)                                   # advantages, loss, optax
    controller.observe(max, median of every round's groups)
    metrics row -> metrics.jsonl + TensorBoard; checkpoint every N steps and on SIGTERM
    or a first Ctrl-C

Everything random is a function of ``(config.seed, step)`` and of restored
state (controller RNG, loader position, learner step), so a run killed after
N steps and resumed from its checkpoint reproduces the uninterrupted run's
parameters and metrics exactly (wall-clock timings aside).

The built-in tiny model starts from random weights; with the synthetic task a
short supervised warm start (``sft``) runs first and is cached in the workdir
as an HF checkpoint folder (``<workdir>/sft_model``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from sagc_jax import compile_count, distributed
from sagc_jax.checkpoint import Checkpointer
from sagc_jax.components import (build_components, candidate_group_sizes, prompts_for,
                                 rollout_batch)
from sagc_jax.config import validate
from sagc_jax.controller import controller_from_config
from sagc_jax.data import PromptLoader, load_split
from sagc_jax.mesh import make_mesh
from sagc_jax.metrics import MetricsWriter, read_jsonl, summarize
from sagc_jax.models import encode_prompts, from_pretrained, load_tokenizer
from sagc_jax.models.sharding import abstract_like
from sagc_jax.rewards import make_reward_fn
from sagc_jax.rl.dynamic_sampling import collect_informative_groups
from sagc_jax.rl.rollout import RolloutBatch
from sagc_jax.run_lock import RunLock
from sagc_jax.sampling import Sampler
from sagc_jax.storage import cache_root, local_mirror, run_path, stage
from sagc_jax.warm_start import prepare_policy

@dataclasses.dataclass
class RoundStats:
  """What one sampling round tells the step besides its batch: the controller's
  observations (per real group, delivered by the sampler's host callback and shared
  across processes), the real rows' lengths and rewards, and its timings."""
  group_max: np.ndarray
  group_median: np.ndarray
  lengths: np.ndarray
  scores: np.ndarray
  correct: np.ndarray
  formatted: np.ndarray
  decode_slots: int
  rollout_s: float
  reward_s: float


_TIMING_KEYS = ("time_rollout_s", "time_reward_s", "time_learner_s", "time_total_s",
                "learner_seconds", "eval_seconds")


def _seed_for(*parts: int) -> int:
  """A 32-bit seed derived from integers (stable across runs and resumes)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def config_changes(old: dict, new: dict, prefix: str = "") -> list[str]:
  """``key: old -> new`` for every setting that differs between two config dicts."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, "<unset>"), new.get(key, "<unset>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += config_changes(a, b, f"{prefix}{key}.")
    elif a != b:
      out.append(f"{prefix}{key}: {a!r} -> {b!r}")
  return out


class Trainer:
  """Builds every component from a validated config and runs the step loop."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
               log: Callable[[str], None] | None = None, read_only: bool = False,
               restore: bool = True):
    """``read_only``: a reader of the run (eval): nothing in ``workdir`` is created,
    rewritten, truncated or moved (no config.json, metrics or compilation cache writes;
    damaged checkpoints are skipped in place). ``restore=False`` keeps the policy
    the config names instead of the run's newest checkpoint."""
    validate(config)
    self.read_only = read_only
    self.config = config
    # The workdir may be a bucket (gs://): every run file goes through storage.run_path.
    # Rebuildable files that need a real filesystem (TFDS data, the tiny model's warm
    # start) go to a local mirror; gs:// inputs are staged into the local cache.
    self.workdir = run_path(workdir)
    self.cache_root = cache_root(config.train.local_cache_dir)
    self.local_dir = local_mirror(workdir, self.cache_root)
    self.is_primary = jax.process_index() == 0
    self._lock = None
    if not read_only:
      self.workdir.mkdir(parents=True, exist_ok=True)
      if self.is_primary:         # before anything in the workdir is written
        self._lock = RunLock(self.workdir, log=log or print)
        self._lock.acquire()
    try:
      self._build(config, log, read_only, restore)
    except BaseException:
      # A refused start (a bad config, a checkpoint mismatch) leaves no lock behind.
      if self._lock is not None:
        self._lock.release()
      raise

  def _build(self, config: ml_collections.ConfigDict, log: Callable[[str], None] | None,
             read_only: bool, restore: bool) -> None:
    """The rest of ``__init__``, once the run directory is this trainer's."""
    self.metrics = MetricsWriter(self.workdir, config.train.steps,
                                 enabled=self.is_primary and not read_only,
                                 sync_secs=config.train.metrics_sync_secs,
                                 local_dir=self.local_dir)
    self.log = log or (print if read_only else self.metrics.log)
    compile_count.install()
    if config.train.compilation_cache:
      default_cache = (self.cache_root / "jax_cache") if read_only else self.workdir / "jax_cache"
      cache_dir = config.train.compilation_cache_dir or str(default_cache)
      jax.config.update("jax_compilation_cache_dir", cache_dir)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    self.mesh = make_mesh(config.mesh.shape, config.mesh.axes)
    self.data_axis = self.mesh.shape["data"]

    data_dir = config.data.data_dir or str(self.local_dir / "tfds")
    manual_dir = stage(config.data.manual_dir, self.cache_root, self.log,
                       what="data.manual_dir") or None
    self.model_path = stage(config.model.path, self.cache_root, self.log, what="model.path")
    builder_kwargs = ({"config": config.data.synthetic.to_dict()}
                      if config.data.name == "synthetic" else {})
    load = lambda split: load_split(config.data.name, split, data_dir, manual_dir,
                                    **builder_kwargs)
    # The primary process prepares data and the warm start; the others then read them.
    if self.is_primary:
      load("train")
      load(config.data.eval_split)
    distributed.barrier("sagc_data_prepared")
    self.train_source = load("train")
    self.eval_source = load(config.data.eval_split)
    self.loader = PromptLoader(self.train_source, seed=config.seed,
                               shard_index=jax.process_index(), num_shards=jax.process_count())

    if self.is_primary:
      self._policy_folder()
    distributed.barrier("sagc_policy_prepared")
    folder = self._policy_folder()
    dtype = jnp.bfloat16 if config.model.dtype == "bfloat16" else jnp.float32
    self.model, self.model_cfg = from_pretrained(folder, dtype=dtype, mesh=self.mesh)
    self.tokenizer = load_tokenizer(folder)
    self.reward_fn = make_reward_fn(config.reward.name, config.reward.format_weight,
                                    config.reward.workers)
    self.controller = controller_from_config(config)

    self.candidates = candidate_group_sizes(config)
    processes = jax.process_count()
    uneven = [g for g in self.candidates if self.prompts_for(g) % processes]
    if uneven:
      raise ValueError(f"prompts per step for G={uneven} do not split over {processes} "
                       "processes (each process reads an equal share of the prompts)")
    stop_ids = set(self.model_cfg.eos_token_ids)
    if self.tokenizer.eos_token_id is not None:
      stop_ids.add(int(self.tokenizer.eos_token_id))
    self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                      else 0)
    self._check_prompt_lengths()
    self.components = build_components(config, self.model, self.mesh, stop_ids=stop_ids,
                                       pad_id=self.pad_id)
    self.row_buckets = self.components.row_buckets
    self.sampler = self.components.sampler
    self.eval_sampler = self.components.eval_sampler
    self.eval_sampled_sampler = self.components.eval_sampled_sampler
    self.learner = self.components.learner
    self.checkpointer = Checkpointer(config.train.checkpoint_dir or self.workdir / "checkpoints",
                                     config.train.keep_checkpoints, log=self.log,
                                     read_only=read_only)
    self.step = 0
    self.consecutive_skipped = 0
    self.history: list[dict[str, Any]] = []
    self.eval_history: list[dict[str, Any]] = []
    self._stop_requested = False
    if restore:
      self._restore()
    # Only once the checkpoints are known to fit this config: a refused resume leaves
    # the run's config.json (and everything else) as it was.
    self._write_config()

  # ------------------------------------------------------------------ setup
  def _write_config(self) -> None:
    """Writes config.json, first logging which settings differ from the one there."""
    if not self.is_primary or self.read_only:
      return
    path = self.workdir / "config.json"
    new = self.config.to_json_best_effort(indent=1)
    if path.exists():
      changes = config_changes(json.loads(path.read_text()), json.loads(new))
      if changes:
        self.log(f"{'resuming' if self.step else 'restarting'} with {len(changes)} changed "
                 f"setting(s): " + "; ".join(changes))
    path.write_text(new)

  def _check_prompt_lengths(self, limit: int = 200_000) -> None:
    """Fails at start-up (not mid-run) if a prompt exceeds the largest prompt bucket."""
    largest = max(self.config.rollout.prompt_buckets)
    for name, source in (("train", self.train_source), ("eval", self.eval_source)):
      n = min(len(source), limit)
      for lo in range(0, n, 4096):
        examples = [source[i] for i in range(lo, min(lo + 4096, n))]
        lengths = [len(ids) for ids in self._encode(examples)]
        if max(lengths) > largest:
          i = lo + int(np.argmax(lengths))
          raise ValueError(
              f"rollout.prompt_buckets={tuple(self.config.rollout.prompt_buckets)}: "
              f"{name} example {i} has a {max(lengths)}-token prompt; the largest bucket "
              f"must hold every prompt (add a bucket >= {max(lengths)})")

  def prompts_for(self, g: int) -> int:
    return prompts_for(self.config, g)

  def _policy_folder(self) -> Path:
    """The HF folder the policy starts from (building the tiny model + SFT if needed)."""
    return prepare_policy(self.config, self.local_dir, self.train_source, self.log,
                          model_path=self.model_path)

  # -------------------------------------------------------------- checkpoint
  def _restore(self) -> None:
    restored = self.checkpointer.restore_latest(abstract_like(self.learner.params),
                                                abstract_like(self.learner.opt_state))
    if restored is None:
      self.metrics.truncate_after(0)
      return
    step, params, opt_state, meta = restored
    self.learner.params = params
    self.learner.opt_state = opt_state
    self.learner.step = int(meta["learner_step"])
    self.learner.skipped_updates = int(meta["skipped_updates"])
    self.consecutive_skipped = int(meta.get("consecutive_skipped", 0))
    self.learner.sync_model()
    self.controller.load_state_dict(meta["controller"])
    self.loader.load_state_dict(meta["loader"])
    self.history = list(meta["history"])
    self.eval_history = list(meta["eval_history"])
    self.step = step
    self.metrics.truncate_after(step)
    self.log(f"resumed from checkpoint step {step} in {self.checkpointer.directory}")

  def save_checkpoint(self) -> None:
    meta = {
        "step": self.step,
        "learner_step": self.learner.step,
        "skipped_updates": self.learner.skipped_updates,
        "consecutive_skipped": self.consecutive_skipped,
        "controller": self.controller.state_dict(),
        "loader": self.loader.state_dict(),
        "history": self.history,
        "eval_history": self.eval_history,
    }
    self.checkpointer.save(self.step, self.learner.params, self.learner.opt_state, meta)
    self.metrics.flush()         # the rows of every checkpointed step are durable too

  # ---------------------------------------------------------------- rollouts
  def _encode(self, examples: list[dict]) -> list[list[int]]:
    return encode_prompts(self.tokenizer, [ex["prompt"] for ex in examples],
                          use_chat_template=self.config.data.use_chat_template or None)

  def _decode(self, samples, rows: range | None = None) -> list[str]:
    """Response texts of ``rows`` (default: every real row)."""
    rows = range(samples.num_rows) if rows is None else rows
    return [self.tokenizer.decode(samples.response_tokens[r, :samples.lengths[r]],
                                  skip_special_tokens=True) for r in rows]

  def _sample_round(self, g: int, round_index: int) -> tuple[RolloutBatch, RoundStats]:
    """One sampling round of P(G) fresh prompts, scored: its batch and its statistics
    (the controller's per-group observations as the sampler's host callback delivered
    them, rewards, lengths, timings).

    Each process reads, encodes, decodes and scores its own share of the
    prompts (``P / process_count``, contiguous in process order); prompt ids
    and rewards are gathered so that every process holds the whole batch.
    """
    t0 = time.perf_counter()
    local = self.loader.next_batch(self.prompts_for(g) // jax.process_count())
    prompts = distributed.allgather_token_lists(self._encode(local), self.pad_id)
    samples = self.sampler.generate(self.model, prompts, g,
                                    seed=_seed_for(self.config.seed, self.step, round_index))
    first_row = jax.process_index() * len(local) * g
    own_rows = range(first_row, first_row + len(local) * g)
    texts = self._decode(samples, own_rows)
    t1 = time.perf_counter()
    answers = [ex["answer"] for ex in local for _ in range(g)]
    own = self.reward_fn(texts, answers)
    result = type(own)(*(distributed.allgather_rows(x) for x in own))
    t2 = time.perf_counter()
    group_max, group_median = distributed.share_sink_stats(
        samples.group_max, samples.group_median, num_groups=samples.num_prompts)
    stats = RoundStats(
        group_max=group_max, group_median=group_median,
        lengths=samples.lengths[:samples.num_rows], scores=result.scores,
        correct=result.correct, formatted=result.formatted,
        decode_slots=samples.decode_slots, rollout_s=t1 - t0, reward_s=t2 - t1)
    return rollout_batch(samples, result.scores), stats

  def train_step(self) -> dict[str, Any]:
    """Runs one RL step and returns its metrics row."""
    start = time.perf_counter()
    compiles_before = compile_count.compile_count()
    g = self.controller.propose()
    distributed.assert_same_on_all(g, f"the group size of step {self.step + 1}")
    rows = self.sampler.row_bucket_for(self.prompts_for(g) * g)
    lc = self.learner.config
    message = None
    if lc.dynamic_sampling:
      result = collect_informative_groups(
          lambda i: self._sample_round(g, i), lambda b: self.learner.prepare(b)[1],
          target_groups=self.prompts_for(g), rows=rows, max_rounds=lc.dynamic_max_rounds)
      batch, rounds, message = result.batch, result.round_stats, result.message
      if message:
        self.log(f"step {self.step + 1}: {message}")
    else:
      batch, first = self._sample_round(g, 0)
      rounds = [first]
    learner_metrics: dict[str, float] = {}
    t_learn = time.perf_counter()
    if batch is not None:
      learner_metrics = self.learner.update(batch, seed=self.config.seed)
    time_learner = time.perf_counter() - t_learn
    ctrl = self.controller.observe(np.concatenate([r.group_max for r in rounds]),
                                   np.concatenate([r.group_median for r in rounds]))
    self.step += 1

    lengths = np.concatenate([r.lengths for r in rounds])
    generated = float(lengths.sum())
    decode_slots = float(sum(r.decode_slots for r in rounds))
    row = {"step": self.step, **ctrl}
    row.update(
        time_rollout_s=sum(r.rollout_s for r in rounds),
        time_reward_s=sum(r.reward_s for r in rounds),
        time_learner_s=time_learner, time_total_s=time.perf_counter() - start,
        generated_tokens=generated,
        padding_efficiency=generated / decode_slots if decode_slots else 0.0,
        reward_mean=float(np.concatenate([r.scores for r in rounds]).mean()),
        accuracy=float(np.concatenate([r.correct for r in rounds]).mean()),
        format_rate=float(np.concatenate([r.formatted for r in rounds]).mean()),
        response_len_mean=float(lengths.mean()), response_len_median=float(np.median(lengths)),
        response_len_max=float(lengths.max()), sampling_rounds=float(len(rounds)),
        prompts=float(self.prompts_for(g)), rows=float(rows), rollouts=float(lengths.size),
        new_compilations=float(compile_count.compile_count() - compiles_before),
        update_skipped=float(batch is None))
    row.update({f"learner/{k}": v for k, v in learner_metrics.items()})
    return row

  # ------------------------------------------------------------------- eval
  def _eval_pass(self, sampler: Sampler, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(correct, lengths) of one response per held-out example, in batches of the
    eval sampler's row bucket (compiled at warm-up)."""
    batch_rows = sampler.row_buckets[-1]
    correct, lengths = [], []
    for lo in range(0, n, batch_rows):
      examples = [self.eval_source[i] for i in range(lo, min(lo + batch_rows, n))]
      samples = sampler.generate(self.model, self._encode(examples), 1,
                                 seed=_seed_for(seed, lo))
      result = self.reward_fn(self._decode(samples), [ex["answer"] for ex in examples])
      correct.append(result.correct)
      lengths.append(samples.lengths[:samples.num_rows])
    return np.concatenate(correct), np.concatenate(lengths)

  def evaluate(self, limit: int | None = None) -> dict[str, float]:
    """Held-out accuracy: greedy, and sampled at the training temperature.

    The sampled pass draws one response per example at the rollout
    temperature with fixed seeds and a fixed batch layout, so successive
    evaluations (and every arm of a comparison) share their random numbers and
    differ only by the policy; it measures the policy as RL trains it, while
    greedy measures its mode.
    """
    start = time.perf_counter()
    n = min(limit or self.config.data.eval_examples, len(self.eval_source))
    greedy, lengths = self._eval_pass(self.eval_sampler, n, seed=0)
    sampled, sampled_lengths = self._eval_pass(self.eval_sampled_sampler, n,
                                               seed=self.config.seed)
    return {"eval_accuracy": float(greedy.mean()), "eval_response_len": float(lengths.mean()),
            "eval_sampled_accuracy": float(sampled.mean()),
            "eval_sampled_response_len": float(sampled_lengths.mean()),
            "eval_examples": float(n), "eval_seconds": time.perf_counter() - start}

  # ------------------------------------------------------------------- loop
  def warmup(self) -> float:
    """Compiles every sampler / learner shape ahead of time; returns seconds."""
    start = time.perf_counter()
    n = self.components.warmup(self.model, log=self.log)
    seconds = time.perf_counter() - start
    self.log(f"warm-up: {n} executables for row buckets {self.row_buckets}, prompt buckets "
             f"{tuple(self.config.rollout.prompt_buckets)}, response buckets "
             f"{tuple(self.config.rollout.response_buckets)} in {seconds:.1f} s")
    return seconds

  def _on_stop_signal(self, signum, frame) -> None:
    """SIGTERM (preemption) or a first Ctrl-C: checkpoint after the current step and
    exit 0. A second Ctrl-C interrupts at once (Python's own handler is back)."""
    del frame
    self._stop_requested = True
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.default_int_handler)
      self.log("SIGINT received: checkpointing after the current step "
               "(Ctrl-C again to stop at once, losing the steps since the last checkpoint)")
    else:
      self.log("SIGTERM received: checkpointing after the current step")

  def run(self, max_steps: int | None = None) -> dict[str, Any]:
    """Trains until ``train.steps`` (or ``max_steps`` more steps); returns a summary."""
    c = self.config
    previous = ({sig: signal.signal(sig, self._on_stop_signal)
                 for sig in (signal.SIGTERM, signal.SIGINT)} if _in_main_thread() else {})
    try:
      self.warmup()
      if self.step == 0 and not self.eval_history:
        self.eval_history.append({"step": 0, **self.evaluate()})
        first = self.eval_history[-1]
        self.log(f"eval before RL: held-out accuracy {first['eval_accuracy']:.3f} greedy, "
                 f"{first['eval_sampled_accuracy']:.3f} sampled")
      end = c.train.steps if max_steps is None else min(c.train.steps, self.step + max_steps)
      while self.step < end and not self._stop_requested:
        row = self.train_step()
        if self.step % c.train.eval_every == 0 or self.step == c.train.steps:
          evaluation = self.evaluate()
          self.eval_history.append({"step": self.step, **evaluation})
          row.update(evaluation)
        self.history.append(row)
        self.metrics.write(row)
        if self.step % c.train.log_every == 0:
          self.metrics.progress(row)
        self._check_skipped_updates(row)        # before this step can be checkpointed
        self.checkpointer.check()               # a failed background save stops the run
        if self.step % c.train.checkpoint_every == 0 or self.step == c.train.steps:
          self.save_checkpoint()
        # A signal reaches each host on its own; all must leave the loop together.
        self._stop_requested = distributed.any_on_all(self._stop_requested)
      if self._stop_requested and self.step % c.train.checkpoint_every:
        self.save_checkpoint()
      self.checkpointer.wait()
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
    summary = self.summary()
    if self.is_primary:
      (self.workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    if distributed.is_multiprocess():
      self._write_process_fingerprint()
    return summary

  def _check_skipped_updates(self, row: dict[str, Any]) -> None:
    """Counts updates skipped in a row (steps whose every update was non-finite) and
    stops the run at ``train.max_consecutive_skipped``: the checkpoints saved from
    then on would hold a policy that no longer learns and rotate the good ones out."""
    updates = row.get("learner/updates", 0.0)
    skipped = row.get("learner/skipped_updates", 0.0)
    if updates:
      self.consecutive_skipped = (self.consecutive_skipped + int(skipped)
                                  if skipped == updates else 0)
    limit = self.config.train.max_consecutive_skipped
    if limit and self.consecutive_skipped >= limit:
      last = self.checkpointer.all_steps()
      raise RuntimeError(
          f"step {self.step}: {self.consecutive_skipped} learner updates in a row were skipped "
          f"(non-finite loss or gradients; train.max_consecutive_skipped={limit}). Stopped "
          f"without checkpointing this step; the newest checkpoint is step "
          f"{last[-1] if last else None}. Lower learner.lr or learner.max_grad_norm, or "
          "check the rewards, then resume")

  def _write_process_fingerprint(self) -> None:
    """Per-process record of the G sequence and a parameter checksum (multi-process
    runs): every process must have made the same decisions and hold the same policy."""
    leaves = jax.tree.leaves(distributed.to_host(self.learner.params))
    (self.workdir / f"process_{jax.process_index()}.json").write_text(json.dumps({
        "process": jax.process_index(), "processes": jax.process_count(),
        "g": [r["g"] for r in self.history],
        "param_checksums": [float(np.asarray(x, np.float64).sum()) for x in leaves]}))

  def summary(self) -> dict[str, Any]:
    out: dict[str, Any] = {**summarize(self.history), "steps": self.step,
                           "preempted": self._stop_requested}
    if self.eval_history:
      for key in ("eval_accuracy", "eval_sampled_accuracy"):
        out[f"{key}_start"] = self.eval_history[0][key]
        out[f"{key}_end"] = self.eval_history[-1][key]
      out["eval_response_len_end"] = self.eval_history[-1]["eval_response_len"]
    out["skipped_updates"] = self.learner.skipped_updates
    return out

  def close(self) -> None:
    try:
      self.checkpointer.close()
      self.metrics.close()
      close = getattr(self.reward_fn, "close", None)
      if close:
        close()
    finally:
      if self._lock is not None:
        self._lock.release()
        self._lock = None


def _in_main_thread() -> bool:
  import threading
  return threading.current_thread() is threading.main_thread()


def deterministic_view(row: dict[str, Any]) -> dict[str, Any]:
  """A metrics row without wall-clock fields (what exact resume must reproduce)."""
  return {k: v for k, v in row.items() if k not in _TIMING_KEYS
          and not k.startswith("time_") and k != "learner/learner_seconds"}


def load_history(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  return read_jsonl(run_path(workdir) / "metrics.jsonl")
