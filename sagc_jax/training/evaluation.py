"""Held-out evaluation of a policy: greedy and sampled accuracy, pass@k, response lengths.

Used by the training loop (before RL and every ``train.eval_every`` steps) and by
``python -m sagc_jax.eval``, which builds only this and ``RunInputs``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from typing import Any, Callable, Iterator

import numpy as np

from sagc_jax.config import RunConfig, base_config, run_config
from sagc_jax.control.stragglers import chunk_groups, random_step_rate, straggler_flags
from sagc_jax.runtime import compilation
from sagc_jax.runtime.seeding import seed_for
from sagc_jax.runtime.storage import cache_root, local_mirror
from sagc_jax.sampling import Sampler
from sagc_jax.training.build import build_eval_samplers
from sagc_jax.training.inputs import (RunInputs, build_run_inputs, configure_compilation_cache,
                                      load_checkpoint_weights)

__all__ = ["Evaluator", "evaluate_run", "length_stats", "load_run_config", "open_policy",
           "paired_gain", "pass_at_k", "reader_config", "straggler_profile"]


PROGRESS_SECONDS = 10.0


class Evaluator:
  """Greedy and sampled held-out accuracy with fixed seeds and batch layout.

  The sampled pass draws one response per example at the rollout temperature with
  fixed seeds and a fixed batch layout, so successive evaluations (and every arm of
  a comparison) share their random numbers and differ only by the policy; it
  measures the policy as RL trains it, while greedy measures its mode.
  """

  def __init__(self, inputs: RunInputs, greedy: Sampler, sampled: Sampler,
               log: Callable[[str], None] = print):
    self.inputs = inputs
    self.greedy = greedy
    self.sampled = sampled
    self.log = log
    self.run_greedy = inputs.config.train.eval_greedy
    self.sampled_correct: np.ndarray | None = None   # per example, of the last evaluate()
    wanted, available = inputs.config.data.eval_examples, len(inputs.eval_source)
    if wanted > available:           # once per run, not at every evaluation
      log(f"warning: data.eval_examples={wanted} but the "
          f"{inputs.config.data.eval_split!r} split holds {available} examples; "
          f"evaluating on all {available}")

  def warmup_jobs(self, model: Any) -> list:
    greedy = self.greedy.warmup_jobs(model) if self.run_greedy else []
    return greedy + self.sampled.warmup_jobs(model)

  def examples(self, limit: int | None = None) -> int:
    """How many held-out examples an evaluation uses (``limit``: at most that many)."""
    if limit is not None and limit < 1:
      raise ValueError(f"an evaluation needs at least one example, got limit={limit}")
    wanted = self.inputs.config.data.eval_examples if limit is None else limit
    return min(wanted, len(self.inputs.eval_source))

  def _pass(self, model: Any, sampler: Sampler, n: int, seed: int, label: str,
            k: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(correct, lengths), each [n, k]: ``k`` responses per held-out example, in
    batches of the sampler's row bucket (compiled at warm-up: ``k`` responses of a
    prompt are one group, so any k up to the bucket uses the same executable).
    A progress line every ``PROGRESS_SECONDS`` (a real model's pass takes minutes)."""
    inputs = self.inputs
    per_call = sampler.row_buckets[-1] // k
    correct, lengths = [], []
    start = last = time.perf_counter()
    for lo in range(0, n, per_call):
      now = time.perf_counter()
      if lo and now - last >= PROGRESS_SECONDS:
        self.log(f"  eval ({label}): {lo}/{n} examples in {now - start:.0f} s")
        last = now
      examples = [inputs.eval_source[i] for i in range(lo, min(lo + per_call, n))]
      samples = sampler.generate(model, inputs.encode(examples), k, seed=seed_for(seed, lo))
      result = inputs.reward_fn.verify(
          inputs.decode(samples), [ex["answer"] for ex in examples for _ in range(k)])
      correct.append(np.asarray(result.correct).reshape(-1, k))
      lengths.append(samples.lengths[:samples.num_rows].reshape(-1, k))
    return np.concatenate(correct), np.concatenate(lengths)

  def log_result(self, when: str, evaluation: dict[str, float]) -> None:
    """The result line of an evaluation (``when``: "before RL", "after step N")."""
    greedy = (f"{evaluation['eval_accuracy']:.3f} greedy, "
              if "eval_accuracy" in evaluation else "")
    self.log(f"eval {when}: held-out accuracy {greedy}"
             f"{evaluation['eval_sampled_accuracy']:.3f} sampled")

  def evaluate(self, model: Any, limit: int | None = None) -> dict[str, float]:
    """Held-out accuracy of ``model``: greedy, sampled at the training temperature, and
    with ``train.eval_k`` > 1 pass@j / mean@k from k samples per example."""
    start, config = time.perf_counter(), self.inputs.config
    n = self.examples(limit)
    out: dict[str, float] = {}
    if self.run_greedy:
      greedy, lengths = self._pass(model, self.greedy, n, seed=0, label="greedy")
      out.update({"eval_accuracy": float(greedy.mean()),
                  **length_stats("eval_response_len", lengths)})
    sampled, sampled_lengths = self._pass(model, self.sampled, n, label="sampled",
                                          seed=config.seed)
    self.sampled_correct = sampled.reshape(-1).astype(np.int8)
    out.update({"eval_sampled_accuracy": float(sampled.mean()),
                **length_stats("eval_sampled_response_len", sampled_lengths),
                "eval_examples": float(n)})
    k = config.train.eval_k
    if k > 1:
      correct, k_lengths = self._pass(model, self.sampled, n, k=k, label=f"{k} samples",
                                      seed=seed_for(config.seed, k))
      out.update(pass_at_k(correct))
      out.update(length_stats(f"eval_k{k}_response_len", k_lengths))
      out[f"eval_k{k}_response_len_p99"] = float(np.percentile(k_lengths, 99))
      out.update(straggler_profile(k_lengths, config.controller.tau,
                                   config.rollout.prompts_for, config.group_sizes()))
    out["eval_seconds"] = time.perf_counter() - start
    return out


