"""The learner's batch: one typed struct, built on the host in a packed or a padded layout.

Why pack. The padded layout gives every sequence its own row, as wide as the prompt
bucket plus the response bucket of the batch's longest response; with response lengths
spread from tens to thousands of tokens most of the learner's FLOPs went to padding
(padding efficiency 0.20 in ``bench learner`` before this module). Packing puts several
whole sequences (prompt + response, no left padding) into each row of a fixed length,
as verl's remove-padding and TRL / NeMo-RL's packing do.

``LearnerBatch`` (a ``flax.struct`` pytree) is what every learner program takes, in both
layouts. Token fields are ``[rows, T]``; per-target fields are ``[rows, N]`` and describe
the *last* N token columns (column ``T - N + j`` is predicted by the hidden state of the
column before it). Packed: N = T - 1 (every column but the first can hold a response
token; a sequence always starts with a prompt token, so no prediction crosses two
sequences). Padded: N = the response bucket (today's reference layout,
``learner.packing=False``).

Losses are exact in both layouts because the aggregation is written as one weight per
token (``sequence_weights``): every mode of ``losses.aggregate`` is
``sum_t weight_t * loss_t`` with a weight that depends only on the token's sequence and
on counts over the whole minibatch (its real tokens, its sequences). The counts are
per-sequence sums on the host, taken before packing, so a microbatch's loss is its
exact share of the minibatch loss however the sequences were packed or split.

Shapes come from buckets so that nothing compiles after warm-up: the pack length is the
smallest of ``pack_lengths`` that holds the minibatch's longest sequence, and the packed
rows of a minibatch run as microbatches whose row counts are taken from the learner's
row ladder (``runtime.shapes.row_ladder``; largest first, the remainder rounded up to
the smallest rung), so padding is at most one smallest rung per minibatch plus the
first-fit-decreasing slack.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from sagc_jax.rl import losses
from sagc_jax.rl.rollout import RolloutBatch

__all__ = ["LearnerBatch", "Microbatch", "StepSequences", "first_fit_decreasing",
           "ladder_split", "pack_minibatch", "pad_minibatch", "sequence_weights"]

# (width, dtype) of each field: "seq" = T token columns, "targets" = the last N columns.
_FIELDS = {
    "tokens": ("seq", jnp.int32),
    "positions": ("seq", jnp.int32),        # RoPE positions, restarting per sequence
    "segment_ids": ("seq", jnp.int32),      # 0 = padding; > 0 = the sequence of the row
    "loss_mask": ("targets", jnp.bool_),    # response tokens of sequences in the loss
    "old_logp": ("targets", jnp.float32),   # behaviour policy (sampler or recomputed)
    "ref_logp": ("targets", jnp.float32),   # frozen reference policy (KL); 0 without KL
    "advantages": ("targets", jnp.float32),  # the sequence's advantage on each token
    "loss_weight": ("targets", jnp.float32),  # sequence_weights: sum(w * loss) = aggregate
}


@struct.dataclass
class LearnerBatch:
  """One microbatch of the learner, device- or host-side (see the module docstring)."""
  tokens: jax.Array
  positions: jax.Array
  segment_ids: jax.Array
  loss_mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  loss_weight: jax.Array

  @property
  def shape(self) -> tuple[int, int, int]:
    """(rows, T, N): what the compiled programs are keyed on."""
    return self.tokens.shape[0], self.tokens.shape[1], self.loss_mask.shape[1]

  @classmethod
  def abstract(cls, rows: int, seq_len: int, targets: int,
               sharding: Callable[[int], object] | None = None) -> "LearnerBatch":
    """ShapeDtypeStructs of a (rows, T, N) batch; ``sharding(ndim)`` places rows."""
    def spec(name):
      width, dtype = _FIELDS[name]
      shape = (rows, seq_len if width == "seq" else targets)
      return jax.ShapeDtypeStruct(shape, dtype,
                                  sharding=None if sharding is None else sharding(2))
    return cls(**{f.name: spec(f.name) for f in dataclasses.fields(cls)})

  @classmethod
  def empty(cls, rows: int, seq_len: int, targets: int) -> "LearnerBatch":
    """Host zeros of a (rows, T, N) batch: all padding."""
    return cls(**{name: np.zeros((rows, seq_len if width == "seq" else targets),
                                 np.dtype(dtype))
                  for name, (width, dtype) in _FIELDS.items()})


@dataclasses.dataclass
class Microbatch:
  """A host ``LearnerBatch`` and where its targets come from: ``seq[r, j]`` (-1: none)
  is the step's row index of the sequence whose response token ``pos[r, j]`` sits in
  target column ``j``. Lets per-target outputs (reference log-probs) go back to the
  step's per-sequence arrays."""
  batch: LearnerBatch
  seq: np.ndarray
  pos: np.ndarray

  def scatter(self, values: np.ndarray, out: np.ndarray) -> None:
    """``out[seq, pos] = values`` at every target column that holds a response token."""
    at = self.seq >= 0
    out[self.seq[at], self.pos[at]] = np.asarray(values)[at]


