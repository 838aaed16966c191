"""The three worlds the replay engine (``replay.engine``) runs the controllers in.

A world answers one question: which prompts, responses and lengths does a sampling
round see. ``block(start, count, step, progress)`` gives the prompts at loader positions
``start .. start + count - 1`` at training step ``step`` (or at ``progress`` in [0, 1] of
the run, where the world drifts with time: the trace world) (the synthetic world has
no prompts to position: its step's lengths are one draw) as a dict of ``ids``,
``prompt_tokens`` [count], ``lengths`` [count, max_g] and, where the world knows
them, ``pass_rate`` [count] and ``passed`` / ``rewards`` [count, max_g] (else None).

* ``SyntheticWorld``: heavy-tailed lengths that drift over training
  (``LengthProcess``), no prompts and no rewards. Long chain-of-thought RL shows
  exactly this drift: mean length and its variance rise as the policy learns to
  reflect.
* ``PromptPool``: a fixed pool of heterogeneous prompts that recurs epoch after
  epoch, each with its own drifting length distribution, tail weight, pass rate and
  token length, all tied to a latent difficulty (equations below).
* ``TraceWorld``: a policy's recorded rollouts (``replay.trace``), resampled.

Every world draws from numbers fixed by its seed and the position (or the step), so
arms that read the same positions see the same rollouts (common random numbers), and
every loader walks the same epoch permutations (``Loader``). The synthetic and pool
worlds hand every arm the step's prompts (``shared_loader``); in a trace world each
arm's loader moves by the prompts that arm sampled, as the trainer's.

Prompt pool, prompt i at progress ``x = t / (steps-1)``::

    d_i ~ N(0, 1)                                        difficulty
    median_i(x) = m(x) * exp(prompt_sigma * (r_m d_i + sqrt(1 - r_m^2) e1_i))
    sigma_i(x)  = s(x) * exp(sigma_spread * e2_i)
    q_i(x)      = sigmoid(logit q(x) + tail_spread * (r_q d_i + sqrt(1 - r_q^2) e3_i))
    p_i(x)      = sigmoid(pass_logit_mean - pass_logit_scale * d_i + pass_logit_gain * x)
    len_i       = clip(prompt_len * exp(prompt_len_sigma * (r_l d_i + sqrt(1 - r_l^2) e4_i)),
                       8, 8 * prompt_len)

with ``m, s, q`` moving linearly like the synthetic world's median, spread and tail
probability (``r_m, r_q, r_l`` = ``median_difficulty_corr``, ``tail_difficulty_corr``,
``prompt_len_difficulty_corr``; ``e*`` independent normals). Response j: ``L_ij =
clip(round(median_i exp(sigma_i z_ij) T_ij), 1, max_len)``, ``T_ij ~ U[tail_factor_min,
tail_factor_max]`` with probability ``q_i`` (else 1); it passes iff ``v_ij < p_i``.
Harder prompts write longer and re-check more, and every prompt gets easier as
training goes on. The correlations are assumptions of the scenario, stated so they
can be changed.

Trace world: a prompt's group of G is drawn without replacement from its K recorded
responses (a trace holds K >= 2 max G, so groups are resampled, not replayed). Given
a second trace of the same prompts (after RL), prompt i at progress x takes its
responses from the second trace with probability x; a single trace is stationary
(an upper bound for the contextual kinds, whose prompt history never goes stale).
``bootstrap`` resamples the trace's prompts with replacement once per replicate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from sagc_jax.base import checks
from sagc_jax.control.budget import ROLLOUT_MODES
from sagc_jax.replay.trace import Trace

__all__ = ["LengthProcess", "Loader", "PromptPool", "SyntheticWorld", "TraceWorld",
           "validate_world"]

POOL_KEYS = ("size", "prompt_len_sigma", "sigma_spread", "tail_spread",
             "median_difficulty_corr", "tail_difficulty_corr", "prompt_len_difficulty_corr",
             "pass_logit_mean", "pass_logit_scale", "pass_logit_gain")


class Loader:
  """Loader positions -> prompt indices: every epoch is a fresh permutation of
  ``size`` prompts, fixed by ``seed`` and the epoch, as in training. ``extra(rng,
  size)`` draws per-position arrays of an epoch (from its own stream); ``take``
  returns them beside the indices."""

  def __init__(self, size: int, seed: int,
               extra: Callable[[np.random.Generator, int], tuple[np.ndarray, ...]] = None):
    self.size, self.seed, self.extra = size, seed, extra
    self._epochs: dict[int, tuple[np.ndarray, ...]] = {}

  def _epoch(self, epoch: int) -> tuple[np.ndarray, ...]:
    if epoch not in self._epochs:
      if len(self._epochs) > 64:
        self._epochs.clear()
      order = np.random.Generator(np.random.PCG64([self.seed, 11, epoch])).permutation(self.size)
      extra = () if self.extra is None else self.extra(
          np.random.Generator(np.random.PCG64([self.seed, 13, epoch])), self.size)
      self._epochs[epoch] = (order, *extra)
    return self._epochs[epoch]

  def take(self, start: int, count: int) -> list[np.ndarray]:
    """The prompt indices at positions ``start .. start + count - 1``, then each of
    ``extra``'s arrays at those positions."""
    positions = np.arange(start, start + count)
    epochs = positions // self.size
    # The positions run up, so each epoch's part follows the one before it.
    parts = [[a[positions[epochs == epoch] % self.size] for a in self._epoch(int(epoch))]
             for epoch in np.unique(epochs)]
    return [np.concatenate(arrays) for arrays in zip(*parts)]


