"""ProgramCache / warm: every key compiled once, in a pool, and used without recompiling."""

import jax
import jax.numpy as jnp
import numpy as np

from sagc_jax.runtime import compilation
from sagc_jax.runtime.compilation import ProgramCache, WarmupJob, warm


def _cache(scale: float) -> tuple[ProgramCache, list]:
  lowered_keys = []
  fn = jax.jit(lambda x: jnp.cumsum(x * scale))

  def lower(key, dtype):
    lowered_keys.append(key)
    return fn.lower(jax.ShapeDtypeStruct((key,), dtype))
  return ProgramCache(lower), lowered_keys


def test_warm_compiles_each_missing_key_once_and_get_reuses_it():
  a, a_lowered = _cache(2.0)
  b, b_lowered = _cache(3.0)
  jobs = [WarmupJob(a, [3, 5, 3], (jnp.float32,)), WarmupJob(b, [5], (jnp.float32,)),
          WarmupJob(a, [5, 7], (jnp.float32,))]
  before = compilation.compile_count()
  assert warm(jobs, workers=2) == 4          # a: 3, 5, 7; b: 5
  assert compilation.compile_count() - before == 4
  assert a_lowered == [3, 5, 7] and b_lowered == [5]
  assert len(a) == 3 and 7 in a and 7 not in b
  assert warm(jobs) == 0                     # nothing missing: nothing lowered again
  assert a_lowered == [3, 5, 7]
  after_warm = compilation.compile_count()
  x = np.arange(5, dtype=np.float32)
  np.testing.assert_allclose(a.get(5)(x), np.cumsum(2.0 * x))
  np.testing.assert_allclose(b.get(5)(x), np.cumsum(3.0 * x))
  assert compilation.compile_count() == after_warm
  # A key outside the warm-up compiles on first use, once.
  np.testing.assert_allclose(b.get(2, jnp.float32)(x[:2]), [0.0, 3.0])
  assert compilation.compile_count() == after_warm + 1 and len(b) == 2


def test_a_long_warm_up_says_how_many_of_how_many_programs_are_done(monkeypatch):
  """Progress lines at most every PROGRESS_EVERY_S in both phases ("n of N")."""
  monkeypatch.setattr(compilation, "PROGRESS_EVERY_S", 1e-4)
  a, _ = _cache(5.0)
  lines = []
  assert warm([WarmupJob(a, [11, 12, 13, 14], (jnp.float32,))], workers=1,
              log=lines.append) == 4
  lowering = [m for m in lines if m.startswith("  tracing and lowering:")]
  compiling = [m for m in lines if m.startswith("  compiling:")]
  assert lowering and all(" of 4 programs" in m for m in lowering), lines
  assert compiling and all(" of 4 programs done" in m for m in compiling), lines
  assert lines[-1].startswith("  4 programs: traced and lowered in")