@dataclasses.dataclass
class StepSequences:
  """One step's sequences, per rollout row (the host side of the learner's input).

  ``loss_mask`` = response tokens of rows kept by ``prepare`` (DAPO's filter, padding
  rows dropped); ``old_logp`` / ``ref_logp`` are [rows, N_max] in response positions.
  """
  rollout: RolloutBatch
  advantages: np.ndarray      # [rows] float32
  loss_mask: np.ndarray       # [rows, N_max] bool
  old_logp: np.ndarray        # [rows, N_max] float32
  ref_logp: np.ndarray        # [rows, N_max] float32

  @classmethod
  def of(cls, batch: RolloutBatch, advantages: np.ndarray, keep: np.ndarray) -> "StepSequences":
    mask = batch.response_mask & keep[:, None] & batch.row_valid[:, None]
    return cls(batch, advantages.astype(np.float32), mask,
               batch.old_logprobs.astype(np.float32), np.zeros(mask.shape, np.float32))

  @property
  def response_lengths(self) -> np.ndarray:
    """Response tokens per row (the response mask is a prefix)."""
    return self.rollout.response_mask.sum(1)

  def prompt(self, row: int) -> np.ndarray:
    return self.rollout.prompt_tokens[row][self.rollout.prompt_mask[row]]

  def sequence_lengths(self) -> np.ndarray:
    """Prompt + response tokens per row: what a packed row must hold."""
    return self.rollout.prompt_mask.sum(1) + self.response_lengths

  def trained(self, rows: np.ndarray) -> np.ndarray:
    """The rows of ``rows`` with at least one token in the loss."""
    return rows[self.loss_mask[rows].any(1)]


def sequence_weights(tokens_per_seq: np.ndarray, mode: str, scale: float) -> np.ndarray:
  """The per-token weight of each sequence such that ``sum_t w_t * L_t`` equals
  ``losses.aggregate(L, mask, mode, scale)`` over the minibatch: with N the minibatch's
  real tokens, S its sequences with a real token and n_i sequence i's real tokens,
  ``token-mean`` 1/N, ``token-sum`` 1, ``seq-mean-token-mean`` 1/(S n_i),
  ``seq-mean-token-sum`` 1/S, ``seq-mean-token-sum-norm`` 1/(S scale)."""
  if mode not in losses.AGG_MODES:
    raise ValueError(f"sequence_weights: unknown mode {mode!r}; expected one of "
                     f"{losses.AGG_MODES}")
  n = np.asarray(tokens_per_seq, np.float64)
  real = n > 0
  total, seqs = n.sum(), real.sum()
  if mode == "token-mean":
    w = np.full(n.shape, 1.0 / max(total, 1.0))
  elif mode == "token-sum":
    w = np.ones(n.shape)
  elif mode == "seq-mean-token-mean":
    w = 1.0 / (max(seqs, 1) * np.maximum(n, 1.0))
  elif mode == "seq-mean-token-sum":
    w = np.full(n.shape, 1.0 / max(seqs, 1))
  else:
    w = np.full(n.shape, 1.0 / (max(seqs, 1) * scale))
  return np.where(real, w, 0.0).astype(np.float32)


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Bins of indices into ``lengths``, each summing to at most ``capacity``.

  First-fit decreasing (Johnson 1973: at most 11/9 OPT + 6/9 bins): longest first, ties
  by index, each into the first bin with room. Deterministic: equal inputs, equal packs.
  """
  order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
  bins: list[list[int]] = []
  free: list[int] = []
  for i in order:
    if lengths[i] > capacity:
      raise ValueError(f"a sequence of {lengths[i]} tokens exceeds the pack length {capacity}")
    for b, room in enumerate(free):
      if lengths[i] <= room:
        bins[b].append(i)
        free[b] -= lengths[i]
        break
    else:
      bins.append([i])
      free.append(capacity - lengths[i])
  return bins


def ladder_split(rows: int, ladder: Sequence[int]) -> list[int]:
  """Microbatch sizes covering ``rows``: the largest rung that fits, repeatedly; the
  remainder rounded up to the smallest rung."""
  sizes = []
  for rung in sorted(ladder, reverse=True):
    while rows >= rung:
      sizes.append(rung)
      rows -= rung
  if rows > 0:
    sizes.append(min(ladder))
  return sizes


def _fill_targets(out: LearnerBatch, seqs: StepSequences, seq: np.ndarray, pos: np.ndarray,
                  weights: np.ndarray) -> None:
  """Per-target fields of ``out`` gathered from the step's per-sequence arrays."""
  at = seq >= 0
  rows, cols = seq[at], pos[at]
  out.loss_mask[at] = seqs.loss_mask[rows, cols]
  out.old_logp[at] = seqs.old_logp[rows, cols]
  out.ref_logp[at] = seqs.ref_logp[rows, cols]
  out.advantages[at] = seqs.advantages[rows]
  out.loss_weight[at] = weights[rows]
  out.loss_mask[:] &= out.loss_weight != 0