@dataclasses.dataclass(frozen=True)
class LengthProcess:
  """Heavy-tailed response lengths that drift over training.

  Length of response j of prompt i at step t (progress ``x = t / (steps-1)``)::

      L = clip(round(m(x) * d_i * exp(s(x) * z_ij) * T_ij), 1, max_len)

  with ``m`` the median length, ``d_i ~ LogNormal(0, prompt_sigma)`` the prompt
  difficulty (shared by the group, so it cancels in max/median), ``z_ij`` a
  standard normal with spread ``s(x)``, and ``T_ij`` = 1 or, with probability
  ``q(x)``, a tail factor ~ Uniform[tail_factor_min, tail_factor_max] (the
  response re-checks its work several times). ``m``, ``s`` and ``q`` move
  linearly from their ``*_start`` to their ``*_end`` values.
  """

  steps: int
  max_len: int
  median_start: float
  median_end: float
  sigma_start: float
  sigma_end: float
  tail_prob_start: float
  tail_prob_end: float
  tail_factor_min: float
  tail_factor_max: float
  prompt_sigma: float
  seed: int

  @classmethod
  def of(cls, config: Any) -> "LengthProcess":
    """The process of a simulate config's ``sim`` section and ``seed``."""
    return cls(seed=config.seed, **{f.name: config.sim[f.name] for f in dataclasses.fields(cls)
                                    if f.name != "seed"})

  def draw(self, step: int, prompts: int, group: int) -> np.ndarray:
    """Lengths of step ``step`` as an int matrix ``[prompts, group]``, deterministic
    in ``(seed, step)``."""
    _, median, sigma, tail_prob = _schedule(self, step)
    rng = np.random.Generator(np.random.PCG64([self.seed, step]))
    difficulty = np.exp(self.prompt_sigma * rng.standard_normal((prompts, 1)))
    return _heavy_tailed(rng, median * difficulty, sigma, tail_prob, self, (prompts, group))


def _schedule(sim: Any, step: int) -> tuple[float, float, float, float]:
  """The progress ``x`` of ``step`` in ``sim``'s ``steps``, then the median, spread and
  tail probability there, each moving linearly from its ``*_start`` to its ``*_end``."""
  x = step / max(sim.steps - 1, 1)
  ends = [(getattr(sim, f"{key}_start"), getattr(sim, f"{key}_end"))
          for key in ("median", "sigma", "tail_prob")]
  return (x, *(start + (end - start) * x for start, end in ends))


def _heavy_tailed(rng: np.random.Generator, median: Any, sigma: Any, tail_prob: Any, sim: Any,
                  shape: tuple[int, int]) -> np.ndarray:
  """``clip(round(median exp(sigma z) T), 1, max_len)`` of ``shape`` (``T`` a tail
  factor of ``sim``'s range with probability ``tail_prob``, else 1): both generated
  worlds draw their lengths so, from ``rng`` in this order."""
  body = np.exp(sigma * rng.standard_normal(shape))
  tail = rng.random(shape) < tail_prob
  factor = rng.uniform(sim.tail_factor_min, sim.tail_factor_max, shape)
  lengths = median * body * np.where(tail, factor, 1.0)
  return np.clip(np.rint(lengths), 1, sim.max_len).astype(np.int64)


