"""Recording a trace of a policy (``training.trace_sampling``): what calibrate samples."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sagc_jax.replay.trace import read_trace
from sagc_jax.training.trace_sampling import fit_decode_cost, fit_learner_cost, record_trace


def test_learner_cost_fit_recovers_the_step_and_token_costs_of_the_updates():
  updates = [{"tokens": t, "seconds": 0.1 + 2e-4 * t} for t in (700, 1500, 3200, 900)]
  fit = fit_learner_cost(updates)
  assert fit["step_s"] == pytest.approx(0.1) and fit["token_s"] == pytest.approx(2e-4)


def test_decode_cost_fit_recovers_the_step_and_slot_costs_of_the_calls():
  calls = [{"decode_steps": t, "decode_slots": s, "seconds": 0.02 * t + 2e-4 * s}
           for t, s in ((100, 900), (400, 2000), (512, 9000), (300, 8000))]
  fit = fit_decode_cost(calls)
  assert fit["step_s"] == pytest.approx(0.02) and fit["slot_s"] == pytest.approx(2e-4)
  assert fit["calls"] == calls
  # Calls that a negative per-step cost would fit best: the cost stays non-negative.
  fit = fit_decode_cost([{"decode_steps": t, "decode_slots": s, "seconds": 1e-3 * s - 1e-3 * t}
                         for t, s in ((10, 900), (40, 2000), (50, 9000))])
  assert fit["step_s"] >= 0 and fit["slot_s"] > 0


def test_a_trace_resumed_midway_equals_one_sampled_at_once(shared, tmp_path):
  """6 prompts x 8 responses of the tiny policy: every response is a real sample
  (length within the cap, truncated only at the cap, reward at least its correctness),
  nothing compiles after warm-up, and a run stopped after 2 prompts and resumed to 6
  writes the same trace as a run of 6 at once (the seeds depend on the prompt only)."""
  from test_trainer import small_config

  config = small_config(shared)
  messages = []
  whole = read_trace(record_trace(config, tmp_path / "whole", prompts=6, responses=8,
                                  log=messages.append))
  assert (whole.prompts, whole.responses) == (6, 8)
  assert whole.header["compiles_after_warmup"] == 0
  assert ((1 <= whole.lengths) & (whole.lengths <= 16)).all()
  assert (whole.lengths[whole.truncated] == 16).all()
  assert (whole.rewards >= whole.correct).all()
  assert len(whole.header["decode_cost"]["trace_calls"]) == 3   # 2 prompts x 8 rows a call
  # A training step timed at each candidate G, 3 times after a warm-up: sampler and learner.
  steps = whole.header["decode_cost"]["calls"]
  sizes = sorted(config.controller.candidates)
  assert sorted(c["g"] for c in steps) == sorted(sizes * 3)
  updates = whole.header["learner_cost"]["updates"]
  assert [u["g"] for u in updates] == [c["g"] for c in steps]
  assert all(u["seconds"] > 0 and u["tokens"] > u["rows"] for u in updates)
  assert any("calibrate: 6/6 prompts" in m for m in messages)

  part = tmp_path / "part"
  record_trace(config, part, prompts=2, responses=8, log=lambda m: None)
  # A stopped run leaves its finished batches in the partial file: make one.
  lines = (part / "trace.jsonl").read_text().splitlines()
  header = {k: v for k, v in json.loads(lines[0]).items()
            if k not in ("schema", "decode_cost", "learner_cost", "date",
                         "compiles_after_warmup")}
  batch = {"records": [json.loads(line) for line in lines[1:]],
           "calls": [{"rows": 16, "decode_steps": 1, "decode_slots": 16, "seconds": 0.1}]}
  (part / "trace.partial.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(batch) + "\n")
  (part / "trace.jsonl").unlink()
  messages = []
  resumed = read_trace(record_trace(config, part, prompts=6, responses=8, log=messages.append))
  assert any("resuming after 2 prompts" in m for m in messages)
  for key in ("lengths", "rewards", "correct", "truncated", "prompt_tokens", "ids"):
    np.testing.assert_array_equal(getattr(resumed, key), getattr(whole, key))
  assert not (part / "trace.partial.jsonl").exists()
