"""The HBM-traffic estimate of compiled TPU programs against hand-computed bytes.

Programs are compiled for one abstract v5e chip (libtpu, no TPU needed); the references
are the sizes of the arrays each program must read and write, computed here from the
shapes, not by the estimator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sagc_jax.aot.hbm_traffic import hbm_traffic


@pytest.fixture(scope="module")
def one_chip():
  from jax.experimental import topologies
  topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2",
                                      chips_per_host_bounds=(2, 2, 1), num_slices=1)
  mesh = Mesh(np.array(topo.devices[:1]), ("x",))
  return NamedSharding(mesh, P())


def _abstract(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _hlo(fn, *args, **jit_kwargs) -> str:
  return jax.jit(fn, **jit_kwargs).lower(*args).compile().as_text()


def test_matmul_reads_its_weight_once(one_chip):
  # A memory-bound matvec: the weight dominates, so traffic ~ weight + vector + output.
  w = _abstract((8192, 8192), jnp.bfloat16, one_chip)
  x = _abstract((8, 8192), jnp.bfloat16, one_chip)
  traffic = hbm_traffic(_hlo(lambda x, w: x @ w, x, w))
  expected = 8192 * 8192 * 2 + 2 * 8 * 8192 * 2
  assert expected * 0.95 <= traffic["bytes"] <= expected * 1.1, traffic


def test_in_place_update_moves_only_the_update(one_chip):
  # Writing one row into a donated 256 MiB buffer must not be charged the buffer.
  buf = _abstract((8192, 16384), jnp.bfloat16, one_chip)
  row = _abstract((1, 16384), jnp.bfloat16, one_chip)
  idx = _abstract((), jnp.int32, one_chip)
  hlo = _hlo(lambda b, r, i: jax.lax.dynamic_update_slice(b, r, (i, 0)), buf, row, idx,
             donate_argnums=(0,))
  traffic = hbm_traffic(hlo)
  assert traffic["bytes"] <= 4 * 16384 * 2 + 4096, traffic
  # Without donation the output is a new buffer: the copy is charged (read + write).
  copied = hbm_traffic(_hlo(lambda b, r, i: jax.lax.dynamic_update_slice(b, r, (i, 0)),
                            buf, row, idx))
  assert copied["bytes"] >= 2 * 8192 * 16384 * 2 * 0.95, copied


def test_control_flow_is_refused(one_chip):
  x = _abstract((1024,), jnp.float32, one_chip)
  hlo = _hlo(lambda x: jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * 2.0, x), x)
  with pytest.raises(ValueError, match="while"):
    hbm_traffic(hlo)