def _minibatch_weights(seqs: StepSequences, rows: np.ndarray, mode: str,
                       scale: float) -> np.ndarray:
  """[step rows] float32: each minibatch sequence's weight, 0 for every other row."""
  out = np.zeros(seqs.loss_mask.shape[0], np.float32)
  out[rows] = sequence_weights(seqs.loss_mask[rows].sum(1), mode, scale)
  return out


def pack_minibatch(seqs: StepSequences, rows: np.ndarray, pack_len: int,
                   ladder: Sequence[int], mode: str, scale: float) -> list[Microbatch]:
  """The minibatch ``rows`` (whole sequences) packed into rows of ``pack_len`` tokens,
  split into microbatches of ``ladder`` row counts. Sequences with nothing in the loss
  are left out (they contribute nothing)."""
  rows = seqs.trained(np.asarray(rows))
  weights = _minibatch_weights(seqs, rows, mode, scale)
  lengths = seqs.sequence_lengths()
  bins = first_fit_decreasing([int(lengths[r]) for r in rows], pack_len)
  n_resp = seqs.response_lengths
  out, start = [], 0
  for size in ladder_split(len(bins), ladder):
    mb = LearnerBatch.empty(size, pack_len, pack_len - 1)
    seq = np.full((size, pack_len - 1), -1)
    pos = np.zeros((size, pack_len - 1), np.int64)
    for r, members in enumerate(bins[start:start + size]):
      col = 0
      for segment, i in enumerate(members, start=1):
        row = int(rows[i])
        prompt, n = seqs.prompt(row), int(n_resp[row])
        width = len(prompt) + n
        mb.tokens[r, col:col + len(prompt)] = prompt
        mb.tokens[r, col + len(prompt):col + width] = seqs.rollout.response_tokens[row, :n]
        mb.positions[r, col:col + width] = np.arange(width)
        mb.segment_ids[r, col:col + width] = segment
        first = col + len(prompt) - 1          # target column of response token 0
        seq[r, first:first + n] = row
        pos[r, first:first + n] = np.arange(n)
        col += width
    start += size
    _fill_targets(mb, seqs, seq, pos, weights)
    out.append(Microbatch(mb, seq, pos))
  return out


def pad_minibatch(seqs: StepSequences, rows: np.ndarray, n_resp: int, grad_accum: int,
                  mode: str, scale: float) -> list[Microbatch]:
  """The reference layout: one sequence per row, prompts left-padded to their bucket,
  responses cut to ``n_resp``; every row of the minibatch (padding rows too), row i in
  microbatch i mod ``grad_accum`` (each microbatch keeps its share of the 'data' shards)."""
  rows = np.asarray(rows)
  weights = _minibatch_weights(seqs, seqs.trained(rows), mode, scale)
  b = seqs.rollout
  out = []
  for k in range(grad_accum):
    part = rows[k::grad_accum]
    mask = np.concatenate([b.prompt_mask[part], b.response_mask[part, :n_resp]], axis=1)
    mb = LearnerBatch.empty(len(part), mask.shape[1], n_resp)
    mb.tokens[:] = np.concatenate([b.prompt_tokens[part], b.response_tokens[part, :n_resp]],
                                  axis=1)
    mb.positions[:] = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    mb.segment_ids[:] = mask
    seq = np.repeat(part[:, None], n_resp, axis=1)
    pos = np.broadcast_to(np.arange(n_resp), seq.shape).copy()
    _fill_targets(mb, seqs, seq, pos, weights)
    out.append(Microbatch(mb, seq, pos))
  return out