def length_stats(prefix: str, lengths: np.ndarray) -> dict[str, float]:
  """Mean, median, 90th percentile and max of response lengths (tokens): a mean alone
  hides the long tail that decides a synchronous step's wall-clock."""
  lengths = np.asarray(lengths, np.float64).reshape(-1)
  return {prefix: float(lengths.mean()), f"{prefix}_p50": float(np.percentile(lengths, 50)),
          f"{prefix}_p90": float(np.percentile(lengths, 90)), f"{prefix}_max": float(lengths.max())}


def straggler_profile(lengths: np.ndarray, tau: float, groups_per_step: Callable[[int], int],
                      sizes: tuple[int, ...]) -> dict[str, float]:
  """The policy's natural straggler statistics from k samples per example, at each
  group size G in ``sizes`` with G <= k, measured by ``control.stragglers`` as a
  trace's are: groups are the disjoint chunks of G of each example's k draws; per G the
  max/median ratio's p50 / p90 / max over all groups, the group straggler rate and the
  step straggler rate (the seed paper's S_t) of steps of ``groups_per_step(G)``
  groups of different examples (the run's P(G))."""
  lengths = np.asarray(lengths, np.float64)
  out: dict[str, float] = {"eval_straggler_tau": float(tau)}
  for g in sizes:
    if g > lengths.shape[1]:
      continue
    gmax, gmed = chunk_groups(lengths, g)
    flags = straggler_flags(gmax, gmed, tau)
    ratio = gmax / np.maximum(gmed, 1.0)
    per_step = groups_per_step(g)
    rng = np.random.Generator(np.random.PCG64([0, 17, g]))
    out.update({f"eval_g{g}_ratio_p50": float(np.percentile(ratio, 50)),
                f"eval_g{g}_ratio_p90": float(np.percentile(ratio, 90)),
                f"eval_g{g}_ratio_max": float(ratio.max()),
                f"eval_g{g}_group_straggler_rate": float(flags.mean()),
                f"eval_g{g}_groups": float(flags.size),
                f"eval_g{g}_step_straggler_rate": random_step_rate(flags, per_step, rng),
                f"eval_g{g}_groups_per_step": float(per_step)})
  return out


def paired_gain(before: Any, after: Any) -> dict[str, float]:
  """The change in sampled accuracy between two evaluations of the same examples with
  the same seeds, and its 95% interval: mean of the per-example differences
  (after - before, each -1, 0 or 1) +- 1.96 x their standard error (normal
  approximation of the paired t interval; pairing removes the between-problem
  variance that two independent proportions would carry)."""
  before, after = np.asarray(before, np.float64), np.asarray(after, np.float64)
  if before.shape != after.shape or before.size < 2:
    raise ValueError(f"paired_gain needs two equal-length evaluations of >= 2 examples, "
                     f"got {before.shape} and {after.shape}")
  diff = after - before
  half = 1.96 * float(diff.std(ddof=1)) / np.sqrt(diff.size)
  gain = float(diff.mean())
  return {"eval_sampled_gain": gain, "eval_sampled_gain_ci95_low": gain - half,
          "eval_sampled_gain_ci95_high": gain + half, "eval_sampled_gain_examples": float(diff.size)}