class SyntheticWorld:
  """``LengthProcess`` lengths for prompts of ``prompt_len`` tokens; every arm reads the
  top-left block of one ``[per_step, max_g]`` draw per step."""

  shared_loader = True

  def __init__(self, process: LengthProcess, *, per_step: int, max_g: int, prompt_len: int):
    self.process, self.per_step, self.max_g = process, per_step, max_g
    self.prompt_len, self.cap = prompt_len, process.max_len
    self._last: tuple[int, np.ndarray] | None = None

  def block(self, start: int, count: int, step: int, progress: float | None = None
            ) -> dict[str, Any]:
    if self._last is None or self._last[0] != step:
      self._last = (step, self.process.draw(step, self.per_step, self.max_g))
    return {"ids": np.arange(start, start + count), "prompt_tokens": np.full(count,
                                                                             self.prompt_len),
            "lengths": self._last[1][:count], "pass_rate": None, "passed": None,
            "rewards": None}


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 1.0 / (1.0 + np.exp(-x))


class PromptPool:
  """A pool of heterogeneous prompts and its drifting length / pass-rate model
  (module docstring), read from the config's ``sim`` section (the synthetic world's
  schedules and caps) and its ``pool`` section."""

  shared_loader = True

  def __init__(self, sim: Any, pool: Any, *, per_step: int, max_g: int, seed: int):
    self.sim, self.pool, self.per_step, self.max_g, self.seed = sim, pool, per_step, max_g, seed
    self.cap = sim.max_len
    self.loader = Loader(pool.size, seed)
    rng = np.random.Generator(np.random.PCG64([seed, 7]))
    d, e1, e2, e3, e4 = rng.standard_normal((5, pool.size))
    mix = lambda r, e: r * d + np.sqrt(1.0 - r * r) * e
    tokens = sim.prompt_len * np.exp(pool.prompt_len_sigma
                                     * mix(pool.prompt_len_difficulty_corr, e4))
    self.static = {
        "median_factor": np.exp(sim.prompt_sigma * mix(pool.median_difficulty_corr, e1)),
        "sigma_factor": np.exp(pool.sigma_spread * e2),
        "tail_offset": pool.tail_spread * mix(pool.tail_difficulty_corr, e3),
        "pass_offset": pool.pass_logit_mean - pool.pass_logit_scale * d,
        "prompt_tokens": np.clip(np.rint(tokens), 8, 8 * sim.prompt_len).astype(np.int64),
    }
    self._last: tuple[tuple[int, int, int], dict[str, Any]] | None = None

  def block(self, start: int, count: int, step: int, progress: float | None = None
            ) -> dict[str, Any]:
    """The prompts at the positions, with their true ``pass_rate`` and ``tail_prob``
    (the last block is kept: every arm reads the step's); progress follows the step."""
    if self._last is None or self._last[0] != (start, count, step):
      self._last = ((start, count, step), self._draw(start, count, step))
    return self._last[1]

  def _draw(self, start: int, count: int, step: int) -> dict[str, Any]:
    ids = self.loader.take(start, count)[0]
    s = {k: v[ids] for k, v in self.static.items()}
    x, median, sigma, q0 = _schedule(self.sim, step)
    tail_prob = _sigmoid(np.log(q0 / (1.0 - q0)) + s["tail_offset"])
    pass_rate = _sigmoid(s["pass_offset"] + self.pool.pass_logit_gain * x)
    rng = np.random.Generator(np.random.PCG64([self.seed, step]))
    lengths = _heavy_tailed(rng, (median * s["median_factor"])[:, None],
                            (sigma * s["sigma_factor"])[:, None], tail_prob[:, None], self.sim,
                            (count, self.max_g))
    passed = rng.random((count, self.max_g)) < pass_rate[:, None]
    return {"ids": ids, "prompt_tokens": s["prompt_tokens"], "pass_rate": pass_rate,
            "tail_prob": tail_prob, "lengths": lengths,
            "passed": passed, "rewards": passed.astype(np.float64)}


