"""Learner settings (``LearnerConfig``) and the published GRPO / DAPO presets.

Settings only: this module imports no JAX or optax (the training config's typed
sections hold a ``LearnerConfig``); ``rl.optimizer`` builds the optax optimizer.

``learner.algorithm`` names a preset of ``ALGORITHM_PRESETS``; a variant is its
objective settings, in the spirit of Tunix's ``DAPOConfig(GRPOConfig)``, with any key
the user sets winning over the preset.

References: GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300); DAPO (Yu et al.
2025, arXiv:2503.14476); Dr. GRPO (Liu et al. 2025, arXiv:2503.20783).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["AGG_MODES", "ALGORITHM_PRESETS", "DERIVED_FIELDS", "KL_KINDS", "LearnerConfig",
           "PRESET_FIELDS", "SCHEDULES"]

SCHEDULES = ("constant", "cosine")
# KL estimators (Schulman's k1 / k2 / k3, and |k1|) and loss aggregations
# (``rl.losses`` implements them; Dr. GRPO's seq-mean-token-sum-norm).
KL_KINDS = ("k1", "abs", "k2", "k3")
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean",
             "seq-mean-token-sum", "seq-mean-token-sum-norm")

# What ``algorithm`` stands for: the objective settings of the published recipes. The
# one source of truth, read by ``LearnerConfig.grpo/dapo/from_dict`` (which also sizes
# DAPO's overlong buffer from a training config's response budget).
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    # GRPO (DeepSeekMath): symmetric clip, k3 KL to a frozen reference (beta 0.04),
    # per-sequence mean of the token means, std-normalised advantages.
    "grpo": dict(algorithm="grpo", clip_low=0.2, clip_high=0.2, kl_coef=0.04, kl_kind="k3",
                 agg="seq-mean-token-mean", normalize_std=True, dynamic_sampling=False,
                 overlong_buffer=0),
    # DAPO (Yu et al. 2025): clip-higher, token-level mean, no KL, dynamic sampling,
    # soft overlong punishment.
    "dapo": dict(algorithm="dapo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, kl_kind="k3",
                 agg="token-mean", normalize_std=True, dynamic_sampling=True,
                 overlong_factor=1.0),
}

# The objective keys the presets set: a training config leaves them at None ("the
# preset's value") unless it chooses its own.
PRESET_FIELDS = tuple(sorted({k for p in ALGORITHM_PRESETS.values() for k in p} - {"algorithm"}))

# Fields a training config does not set: derived from other sections (the sampler's
# response budget and temperature, the run's number of optimizer updates).
DERIVED_FIELDS = ("max_response_len", "temperature", "total_steps")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """Learner settings; ``grpo()`` and ``dapo()`` give the published presets.

  Optimisation: AdamW (``lr``, ``b1``, ``b2``, ``eps``, ``weight_decay``) with a
  linear warm-up over ``warmup_steps`` then a ``constant`` or ``cosine`` (to
  ``min_lr_ratio * lr`` at ``total_steps``) schedule; global-norm clipping at
  ``max_grad_norm``. Steps count optimizer updates.

  Objective: ``clip_low``/``clip_high`` (and dual clip ``clip_c``), aggregation
  ``agg`` (with ``agg_scale`` for ``seq-mean-token-sum-norm``), KL to a frozen
  reference policy with ``kl_coef`` (0 = no reference model in memory) and
  estimator ``kl_kind``, advantages with ``normalize_std``.

  DAPO extras: ``overlong_buffer`` > 0 enables the soft overlong punishment
  over the last ``overlong_buffer`` tokens before ``max_response_len`` with
  ``overlong_factor``; ``dynamic_sampling`` drops zero-variance groups
  (``dynamic_max_rounds`` sampling rounds at most to refill the batch).

  Batching: ``mini_batches`` updates per pass, ``epochs`` passes per rollout
  batch, ``grad_accum`` microbatches per update (padded layout; packed, the largest
  packed microbatch holds as many rows as a padded one). ``packing`` (default on)
  packs whole sequences into rows (``rl/packing.py``); off, each sequence has its own
  padded row (the reference layout). ``recompute_old_logprobs``: the PPO "old"
  log-probs come from a learner forward pass before the step's first update instead of
  the sampler (the sampler's incremental decode and the learner's full forward differ
  in bfloat16, which biases the ratio; verl always recomputes).

  ``agg_scale`` (``seq-mean-token-sum-norm``, Dr. GRPO) defaults to
  ``max_response_len`` (else the largest response bucket): a constant, the same in both
  layouts.

  Memory and compile knobs (they change how, never what, is computed):
  ``remat`` (per-layer rematerialisation policy), ``scan_layers`` (one ``lax.scan``
  over the layers), ``attention`` / ``attention_block`` (``"blocked"``: query-blocked
  attention, O(block x T) memory; ``"splash"``: the fused Pallas kernel on TPU, no
  score tensor in HBM, tiles of ``attention_block``), ``logits_chunk`` (positions per chunk of the
  vocabulary projection; never a [rows, T, vocab] array), ``fsdp`` (float32 master
  weights, Adam moments and the reference model sharded over ``'data'`` as well as
  ``'model'``). See ``sagc_jax.models.transformer.ForwardOptions``.
  """
  algorithm: str = "grpo"
  lr: float = 1e-6
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.01
  warmup_steps: int = 0
  schedule: str = "constant"
  total_steps: int = 1000
  min_lr_ratio: float = 0.0
  max_grad_norm: float = 1.0
  clip_low: float = 0.2
  clip_high: float = 0.2
  clip_c: float | None = None
  agg: str = "seq-mean-token-mean"
  agg_scale: float | None = None
  kl_coef: float = 0.04
  kl_kind: str = "k3"
  normalize_std: bool = True
  adv_eps: float = 1e-6
  temperature: float = 1.0
  mini_batches: int = 1
  epochs: int = 1
  grad_accum: int = 1
  overlong_buffer: int = 0
  overlong_factor: float = 1.0
  max_response_len: int = 0
  dynamic_sampling: bool = False
  dynamic_max_rounds: int = 3
  remat: str = "none"
  scan_layers: bool = False
  attention: str = "dense"
  attention_block: int = 512
  logits_chunk: int = 512
  fsdp: bool = False
  packing: bool = True
  recompute_old_logprobs: bool = False

  @classmethod
  def grpo(cls, **overrides) -> "LearnerConfig":
    """GRPO: std-normalised advantages, clip 0.2, k3 KL (beta 0.04), seq-mean-token-mean."""
    return cls(**{**ALGORITHM_PRESETS["grpo"], **overrides})

  @classmethod
  def dapo(cls, **overrides) -> "LearnerConfig":
    """DAPO: clip-higher 0.2/0.28, token-mean, no KL, dynamic sampling, overlong shaping."""
    return cls(**{**ALGORITHM_PRESETS["dapo"], **overrides})

  def __post_init__(self):
    def fail(key, why):
      raise ValueError(f"learner.{key}={getattr(self, key)!r} {why}")
    for key in ("lr", "eps", "max_grad_norm", "temperature", "adv_eps"):
      value = getattr(self, key)
      if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        fail(key, "must be a positive number")
    for key in ("b1", "b2"):
      if not 0 <= getattr(self, key) < 1:
        fail(key, "must be in [0, 1)")
    for key in ("weight_decay", "kl_coef", "clip_low", "clip_high", "overlong_factor"):
      if not getattr(self, key) >= 0:
        fail(key, "must be >= 0")
    if self.clip_low > 1:
      fail("clip_low", "must be <= 1")
    if self.clip_c is not None and not self.clip_c > 1:
      fail("clip_c", "must be > 1 (dual clip) or None")
    for key in ("mini_batches", "epochs", "grad_accum", "dynamic_max_rounds", "total_steps",
                "logits_chunk"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(key, "must be a positive int")
    for key in ("warmup_steps", "overlong_buffer", "max_response_len"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(key, "must be an int >= 0")
    if self.schedule not in SCHEDULES:
      fail("schedule", f"is not one of {SCHEDULES}")
    if not 0 <= self.min_lr_ratio <= 1:
      fail("min_lr_ratio", "must be in [0, 1]")
    if self.agg not in AGG_MODES:
      fail("agg", f"is not one of {AGG_MODES}")
    if self.agg_scale is not None and (self.agg != "seq-mean-token-sum-norm"
                                       or not self.agg_scale > 0):
      fail("agg_scale", "is only valid (> 0) with agg='seq-mean-token-sum-norm'")
    if self.kl_kind not in KL_KINDS:
      fail("kl_kind", f"is not one of {KL_KINDS}")
    for key in ("scan_layers", "fsdp", "packing", "recompute_old_logprobs"):
      if not isinstance(getattr(self, key), bool):
        fail(key, "must be True or False")
    try:
      self.forward_options()
    except ValueError as err:
      raise ValueError(f"learner.{err}") from None
    if self.overlong_buffer and self.overlong_buffer > self.max_response_len:
      fail("overlong_buffer", f"exceeds max_response_len={self.max_response_len} (set "
           "max_response_len to the sampler's max_new_tokens)")

  @classmethod
  def from_dict(cls, values: dict[str, Any], *, max_new_tokens: int | None = None,
                temperature: float | None = None,
                train_steps: int | None = None) -> "LearnerConfig":
    """The one place the algorithm presets are resolved.

    ``algorithm`` picks the preset, whose values fill every key that is missing or
    ``None``; the section's own values win. A training config's learner section also
    passes the sampler's ``max_new_tokens`` and ``temperature`` and the run's
    ``train_steps``: they set ``DERIVED_FIELDS`` (the schedule counts optimizer
    updates, mini_batches x epochs per RL step), and DAPO's soft overlong buffer
    defaults to a quarter of the response budget.
    """
    values = dict(values)
    if max_new_tokens is not None:
      if values.get("overlong_buffer") is None and values.get("algorithm") == "dapo":
        values["overlong_buffer"] = max(max_new_tokens // 4, 1)
      values["max_response_len"] = max_new_tokens
      values["temperature"] = temperature or 1.0
      values.setdefault("total_steps", train_steps * values.get("mini_batches", 1)
                        * values.get("epochs", 1))
    values = {k: v for k, v in values.items() if not (k in PRESET_FIELDS and v is None)}
    algorithm = values.get("algorithm", "grpo")
    if algorithm not in ALGORITHM_PRESETS:
      raise ValueError(f"learner.algorithm={algorithm!r} is not one of {tuple(ALGORITHM_PRESETS)}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"learner.{unknown[0]} is not a learner setting "
                       f"(allowed: {', '.join(sorted(fields))})")
    return cls(**{**ALGORITHM_PRESETS[algorithm], **values})

  def check_split(self, rows: int, what: str, data_ways: int = 1) -> None:
    """``rows`` must split into ``mini_batches`` x ``grad_accum`` equal microbatches of
    a multiple of ``data_ways`` rows (each minibatch a fixed set of whole rows, every
    microbatch spread over the mesh's 'data' axis); ``what`` names the rows."""
    micro, rem = divmod(rows, self.mini_batches * self.grad_accum)
    if rem or micro % data_ways:
      rows_of = (f" of a multiple of {data_ways} rows (the mesh 'data' axis)"
                 if data_ways > 1 else "")
      raise ValueError(
          f"{what} does not split into learner.mini_batches={self.mini_batches} x "
          f"learner.grad_accum={self.grad_accum} equal microbatches{rows_of}")

  def forward_options(self):
    """How the learner's forward passes are computed (remat, scan, attention): a
    ``models.transformer.ForwardOptions``, imported here so that the settings
    themselves import no JAX."""
    from sagc_jax.models.transformer import ForwardOptions
    return ForwardOptions(attention=self.attention, attention_block=self.attention_block,
                          remat=self.remat, scan_layers=self.scan_layers)
