"""A restarted run reads every program that runs the model from the persistent
compilation cache.

JAX never writes a program that carries a host callback to its persistent cache, so
the samplers keep the length-stats ``io_callback`` out of their model programs, in a
small stats program of its own (``group_stats.lower_stats``). Two fresh processes
share one new cache folder: the first warms a tiny fused and a tiny segmented sampler
up and generates once; in the second, every model program must be a cache hit and
only the stats programs compile again, with the same tokens and stats as the first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The programs that run the model, by jitted function name: the fused sampler's
# generate program, the segmented sampler's shared prefill and decode segments. Their
# compaction (``sampler_compact``) holds no model but has no callback either.
MODEL_PROGRAMS = ("jit_sampler_generate", "jit_sampler_start", "jit_sampler_segment")
STATS_PROGRAM = "jit_sampler_stats"

# One process: warm both samplers up, generate once with each, and print per program
# name the persistent-cache hits and misses (JAX logs each with the module's name; the
# monitoring events carry no name), the warm-up's compile seconds and the samples.
SCRIPT = r"""
import collections, json, logging, time

from sagc_jax.runtime.platform import choose_platform
choose_platform()

import jax
import jax.monitoring

hits, misses = collections.Counter(), collections.Counter()

class Tally(logging.Handler):
  def emit(self, record):
    if record.msg.startswith("Persistent compilation cache hit for"):
      hits[record.args[0]] += 1
    elif record.msg.startswith("PERSISTENT COMPILATION CACHE MISS for"):
      misses[record.args[0]] += 1

log = logging.getLogger("jax._src.compiler")
log.setLevel(logging.DEBUG)
log.propagate = False
log.addHandler(Tally())
events = collections.Counter()
compile_s = [0.0]
def on_event(event, **kwargs):
  events[event] += 1
def on_duration(event, seconds, **kwargs):
  if event == "/jax/core/compile/backend_compile_duration":
    compile_s[0] += seconds
jax.monitoring.register_event_listener(on_event)
jax.monitoring.register_event_duration_secs_listener(on_duration)

from sagc_jax.models import ModelConfig, init_model
from sagc_jax.sampling import Sampler, SamplingParams

cfg = ModelConfig(model_type="llama", vocab_size=256, hidden_size=32, intermediate_size=64,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
model = init_model(cfg, seed=0)
params = SamplingParams(8, temperature=1.0, stop_ids=tuple(range(3, 256, 3)))
prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
out = {}
# Fused: a generate and a stats program per row bucket. Segmented (one bucket, to stay
# small): a shared prefill per group size, segments and a compaction over 2 spans and
# rows (8, 2), and a stats program.
for name, segment, buckets in (("fused", 0, (4, 8)), ("segmented", 4, (8,))):
  sampler = Sampler(model, params, row_buckets=buckets, prompt_buckets=(8,),
                    decode_segment=segment, min_compact_rows=1, group_sizes=(2, 4))
  before, start = compile_s[0], time.perf_counter()
  programs = sampler.warmup(model)
  warm_s, warm_compile_s = time.perf_counter() - start, compile_s[0] - before
  batch = sampler.generate(model, prompts, group_size=4, seed=3)
  out[name] = dict(programs=programs, warmup_s=warm_s, warmup_compile_s=warm_compile_s,
                   tokens=batch.response_tokens.tolist(), lengths=batch.lengths.tolist(),
                   group_max=batch.group_max.tolist(), group_median=batch.group_median.tolist())
print(json.dumps(dict(samplers=out, hits=hits, misses=misses,
                      hit_events=events["/jax/compilation_cache/cache_hits"])))
"""


def run_process(cache_dir: Path) -> dict:
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
             PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")])))
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  """(first, second) process reports on one fresh cache folder (not the session's)."""
  cache_dir = tmp_path_factory.mktemp("jax_cache")
  first = run_process(cache_dir)
  second = run_process(cache_dir)
  return first, second, cache_dir


def test_a_second_process_reads_every_model_program_from_the_cache(two_runs):
  first, second, cache_dir = two_runs
  written = {p.name.split("-", 1)[0] for p in cache_dir.iterdir()}   # NAME-KEY-cache
  for name in MODEL_PROGRAMS:
    assert first["hits"].get(name, 0) == 0 and first["misses"].get(name, 0) > 0, (name, first)
    # Every model program of the second process came from the cache, none compiled.
    assert second["misses"].get(name, 0) == 0, (name, second["misses"])
    assert second["hits"][name] == first["misses"][name], (name, second["hits"])
    assert name in written, (name, sorted(written))
  # What compiles again is the stats programs alone: one per row bucket and sampler.
  assert set(second["misses"]) == {STATS_PROGRAM}, second["misses"]
  assert second["misses"][STATS_PROGRAM] == first["misses"][STATS_PROGRAM] == 2 + 1
  assert STATS_PROGRAM not in written
  assert sum(second["hits"].values()) == second["hit_events"]
  for kind in ("fused", "segmented"):
    assert second["samplers"][kind]["programs"] == first["samplers"][kind]["programs"]


def test_programs_read_from_the_cache_sample_the_same_tokens_and_stats(two_runs):
  first, second, _ = two_runs
  for kind in ("fused", "segmented"):
    a, b = first["samplers"][kind], second["samplers"][kind]
    for field in ("tokens", "lengths", "group_max", "group_median"):
      assert a[field] == b[field], (kind, field)
  fused, segmented = first["samplers"]["fused"], first["samplers"]["segmented"]
  assert fused["group_max"] == segmented["group_max"] and len(fused["group_max"]) == 2
