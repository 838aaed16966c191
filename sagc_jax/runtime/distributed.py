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
from typing import Any, Callable, Sequence

import jax
import numpy as np

from sagc_jax.runtime import stop

_ENV = ("SAGC_COORDINATOR", "SAGC_NUM_PROCESSES", "SAGC_PROCESS_ID")


def heartbeat_timeout_s() -> int:
  """Seconds after which the JAX coordination service declares a silent process dead
  and aborts every other one: ``SAGC_HEARTBEAT_TIMEOUT_S``, else JAX's default (100).

  A process that dies (kill -9, a lost host) leaves the others blocked in their next
  collective: this bound is how long they wait before ending, so that a supervisor
  restarts the job from its last checkpoint. The local launcher sets 10 s.
  """
  raw = os.environ.get("SAGC_HEARTBEAT_TIMEOUT_S", "100")
  try:
    seconds = int(raw)
  except ValueError:
    seconds = 0
  if seconds < 1:
    raise ValueError(f"SAGC_HEARTBEAT_TIMEOUT_S={raw!r} must be a whole number of seconds "
                     ">= 1")
  return seconds


def initialize(tpu_pod: bool = False) -> None:
  """Starts the JAX distributed runtime if this run has several processes."""
  if all(name in os.environ for name in _ENV):
    local_devices = os.environ.get("SAGC_LOCAL_DEVICES")
    if local_devices:
      jax.config.update("jax_num_cpu_devices", int(local_devices))
    jax.distributed.initialize(coordinator_address=os.environ["SAGC_COORDINATOR"],
                               num_processes=int(os.environ["SAGC_NUM_PROCESSES"]),
                               process_id=int(os.environ["SAGC_PROCESS_ID"]),
                               initialization_timeout=300,
                               heartbeat_timeout_seconds=heartbeat_timeout_s())
  elif tpu_pod:
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s())


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def on_every_process(log: Callable[[str], None]) -> Callable[[str], None]:
  """``log`` on process 0 (the run's console and log); on the others a print prefixed
  with the process index, for messages about what that process alone saw (a signal,
  a failing reward on its share of the rollouts)."""
  if jax.process_index() == 0:
    return log
  index = jax.process_index()
  return lambda message: print(f"[process {index}] {message}", flush=True)


def barrier(name: str) -> None:
  """All processes wait here (no-op with one process)."""
  if is_multiprocess():
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


# Host values are gathered as raw bytes padded to a power-of-two bucket, so the
# gather program compiles once per bucket (at warm-up, ``warm_host_gathers``), not once
# per array shape: G, and with it every per-step shape, changes from step to step.
_MIN_GATHER_BYTES = 1024


def _gather_bucket(nbytes: int) -> int:
  return max(_MIN_GATHER_BYTES, 1 << max(nbytes - 1, 0).bit_length())


_GATHER_PROGRAMS: dict[int, Any] = {}


def _gather_program(size: int):
  """The compiled all-gather of one ``size``-byte row per process (built once per size).

  ``multihost_utils.process_allgather`` jits its identity anew at every call site (the
  traced locations differ), so each new caller compiled again mid-run. This program is
  compiled ahead of time once per bucket and called directly.
  """
  program = _GATHER_PROGRAMS.get(size)
  if program is None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    devices = np.array(jax.devices()).reshape(jax.process_count(), jax.local_device_count())
    mesh = Mesh(devices, ("processes", "local_devices"))
    rows = NamedSharding(mesh, P("processes"))
    shape = jax.ShapeDtypeStruct((jax.process_count(), size), np.uint8, sharding=rows)
    compiled = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P())).lower(
        shape).compile()
    program = _GATHER_PROGRAMS[size] = (compiled, rows)
  return program


def _allgather_bytes(buffer: np.ndarray) -> np.ndarray:
  """``[processes, size]``: every process's ``buffer`` (uint8, ``size`` bytes)."""
  compiled, rows = _gather_program(buffer.size)
  local = buffer[None]
  shards = [jax.device_put(local, d) for d in jax.local_devices()]
  global_rows = jax.make_array_from_single_device_arrays(
      (jax.process_count(), buffer.size), rows, shards)
  return np.asarray(compiled(global_rows).addressable_data(0))


