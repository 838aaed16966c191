"""Metrics files: TensorBoard events readable back, and a full disk raised, not hung."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboardX.proto.event_pb2 import Event

from sagc_jax.runtime.metrics import MetricsWriter, read_jsonl

REPO = Path(__file__).resolve().parents[1]


def _records(path: Path) -> list[bytes]:
  """The payloads of a TFRecord file (u64 length, u32 crc, data, u32 crc), read here."""
  data, out, at = path.read_bytes(), [], 0
  while at < len(data):
    (length,) = struct.unpack("<Q", data[at:at + 8])
    out.append(data[at + 12:at + 12 + length])
    at += 12 + length + 4
  return out


def test_scalars_reach_jsonl_and_tensorboard(tmp_path):
  writer = MetricsWriter(tmp_path, 3, stream=io.StringIO())
  for step in (1, 2, 3):
    writer.write({"step": step, "reward_mean": 0.5 * step, "g": 4 * step, "note": "x",
                  "nan": float("nan")})
  writer.close()
  assert [r["g"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [4, 8, 12]
  (events,) = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
  scalars = {}
  for payload in _records(events):
    event = Event.FromString(payload)
    for value in event.summary.value:
      scalars[(value.tag, event.step)] = value.simple_value
  assert scalars == {("reward_mean", 1): 0.5, ("reward_mean", 2): 1.0, ("reward_mean", 3): 1.5,
                     ("g", 1): 4.0, ("g", 2): 8.0, ("g", 3): 12.0}   # no str, no NaN


def test_full_disk_is_raised_naming_the_file_not_hung(tmp_path):
  """A real write failure: the process may not grow any file past 64 KiB
  (RLIMIT_FSIZE: the kernel refuses the write with EFBIG, as a full disk refuses with
  ENOSPC). The TensorBoard file, with more bytes per row, hits it first. With
  tensorboardX's background writer the thread died and the loop blocked forever."""
  script = textwrap.dedent(f"""
      import io, resource, signal, sys
      sys.path.insert(0, {str(REPO)!r})
      from sagc_jax.runtime.metrics import MetricsWriteError, MetricsWriter
      writer = MetricsWriter({str(tmp_path)!r}, 10**6, stream=io.StringIO())
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
      resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
      try:
        for step in range(1, 100000):
          writer.write({{"step": step, **{{f"metric_{{i:02d}}": float(i) for i in range(60)}}}})
          if step % 5 == 0:
            writer.flush()
      except MetricsWriteError as err:
        print("FAILED AT", step, err)
        try:
          writer.close()
        except MetricsWriteError:
          pass
        sys.exit(3)
      """)
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 3, proc.stdout + proc.stderr
  assert "tensorboard/events.out.tfevents." in proc.stdout and "File too large" in proc.stdout


def test_read_jsonl_drops_a_torn_last_line_and_names_damage_elsewhere(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
  warned = []
  assert read_jsonl(path, warn=warned.append) == [{"step": 1}, {"step": 2}]
  assert len(warned) == 1 and f"{path}: dropping its torn last line 3" in warned[0]
  path.write_text('{"step": 1}\n{"step": 2, \n{"step": 3}\n')
  with pytest.raises(ValueError, match=f"{path}:2: not a JSON row"):
    read_jsonl(path)
