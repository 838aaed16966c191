"""RL loss pieces: every function against plain numpy/python re-derivations.

The references loop over rows/groups/tokens and never call the jax code. The
policy-loss inputs are built so that clip-high, clip-low and the dual clip all
trigger (asserted), and the group inputs have non-contiguous ids, padding rows
and groups of equal rewards.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sagc_jax.rl import losses
from sagc_jax.rl.losses import (AGG_MODES, KL_KINDS, aggregate, aggregate_count,
                                dynamic_sampling_keep,
                                entropy_from_logits, group_advantages, kl_penalty,
                                overlong_penalty, policy_loss, token_logprobs)

RTOL = 2e-5
ATOL = 2e-6

# The checks run the functions under jit (one XLA compile per function instead
# of one per primitive in eager mode keeps the file fast on CPU); this is also
# the jit-compatibility check with static string/int arguments.
jit_group_advantages = jax.jit(group_advantages,
                               static_argnames=("normalize_std", "eps", "num_groups"))
jit_keep = jax.jit(dynamic_sampling_keep, static_argnames=("num_groups",))
jit_overlong = jax.jit(overlong_penalty, static_argnames=("max_len", "buffer", "factor"))
jit_kl = jax.jit(kl_penalty, static_argnames=("kind",))
jit_aggregate = jax.jit(aggregate, static_argnames=("mode",))
jit_entropy = jax.jit(entropy_from_logits)
jit_token_logprobs = jax.jit(token_logprobs)
jit_policy_loss = jax.jit(policy_loss,
                          static_argnames=("clip_low", "clip_high", "clip_c", "agg"))
PG_CLIP_LOW, PG_CLIP_HIGH, PG_CLIP_C = 0.2, 0.28, 3.0


# ------------------------------------------------------------------ fixtures
def make_groups(seed=0):
  """Rows in shuffled order with arbitrary, non-contiguous group ids.

  Groups: several of size 4-6 with binary rewards (some all-equal), one of
  real-valued scores, a singleton group, and padding rows (mask False) whose
  ids point at real groups or at -1 and whose scores are huge (they must not
  leak into any statistic).
  """
  rng = np.random.default_rng(seed)
  ids, scores, mask = [], [], []
  group_ids = [17, 3, 40, 8, 25, 11, 33]
  for k, g in enumerate(group_ids):
    size = rng.integers(4, 7)
    if k == 0:
      s = np.ones(size)                       # all correct: equal rewards
    elif k == 1:
      s = np.zeros(size)                      # all wrong: equal rewards
    elif k == 2:
      s = rng.normal(size=size)               # real-valued
    else:
      s = rng.integers(0, 2, size).astype(float)
      s[0], s[1] = 0.0, 1.0                   # guaranteed non-equal
    ids += [g] * size
    scores += list(s)
    mask += [True] * size
  ids += [29]; scores += [0.7]; mask += [True]          # singleton group
  ids += [17, 3, 0]; scores += [1e6, -1e6, 5.0]; mask += [False] * 3  # padding
  perm = rng.permutation(len(ids))
  return (np.array(scores, np.float32)[perm], np.array(ids, np.int32)[perm],
          np.array(mask)[perm])


def ref_group_advantages(scores, ids, mask, normalize_std, eps):
  out = np.zeros(len(scores), np.float64)
  for g in set(ids[mask].tolist()):
    rows = [i for i in range(len(scores)) if mask[i] and ids[i] == g]
    vals = np.array([float(scores[i]) for i in rows])
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    for i in rows:
      out[i] = (scores[i] - mean) / (std + eps) if normalize_std else scores[i] - mean
  return out


def ref_keep(scores, ids, mask):
  out = np.zeros(len(scores), bool)
  for i in range(len(scores)):
    if mask[i]:
      vals = {float(scores[j]) for j in range(len(scores)) if mask[j] and ids[j] == ids[i]}
      out[i] = len(vals) > 1
  return out


def ref_aggregate(L, m, mode, scale=None):
  B, T = L.shape
  seq_sums, seq_means = [], []
  total, count = 0.0, 0.0
  for i in range(B):
    s = sum(float(L[i, t]) * float(m[i, t]) for t in range(T) if m[i, t])
    n = sum(float(m[i, t]) for t in range(T))
    total += s
    count += n
    if n > 0:
      seq_sums.append(s)
      seq_means.append(s / n)
  if mode == "token-mean":
    return total / count if count else 0.0
  if mode == "token-sum":
    return total
  if mode == "seq-mean-token-mean":
    return float(np.mean(seq_means)) if seq_means else 0.0
  seq_mean = float(np.mean(seq_sums)) if seq_sums else 0.0
  if mode == "seq-mean-token-sum":
    return seq_mean
  return seq_mean / (T if scale is None else scale)


def ref_token_loss(logp, old, adv, clip_low, clip_high, clip_c):
  """Per-token loss, d loss/d logp and branch flags, one token at a time."""
  B, T = logp.shape
  loss = np.zeros((B, T))
  grad = np.zeros((B, T))
  flags = {k: np.zeros((B, T), bool) for k in ("clip", "dual", "high", "low")}
  for i in range(B):
    for t in range(T):
      a = float(adv[i, t])
      lr = min(max(float(logp[i, t]) - float(old[i, t]), -20.0), 20.0)
      r = math.exp(lr)
      rc = min(max(r, 1 - clip_low), 1 + clip_high)
      v1, v2 = -a * r, -a * rc
      if v2 > v1:
        v, g = v2, 0.0
        flags["clip"][i, t] = True
        flags["high" if a > 0 else "low"][i, t] = True
      else:
        v, g = v1, -a * r
      if clip_c is not None and a < 0 and v > -a * clip_c:
        v, g = -a * clip_c, 0.0
        flags["dual"][i, t] = True
      loss[i, t], grad[i, t] = v, g
  return loss, grad, flags


def ref_agg_weights(m, mode, scale=None):
  """d aggregate / d L_it for the linear aggregation modes."""
  B, T = m.shape
  n = m.sum(1)
  n_seq = max((n > 0).sum(), 1)
  w = np.zeros((B, T))
  for i in range(B):
    for t in range(T):
      if mode == "token-mean":
        w[i, t] = m[i, t] / max(m.sum(), 1)
      elif mode == "token-sum":
        w[i, t] = m[i, t]
      elif mode == "seq-mean-token-mean":
        w[i, t] = m[i, t] / n[i] / n_seq if n[i] else 0.0
      elif mode == "seq-mean-token-sum":
        w[i, t] = m[i, t] / n_seq
      else:
        w[i, t] = m[i, t] / n_seq / (T if scale is None else scale)
  return w


@pytest.fixture(scope="module")
def pg_inputs():
  """[B, T] inputs where clip-high, clip-low and dual clip all occur.

  Row 0 is fully padded, row 1 has a single token; padding positions hold
  garbage (NaN / -inf) that must not leak.
  """
  rng = np.random.default_rng(1)
  B, T = 10, 12
  old = rng.normal(-1.5, 0.5, (B, T)).astype(np.float32)
  logp = (old + rng.normal(0, 0.8, (B, T))).astype(np.float32)
  logp[2, 0] = old[2, 0] + 25.0                  # beyond the ratio clamp
  adv_row = rng.normal(0, 1, B).astype(np.float32)
  adv_row[[3, 5]] = [-1.3, 0.9]
  adv_tok = rng.normal(0, 1, (B, T)).astype(np.float32)
  lengths = rng.integers(3, T + 1, B)
  lengths[0], lengths[1] = 0, 1
  mask = np.arange(T)[None, :] < lengths[:, None]
  logp_g = np.where(mask, logp, np.float32(np.nan))
  old_g = np.where(mask, old, np.float32(-np.inf))
  return dict(logp=logp, old=old, logp_garbage=logp_g, old_garbage=old_g,
              adv_row=adv_row, adv_tok=adv_tok, mask=mask)


@pytest.fixture(scope="module")
def pg_results(pg_inputs):
  """policy_loss value, metrics and d/dlogp for every (agg, clip_c, advantage
  shape) combination, from one jitted function (a single compilation), fed
  the garbage-padded inputs."""
  modes = AGG_MODES
  combos = [(m, c, k) for m in modes for c in (None, PG_CLIP_C) for k in ("row", "token")]

  @jax.jit
  def run(logp, old, adv_row, adv_tok, mask):
    out = {}
    for mode, clip_c, kind in combos:
      adv = adv_row if kind == "row" else adv_tok
      fn = lambda lp: policy_loss(lp, old, adv, mask, clip_low=PG_CLIP_LOW,
                                  clip_high=PG_CLIP_HIGH, clip_c=clip_c, agg=mode)
      (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(logp)
      out[f"{mode}|{clip_c}|{kind}"] = (loss, metrics, grad)
    return out

  out = run(pg_inputs["logp_garbage"], pg_inputs["old_garbage"], pg_inputs["adv_row"],
            pg_inputs["adv_tok"], pg_inputs["mask"])
  return {k: jax.tree.map(np.asarray, v) for k, v in out.items()}


# -------------------------------------------------------------- advantages
@pytest.mark.parametrize("normalize_std", [True, False])
def test_group_advantages_matches_reference(normalize_std):
  scores, ids, mask = make_groups()
  got = np.asarray(jit_group_advantages(scores, ids, normalize_std=normalize_std,
                                        mask=mask, num_groups=64))
  want = ref_group_advantages(scores, ids, mask, normalize_std, 1e-6)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(got[~mask] == 0)
  # Equal-reward groups and the singleton group get exactly zero.
  for g in (17, 3, 29):
    assert np.all(got[mask & (ids == g)] == 0)
  assert np.any(got[mask] != 0)


def test_group_advantages_defaults_and_eps():
  # num_groups defaults to the number of rows: ids just need to be < rows.
  scores = np.array([1.0, 0.0, 0.0, 1.0, 0.5, 2.0], np.float32)
  ids = np.array([5, 0, 5, 0, 2, 2], np.int32)
  mask = np.ones(6, bool)
  got = np.asarray(jit_group_advantages(scores, ids))
  np.testing.assert_allclose(got, ref_group_advantages(scores, ids, mask, True, 1e-6),
                             rtol=1e-5)
  got = np.asarray(jit_group_advantages(scores, ids, eps=0.5))
  np.testing.assert_allclose(got, ref_group_advantages(scores, ids, mask, True, 0.5),
                             rtol=1e-5)
  # Integer rewards are accepted.
  got = np.asarray(jit_group_advantages(np.array([1, 0, 1, 1]), np.array([0, 0, 1, 1])))
  np.testing.assert_allclose(got, [0.7071064, -0.7071064, 0, 0], rtol=1e-5)


def test_group_advantages_invariant_to_row_order_and_padding_ids():
  scores, ids, mask = make_groups(seed=3)
  base = np.asarray(jit_group_advantages(scores, ids, mask=mask, num_groups=64))
  np.testing.assert_allclose(base, ref_group_advantages(scores, ids, mask, True, 1e-6),
                             rtol=1e-5, atol=1e-5)
  perm = np.random.default_rng(0).permutation(len(scores))
  permuted = np.asarray(jit_group_advantages(scores[perm], ids[perm], mask=mask[perm],
                                             num_groups=64))
  np.testing.assert_allclose(permuted, base[perm], rtol=1e-6, atol=1e-6)
  ids2 = np.where(mask, ids, -1).astype(np.int32)   # padding ids out of range
  np.testing.assert_array_equal(
      np.asarray(jit_group_advantages(scores, ids2, mask=mask, num_groups=64)), base)


def test_group_functions_compile_once_for_any_group_layout():
  """Group sizes are not static: different id layouts reuse one compilation."""
  traces = []

  @functools.partial(jax.jit, static_argnames=("num_groups",))
  def f(s, i, m, num_groups):
    traces.append(1)
    return (group_advantages(s, i, mask=m, num_groups=num_groups),
            dynamic_sampling_keep(s, i, mask=m, num_groups=num_groups))

  s = np.array([1, 0, 1, 1, 0, 0, 2, 1], np.float32)
  m = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
  for ids in ([0] * 4 + [1] * 4, [0, 1] * 4, [3] * 8, [5, 5, 2, 2, 7, 7, 0, 0]):
    ids = np.array(ids, np.int32)
    adv, keep = f(s, ids, m, num_groups=8)
    np.testing.assert_allclose(np.asarray(adv), ref_group_advantages(s, ids, m, True, 1e-6),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(keep), ref_keep(s, ids, m))
  assert len(traces) == 1


def test_dynamic_sampling_keep_matches_reference():
  scores, ids, mask = make_groups()
  got = np.asarray(jit_keep(scores, ids, mask=mask, num_groups=64))
  np.testing.assert_array_equal(got, ref_keep(scores, ids, mask))
  assert not got[~mask].any()
  assert not got[mask & np.isin(ids, [17, 3, 29])].any()   # equal / singleton groups
  assert got[mask & (ids == 40)].all()
  # Integer scores and the default mask / num_groups.
  got = np.asarray(jit_keep(np.array([1, 1, 0, 1, 2, 2]), np.array([4, 4, 1, 1, 0, 0])))
  np.testing.assert_array_equal(got, [False, False, True, True, False, False])


def test_overlong_penalty_matches_reference():
  max_len, buffer, factor = 100, 20, 0.5
  lengths = np.arange(0, 130)

  def ref(n):
    if n <= max_len - buffer:
      return 0.0
    if n <= max_len:
      return ((max_len - buffer) - n) / buffer * factor
    return -factor

  got = np.asarray(jit_overlong(lengths, max_len=max_len, buffer=buffer, factor=factor))
  np.testing.assert_allclose(got, [ref(n) for n in lengths], rtol=1e-6, atol=1e-7)
  assert got[80] == 0 and got[100] == pytest.approx(-0.5) and got[129] == pytest.approx(-0.5)
  # Eager, default factor.
  np.testing.assert_allclose(np.asarray(overlong_penalty(np.array([80, 90, 100, 101]), 100, 20)),
                             [0.0, -0.5, -1.0, -1.0], rtol=1e-6)


# ----------------------------------------------------------- per-token terms
@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_penalty_matches_reference(kind):
  rng = np.random.default_rng(2)
  logp = rng.normal(-2, 1.5, (5, 9)).astype(np.float32)
  ref = rng.normal(-2, 1.5, (5, 9)).astype(np.float32)
  logp[0, :3] = ref[0, :3] + np.array([40.0, -40.0, -5.0])   # hit both clamps

  def one(a, b):
    d = a - b
    if kind == "k1":
      return d
    if kind == "abs":
      return abs(d)
    if kind == "k2":
      return 0.5 * d * d
    lr = min(max(b - a, -20.0), 20.0)
    return min(max(math.exp(lr) - lr - 1, -10.0), 10.0)

  want = np.array([[one(float(a), float(b)) for a, b in zip(ra, rb)]
                   for ra, rb in zip(logp, ref)])
  got = np.asarray(jit_kl(logp, ref, kind=kind))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(kl_penalty(logp, ref, kind)), got, rtol=1e-6)  # eager
  if kind == "k3":
    assert got[0, 1] == 10.0 and np.all(got >= 0)


def test_entropy_and_token_logprobs():
  rng = np.random.default_rng(4)
  logits = rng.normal(0, 3, (3, 4, 11)).astype(np.float32)
  logits[0, 0, 0] = 500.0                         # overflow-prone
  logits[1, 1, :5] = -np.inf                      # masked vocabulary
  tokens = rng.integers(5, 11, (3, 4))
  want_h = np.zeros((3, 4))
  want_lp = np.zeros((3, 4))
  for i in range(3):
    for t in range(4):
      z = logits[i, t].astype(np.float64)
      m = z.max()
      e = np.exp(z - m)
      p = e / e.sum()
      want_h[i, t] = -sum(pv * math.log(pv) for pv in p if pv > 0)
      want_lp[i, t] = z[tokens[i, t]] - (m + math.log(e.sum()))
  np.testing.assert_allclose(np.asarray(jit_entropy(logits)), want_h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jit_token_logprobs(logits, tokens)), want_lp,
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(jit_entropy(np.zeros((3, 4, 11), np.float32))),
                             np.log(11), rtol=1e-6)
  # bf16 logits are computed in float32; gradients stay finite with -inf entries.
  assert jit_entropy(jnp.asarray(logits, jnp.bfloat16)).dtype == jnp.float32
  g = jax.jit(jax.grad(lambda z: entropy_from_logits(z).sum()))(jnp.asarray(logits))
  assert np.isfinite(np.asarray(g)).all()


# -------------------------------------------------------------- aggregation
@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_matches_reference(mode, pg_inputs):
  rng = np.random.default_rng(5)
  mask = pg_inputs["mask"]
  L = rng.normal(size=mask.shape).astype(np.float32)
  got = float(jit_aggregate(L, mask, mode=mode))
  assert got == pytest.approx(ref_aggregate(L, mask, mode), rel=RTOL, abs=ATOL)
  # Float masks behave like bool masks; garbage in padding never leaks.
  garbage = np.where(mask, L, np.float32(np.nan))
  assert float(jit_aggregate(garbage, mask.astype(np.float32), mode=mode)) == pytest.approx(
      got, rel=1e-6)
  if mode == "seq-mean-token-sum-norm":
    got = float(jit_aggregate(L, mask, mode=mode, scale=37.0))   # traced scale
    assert got == pytest.approx(ref_aggregate(L, mask, mode, 37.0), rel=RTOL, abs=ATOL)
    assert got == pytest.approx(ref_aggregate(L, mask, "seq-mean-token-sum") / 37.0, rel=RTOL)


def test_all_zero_mask_gives_zero_and_finite_grads():
  L = jnp.full((3, 5), jnp.nan)
  mask = jnp.zeros((3, 5), bool)

  @jax.jit
  def run(x):
    out = {}
    for mode in AGG_MODES:
      out[f"agg|{mode}"] = jax.value_and_grad(lambda y: aggregate(y, mask, mode))(x)
      fn = lambda y: policy_loss(y, x, jnp.ones(3), mask, clip_c=3.0, agg=mode)
      out[f"pg|{mode}"] = jax.value_and_grad(fn, has_aux=True)(x)
    return out

  for name, (value, grad) in run(L).items():
    if name.startswith("pg"):
      value, metrics = value
      assert all(float(v) == 0 for v in metrics.values()), name
    assert float(value) == 0.0, name
    assert np.all(np.asarray(grad) == 0), name


# -------------------------------------------------------------- policy loss
@pytest.mark.parametrize("adv_kind", ["row", "token"])
@pytest.mark.parametrize("clip_c", [None, PG_CLIP_C])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_value_metrics_and_grad(mode, clip_c, adv_kind, pg_inputs, pg_results):
  mask = pg_inputs["mask"]
  adv = pg_inputs["adv_row"] if adv_kind == "row" else pg_inputs["adv_tok"]
  adv2d = np.broadcast_to(adv[:, None], mask.shape) if adv.ndim == 1 else adv
  logp, old = pg_inputs["logp"], pg_inputs["old"]
  tok_loss, tok_grad, flags = ref_token_loss(logp, old, adv2d, PG_CLIP_LOW, PG_CLIP_HIGH,
                                             clip_c)
  real = mask.astype(bool)
  # The inputs exercise every branch.
  assert (flags["high"] & real).any() and (flags["low"] & real).any()
  if clip_c is not None:
    assert (flags["dual"] & real).any()

  loss, metrics, grad = pg_results[f"{mode}|{clip_c}|{adv_kind}"]
  want = ref_aggregate(tok_loss, mask, mode)
  assert float(loss) == pytest.approx(want, rel=RTOL, abs=ATOL)

  n = real.sum()
  ratio = np.exp(np.clip(logp.astype(np.float64) - old, -20, 20))
  expect = {
      "clipfrac": (flags["clip"] & real).sum() / n,
      "clipfrac_lower": (flags["dual"] & real).sum() / n,
      "clipfrac_ratio_high": (flags["high"] & real).sum() / n,
      "clipfrac_ratio_low": (flags["low"] & real).sum() / n,
      "approx_kl": (old - logp.astype(np.float64))[real].mean(),
      "ratio_mean": ratio[real].mean(),
      "ratio_max": ratio[real].max(),
      "pg_loss": want,
  }
  for k, v in expect.items():
    assert float(metrics[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k

  # Gradient w.r.t. logp: analytic numpy (d(-A r)/dlogp = -A r where the
  # unclipped branch is active, 0 where clipped / dual-capped / ratio-clamped);
  # exactly 0 at padding despite the NaN there.
  clamped = np.abs(logp.astype(np.float64) - old) > 20
  want_grad = np.where(clamped, 0.0, tok_grad) * ref_agg_weights(mask.astype(float), mode)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
  assert np.all(grad[~real] == 0)


def test_policy_loss_grad_matches_finite_differences(pg_inputs):
  """Float32 central differences along random directions (kinks are rare)."""
  mask = pg_inputs["mask"]
  adv = pg_inputs["adv_tok"]
  old = jnp.asarray(pg_inputs["old"])
  f = jax.jit(lambda lp: policy_loss(lp, old, adv, mask, clip_c=PG_CLIP_C,
                                     agg="seq-mean-token-mean")[0])
  logp = jnp.asarray(pg_inputs["logp"])
  g = np.asarray(jax.jit(jax.grad(f))(logp), np.float64)
  rng = np.random.default_rng(6)
  h = 1e-2
  for _ in range(3):
    v = rng.normal(size=logp.shape).astype(np.float32)
    fd = (float(f(logp + h * v)) - float(f(logp - h * v))) / (2 * h)
    assert fd == pytest.approx(float((g * v).sum()), rel=2e-2, abs=2e-3)


def test_policy_loss_on_policy_equals_minus_advantage():
  # ratio == 1: nothing clips; token-mean loss is -mean(A) over real tokens and
  # the gradient is -A / n_tokens. Eager (no jit) on purpose.
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  adv = np.array([2.0, -1.0], np.float32)
  lp = jnp.zeros((2, 3))
  (loss, m), g = jax.value_and_grad(lambda x: policy_loss(x, lp, adv, mask),
                                    has_aux=True)(lp)
  assert float(loss) == pytest.approx(-(2 + 2 - 1) / 3)
  assert float(m["clipfrac"]) == 0 and float(m["approx_kl"]) == 0
  assert float(m["ratio_mean"]) == pytest.approx(1.0)
  np.testing.assert_allclose(np.asarray(g), [[-2 / 3, -2 / 3, 0], [1 / 3, 0, 0]], rtol=1e-6)


# ------------------------------------------------------------- validation
def test_bad_static_arguments_raise():
  x = jnp.zeros((2, 3))
  mask = jnp.ones((2, 3), bool)
  with pytest.raises(ValueError, match="'k4'.*k1"):
    kl_penalty(x, x, "k4")
  with pytest.raises(ValueError, match="'k4'"):
    jit_kl(x, x, kind="k4")
  with pytest.raises(ValueError, match="'mean'.*token-mean"):
    aggregate(x, mask, "mean")
  with pytest.raises(ValueError, match="'tok-mean'"):
    policy_loss(x, x, jnp.zeros(2), mask, agg="tok-mean")
  with pytest.raises(ValueError, match="clip_c"):
    policy_loss(x, x, jnp.zeros(2), mask, clip_c=1.0)
  with pytest.raises(ValueError, match="clip_c"):
    policy_loss(x, x, jnp.zeros(2), mask, clip_c=0.5)
  with pytest.raises(ValueError, match="clip_high"):
    policy_loss(x, x, jnp.zeros(2), mask, clip_high=-0.1)
  with pytest.raises(ValueError, match="advantages"):
    policy_loss(x, x, jnp.zeros(3), mask)
  with pytest.raises(ValueError, match="scale"):
    aggregate(x, mask, "token-mean", scale=4.0)
  with pytest.raises(ValueError, match="scale"):
    aggregate(x, mask, "seq-mean-token-sum-norm", scale=0)
  with pytest.raises(ValueError, match="mask shape"):
    aggregate(x, jnp.ones((2, 4), bool), "token-sum")
  with pytest.raises(ValueError, match="num_groups"):
    group_advantages(jnp.zeros(4), jnp.zeros(4, jnp.int32), num_groups=0)
  with pytest.raises(ValueError, match="integers"):
    group_advantages(jnp.zeros(4), jnp.zeros(4))
  with pytest.raises(ValueError, match="buffer"):
    overlong_penalty(jnp.arange(3), 10, 0)
  with pytest.raises(ValueError, match="buffer"):
    overlong_penalty(jnp.arange(3), 10, 11)
  with pytest.raises(ValueError, match="tokens shape"):
    token_logprobs(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))


def test_public_api_is_exported():
  import sagc_jax.rl as rl
  for name in losses.__all__:
    assert getattr(rl, name) is getattr(losses, name)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_splits_by_aggregate_count(mode):
  """What gradient accumulation relies on, for every mode: the aggregate of a batch is
  the count-weighted sum of its row blocks' aggregates (a new mode that
  ``aggregate_count`` does not describe fails here)."""
  rng = np.random.default_rng(3)
  loss = rng.normal(size=(6, 9)).astype(np.float32)
  mask = rng.random((6, 9)) < 0.6
  mask[2] = False                                   # a row with no real token
  scale = 9.0 if mode == "seq-mean-token-sum-norm" else None
  whole = float(aggregate(loss, mask, mode, scale))
  total = float(aggregate_count(mask, mode))
  parts = sum(float(aggregate(loss[rows], mask[rows], mode, scale))
              * float(aggregate_count(mask[rows], mode)) / total
              for rows in (slice(0, 2), slice(2, 6)))
  assert parts == pytest.approx(whole, rel=1e-5, abs=1e-6)
  expected = {"token-mean": mask.sum(), "token-sum": 1.0}.get(mode, (mask.sum(1) > 0).sum())
  assert total == expected