class TraceWorld:
  """The loader and the rollouts of one replicate of recorded traces (module
  docstring); ``length_scale`` / ``length_cap`` rescale the lengths to another cap."""

  shared_loader = False

  def __init__(self, traces: Sequence[Trace], *, max_g: int, steps: int, seed: int,
               bootstrap: bool = False, length_scale: float = 1.0,
               length_cap: int | None = None):
    first = traces[0]
    if first.responses < max_g:
      raise ValueError(f"the trace holds {first.responses} responses per prompt, fewer than "
                       f"the largest group size {max_g}")
    aligned = [first]
    for other in traces[1:]:
      where = {int(i): r for r, i in enumerate(other.ids)}
      missing = [int(i) for i in first.ids if int(i) not in where]
      if missing or other.responses != first.responses:
        raise ValueError(f"the second trace must hold the first one's {first.prompts} prompts "
                         f"with {first.responses} responses each, like the first (it holds "
                         f"{other.responses}; missing ids: {missing[:5]})")
      aligned.append(other.take([where[int(i)] for i in first.ids]))
    self.traces, self.max_g, self.steps, self.seed = aligned, max_g, steps, seed
    n = first.prompts
    rng = np.random.Generator(np.random.PCG64([seed, 1, 5]))
    self.pool = rng.integers(0, n, n) if bootstrap else np.arange(n)
    self.cap = cap = length_cap or max(t.max_new_tokens for t in aligned)
    self.lengths = [np.clip(np.rint(t.lengths * length_scale), 1, cap).astype(np.int64)
                    for t in aligned]
    self.pass_rate = [t.correct.mean(axis=1) for t in aligned]
    # Per position: a uniform draw (which trace) and the order of its responses.
    self.loader = Loader(self.pool.size, seed, lambda rng, size: (
        rng.random(size), np.argsort(rng.random((size, first.responses)), axis=1)[:, :max_g]))

  def block(self, start: int, count: int, step: int, progress: float | None = None
            ) -> dict[str, Any]:
    order, uniform, picks = self.loader.take(start, count)
    rows = self.pool[order]
    x = step / max(self.steps - 1, 1) if progress is None else progress
    source = (uniform < x).astype(np.int64) if len(self.traces) > 1 else np.zeros(count, int)
    pick = lambda arrays: np.stack([arrays[s][r, c] for s, r, c in zip(source, rows, picks)])
    return {
        "ids": self.traces[0].ids[rows],
        "prompt_tokens": self.traces[0].prompt_tokens[rows],
        "pass_rate": np.array([self.pass_rate[s][r] for s, r in zip(source, rows)]),
        "lengths": pick(self.lengths),
        "passed": pick([t.correct for t in self.traces]),
        "rewards": pick([t.rewards for t in self.traces]),
    }


def validate_world(config: Any, candidates: Sequence[int]) -> None:
  """Fails fast, naming the key, on any invalid ``sim`` (and ``pool``) setting of a
  simulation whose arms use ``candidates``."""
  checks.positive_int(config, "sim.steps")
  mode = checks.one_of(config, "sim.mode", ROLLOUT_MODES)
  max_len = checks.positive_int(config, "sim.max_len")
  checks.positive_int(config, "sim.prompt_len")
  for key in ("median_start", "median_end"):
    checks.number_in(config, f"sim.{key}", 1.0, max_len)
  for key in ("sigma_start", "sigma_end", "prompt_sigma"):
    checks.number_in(config, f"sim.{key}", 0.0)
  for key in ("tail_prob_start", "tail_prob_end"):
    checks.number_in(config, f"sim.{key}", 0.0, 1.0)
  low = checks.number_in(config, "sim.tail_factor_min", 1.0)
  high = checks.number_in(config, "sim.tail_factor_max", 1.0)
  if high < low:
    raise ValueError(f"sim.tail_factor_max={high} is below sim.tail_factor_min={low}")
  checks.group_budget(config, "sim", mode, tuple(candidates))
  if "pool" not in config:
    return
  checks.positive_int(config, "pool.size")
  for key in ("prompt_len_sigma", "sigma_spread", "tail_spread", "pass_logit_scale"):
    checks.number_in(config, f"pool.{key}", 0.0)
  for key in ("median_difficulty_corr", "tail_difficulty_corr", "prompt_len_difficulty_corr"):
    checks.number_in(config, f"pool.{key}", -1.0, 1.0)
  for key in ("pass_logit_mean", "pass_logit_gain"):
    checks.number_in(config, f"pool.{key}")
  for key in ("tail_prob_start", "tail_prob_end"):
    checks.number_in(config, f"sim.{key}", 0.0, 1.0, low_open=True, high_open=True)
  unknown = sorted(set(config.pool.keys()) - set(POOL_KEYS))
  if unknown:
    raise ValueError(f"pool.{unknown[0]} is not a pool setting (allowed: {', '.join(POOL_KEYS)})")