def pass_at_k(correct: np.ndarray) -> dict[str, float]:
  """``eval_pass@j`` for j = 2, 4, ... up to k and j = k, and ``eval_mean@k``, from a
  [examples, k] correctness array.

  pass@j uses the unbiased estimator of Chen et al. (2021, eq. 1) with n = k samples
  per problem and c correct: 1 - C(n - c, j) / C(n, j), averaged over problems
  (pass@k is then the share of problems with at least one correct sample). mean@k is
  the mean accuracy of all samples, which is also the unbiased pass@1.
  """
  correct = np.asarray(correct, bool)
  examples, k = correct.shape
  c = correct.sum(axis=1)
  out = {f"eval_mean@{k}": float(correct.mean())}
  for j in sorted(j for j in {*(2 ** i for i in range(1, k.bit_length())), k} if j >= 2):
    # C(n-c, j) / C(n, j) = prod_{i=0}^{j-1} (n-c-i) / (n-i); 0 once c > n - j.
    fail = np.ones(examples)
    for i in range(j):
      fail *= np.clip(k - c - i, 0, None) / (k - i)
    out[f"eval_pass@{j}"] = float(1.0 - fail.mean())
  return out


def load_run_config(workdir: Any):
  """The run's ``config.json`` over today's defaults: settings added since the run
  was written (e.g. ``reward.fns``, ``train.eval_k``) take their default value."""
  path = workdir / "config.json"
  if not path.exists():
    raise SystemExit(f"error: {path} not found: --workdir must be a training run directory")
  try:
    saved = json.loads(path.read_text())
  except (ValueError, UnicodeDecodeError) as err:
    raise ValueError(
        f"{path} is not valid JSON ({err}; truncated by a full disk or a kill?). Resuming "
        f"the run rewrites it: python -m sagc_jax.train --config <the run's config file> "
        f"--workdir {workdir} (the checkpoints are kept and resumed)") from None
  config = base_config()
  config.update(saved)
  return config


def reader_config(config: Any) -> RunConfig:
  """The typed config of a tool that reads a run (eval, export): accuracy is measured
  with the task verifier only, so the training reward's user functions (maybe not
  importable here) and W&B are left out before the config is checked."""
  values = config.to_dict() if hasattr(config, "to_dict") else copy.deepcopy(dict(config))
  values["reward"].update(fns=(), weights=())
  values["train"]["wandb_project"] = ""
  return run_config(values)


@contextlib.contextmanager
def open_policy(config: Any, workdir: Any, *, restore: bool = True, local_dir: Any = None,
                log=print) -> Iterator[tuple[RunInputs, int]]:
  """The policy of a run and its data, building only what sampling it needs.

  The data and the starting policy (cached under ``local_dir``, default the run's
  local mirror); with ``restore`` the newest checkpoint of ``workdir`` replaces the
  starting weights (the step is yielded; 0 for the starting policy). No learner,
  optimizer state or controller is built, and nothing in ``workdir`` is written.
  ``config`` must be typed (``reader_config``).
  """
  root = cache_root(config.train.local_cache_dir)
  compilation.install()
  configure_compilation_cache(config, root / "jax_cache")
  inputs = build_run_inputs(config, local_dir or local_mirror(workdir, root), root, log)
  try:
    step = 0
    if restore:
      directory = config.train.checkpoint_dir or workdir / "checkpoints"
      step = load_checkpoint_weights(inputs.model, directory, log=log)
    yield inputs, step
  finally:
    inputs.close()


def evaluate_run(config: Any, workdir: Any, *, restore: bool = True,
                 limit: int | None = None, log=print) -> dict[str, Any]:
  """Held-out evaluation of a run's policy (``open_policy``): the greedy and sampled
  eval samplers on the restored or starting weights; ``step`` in the result."""
  config = reader_config(config)
  with open_policy(config, workdir, restore=restore, log=log) as (inputs, step):
    evaluator = Evaluator(inputs, *build_eval_samplers(
        config, inputs.model, inputs.mesh, stop_ids=inputs.stop_ids, pad_id=inputs.pad_id),
                          log=log)
    compilation.warm(evaluator.warmup_jobs(inputs.model), log=log)
    return {**evaluator.evaluate(inputs.model, limit), "step": step}
