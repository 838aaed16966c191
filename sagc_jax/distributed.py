"""Multi-process (multi-host) plumbing: initialisation and host-value collectives.

Every process of a Cloud TPU pod (or of the local multi-process launcher) runs
the same program. ``initialize`` calls ``jax.distributed.initialize`` when the
run has several processes: with no settings on a TPU pod (JAX reads the pod
metadata), or from the ``SAGC_COORDINATOR`` / ``SAGC_NUM_PROCESSES`` /
``SAGC_PROCESS_ID`` environment variables that ``launch/local_multiprocess.sh``
sets (CPU processes on one machine, gloo collectives).

The trainer keeps the SAGC controller replicated: every process feeds it the
same, globally gathered per-group lengths, so every process proposes the same
G; ``assert_same_on_all`` checks that every step (a divergence would deadlock a
pod in the next collective, so it is turned into an error instead).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np

_ENV = ("SAGC_COORDINATOR", "SAGC_NUM_PROCESSES", "SAGC_PROCESS_ID")


def initialize(tpu_pod: bool = False) -> None:
  """Starts the JAX distributed runtime if this run has several processes."""
  if all(name in os.environ for name in _ENV):
    local_devices = os.environ.get("SAGC_LOCAL_DEVICES")
    if local_devices:
      jax.config.update("jax_num_cpu_devices", int(local_devices))
    jax.distributed.initialize(coordinator_address=os.environ["SAGC_COORDINATOR"],
                               num_processes=int(os.environ["SAGC_NUM_PROCESSES"]),
                               process_id=int(os.environ["SAGC_PROCESS_ID"]),
                               initialization_timeout=300)
  elif tpu_pod:
    jax.distributed.initialize()


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def barrier(name: str) -> None:
  """All processes wait here (no-op with one process)."""
  if is_multiprocess():
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def allgather_rows(local: np.ndarray) -> np.ndarray:
  """Concatenates every process's ``local`` rows in process order (same shape each)."""
  if not is_multiprocess():
    return np.asarray(local)
  from jax.experimental import multihost_utils
  gathered = multihost_utils.process_allgather(np.asarray(local), tiled=False)
  return np.asarray(gathered).reshape((-1,) + np.asarray(local).shape[1:])


def allgather_token_lists(local: Sequence[Sequence[int]], pad_id: int = 0) -> list[list[int]]:
  """Every process's lists of token ids, in process order (ragged lists allowed)."""
  if not is_multiprocess():
    return [list(x) for x in local]
  width = int(allgather_rows(np.array([max((len(x) for x in local), default=0)])).max())
  ids = np.full((len(local), max(width, 1)), pad_id, np.int32)
  lengths = np.array([len(x) for x in local], np.int32)
  for i, row in enumerate(local):
    ids[i, :len(row)] = row
  all_ids, all_lengths = allgather_rows(ids), allgather_rows(lengths)
  return [all_ids[i, :n].tolist() for i, n in enumerate(all_lengths)]


def assert_same_on_all(value: Any, what: str) -> None:
  """Raises if processes disagree on a small host value (e.g. this step's G)."""
  if not is_multiprocess():
    return
  mine = np.asarray(value, np.float64).reshape(-1)
  every = allgather_rows(mine[None, :])
  if not np.all(every == every[0]):
    raise RuntimeError(f"processes disagree on {what}: {every.tolist()} (process order); "
                       "the replicated controller diverged")


def to_host(tree: Any) -> Any:
  """``jax.device_get`` that also works for arrays spanning several processes."""
  def fetch(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(fetch, tree)


def put_global(value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from a host value every process holds in full.

  Each process fills only its addressable shards (``make_array_from_callback``),
  which is what a multi-process mesh needs; with one process it equals
  ``jax.device_put``.
  """
  from sagc_jax.models.transformer import to_device
  return to_device(np.asarray(value), sharding)


def share_sink_stats(group_max: np.ndarray, group_median: np.ndarray, num_groups: int
                     ) -> tuple[np.ndarray, np.ndarray]:
  """The host-callback length stats, made identical on every process.

  The sampler's ``io_callback`` runs on the host(s) XLA places it on — with a
  multi-process mesh that need not be every host. Each process offers what its
  sink received; the first process holding all ``num_groups`` groups provides
  them to everyone, so the replicated controllers observe the same values.
  """
  if not is_multiprocess():
    return group_max, group_median
  have = group_max.size == num_groups
  mine = np.zeros((2, num_groups))
  if have:
    mine[0], mine[1] = group_max, group_median
  flags = allgather_rows(np.array([float(have)]))
  every = allgather_rows(mine[None])
  if not flags.any():
    raise RuntimeError(f"no process received the {num_groups} groups' length stats from the "
                       "sampler's host callback")
  source = int(np.argmax(flags))
  return every[source, 0], every[source, 1]


def any_on_all(flag: bool) -> bool:
  """True on every process if it is True on any (e.g. "SIGTERM received")."""
  if not is_multiprocess():
    return bool(flag)
  return bool(allgather_rows(np.array([float(flag)])).any())