def warm_host_gathers(max_bytes: int) -> int:
  """Compiles the host gather of every bucket up to ``max_bytes``; returns how many."""
  if not is_multiprocess():
    return 0
  sizes = range(_MIN_GATHER_BYTES.bit_length() - 1, _gather_bucket(max_bytes).bit_length())
  for log2 in sizes:
    _allgather_bytes(np.zeros(1 << log2, np.uint8))
  return len(sizes)


def allgather_rows(local: np.ndarray) -> np.ndarray:
  """Concatenates every process's ``local`` rows in process order (same shape each)."""
  local = np.ascontiguousarray(local)
  if not is_multiprocess():
    return local
  raw = local.view(np.uint8).reshape(-1) if local.size else np.zeros(0, np.uint8)
  buffer = np.zeros(_gather_bucket(raw.size), np.uint8)
  buffer[:raw.size] = raw
  every = _allgather_bytes(buffer)[:, :raw.size]
  parts = [np.frombuffer(row.tobytes(), local.dtype).reshape(local.shape) for row in every]
  return np.concatenate(parts, axis=0) if local.ndim else np.stack(parts)


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


def _gather_shards(x: jax.Array) -> np.ndarray:
  """A sharded multi-process array as one host array, through the byte gather.

  Each process sends its distinct addressable shards (their bounds, then their
  bytes); every process rebuilds the whole array. No program specific to the array's
  shape is compiled, so a fetch of a new shape mid-run compiles nothing.
  """
  pieces, seen = [], set()
  for shard in x.addressable_shards:
    bounds = tuple(sl.indices(dim)[:2] for sl, dim in zip(shard.index, x.shape))
    if bounds not in seen:
      seen.add(bounds)
      pieces.append((bounds, np.ascontiguousarray(np.asarray(shard.data))))
  header = np.array([len(pieces)] + [v for b, _ in pieces for pair in b for v in pair],
                    np.int64)
  payload = np.concatenate([header.view(np.uint8)] + [d.view(np.uint8).reshape(-1)
                                                      for _, d in pieces])
  sizes = allgather_rows(np.array([payload.size], np.int64))
  buffer = np.zeros(_gather_bucket(int(sizes.max())), np.uint8)
  buffer[:payload.size] = payload
  out = np.empty(x.shape, x.dtype)
  for row, size in zip(_allgather_bytes(buffer), sizes):
    data = row[:size].tobytes()
    count = int(np.frombuffer(data[:8], np.int64)[0])
    offset = 8 * (1 + 2 * x.ndim * count)
    bounds = np.frombuffer(data[8:offset], np.int64).reshape(count, x.ndim, 2)
    for b in bounds:
      shape = tuple(int(hi - lo) for lo, hi in b)
      nbytes = int(np.prod(shape, dtype=np.int64)) * out.itemsize
      out[tuple(slice(lo, hi) for lo, hi in b)] = np.frombuffer(
          data[offset:offset + nbytes], x.dtype).reshape(shape)
      offset += nbytes
  return out


def to_host(tree: Any) -> Any:
  """``jax.device_get`` that also works for arrays spanning several processes.

  The wait for the arrays is one a stop signal can interrupt (``stop.wait_ready``):
  every sampler, learner and evaluation fetch goes through here."""
  stop.wait_ready(tree)
  def fetch(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return _gather_shards(x)
    return np.asarray(jax.device_get(x))
  return jax.tree.map(fetch, tree)


def put_global(value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from a host value every process holds in full.

  Each process fills only its addressable shards (``make_array_from_callback``),
  which is what a multi-process mesh needs; with one process it equals
  ``jax.device_put``.
  """
  return to_device(np.asarray(value), sharding)


def to_device(host: np.ndarray, sharding: jax.sharding.Sharding | None) -> jax.Array:
  """Host array -> device array; with a sharding each device receives only its slice."""
  if sharding is None:
    return jax.numpy.asarray(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


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
