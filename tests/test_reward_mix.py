"""Pluggable rewards (#15): built-in and user reward terms, weights, None, failures.

The user functions below are referenced as ``"test_reward_mix:<name>"`` (pytest puts
this folder on ``sys.path``), the way a user names a function in their own module.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from sagc_jax.config import preset, validate
from sagc_jax.rewards.mix import RewardMix, RewardTerm
from sagc_jax.rewards.specs import check_reward_config, term_name

COMPLETIONS = ["12-3=9\nanswer 9", "answer 4", "no answer here", "answer 7\n"]
ANSWERS = ["9", "5", "3", "7"]
CORRECT = np.array([1, 0, 0, 1], float)        # exact_match, written out by hand
FORMATTED = np.array([1, 1, 0, 1], float)


def length_bonus(prompts, completions, **fields):
  return [len(c) / 100.0 for c in completions]


def only_answers(completions, answer):
  """No **kwargs: receives only the fields it names."""
  return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def sees_all_fields(prompts, completions, **fields):
  assert set(fields) == {"answer", "id"}, fields
  return [float(i) for i in fields["id"]]


def answer_line_or_none(prompts, completions, **fields):
  """Not applicable (None) to completions without an answer line."""
  return [1.0 if c.startswith("answer") or "\nanswer" in c else None for c in completions]


def fails_on_no_answer(prompts, completions, **fields):
  if any("no answer" in c for c in completions):
    raise RuntimeError("cannot parse")
  return [2.0] * len(completions)


def fails_on_odd_length(prompts, completions, **fields):
  if any(len(c) % 2 for c in completions):
    raise ValueError("odd")
  return [1.0] * len(completions)


def hangs_on_seven(prompts, completions, **fields):
  """Catastrophic regex backtracking: holds the GIL for minutes (a thread-based
  timeout could not return; the worker process is killed)."""
  import re
  if any("7" in c for c in completions):
    re.match(r"^(a+)+$", "a" * 40 + "!")
  return [1.0] * len(completions)


def math_verify_reward(completions, answer, **fields):
  """What TRL's accuracy reward does: math-verify, whose timeouts use signal.alarm
  (main thread only)."""
  import math_verify
  return [float(math_verify.verify(math_verify.parse("$" + a + "$"), math_verify.parse(c)))
          for c, a in zip(completions, answer)]


def zero_dim_array(prompts, completions, **fields):
  return np.array(0.5)


def overflowing(prompts, completions, **fields):
  return [10 ** 400] * len(completions)


def infinite_in_float32(prompts, completions, **fields):
  return [1e39] * len(completions)          # finite in float64, inf in float32


def wrong_length(prompts, completions, **fields):
  return [1.0]


def returns_text(prompts, completions, **fields):
  return ["1"] * len(completions)


def _mix(*specs, weights=None, **kwargs):
  weights = weights or [1.0] * len(specs)
  terms = [RewardTerm(term_name(s), s, w) for s, w in zip(specs, weights)]
  return RewardMix("exact_match", terms, **kwargs)


def test_no_terms_is_the_verifier_score_as_before():
  out = RewardMix("exact_match", [], format_weight=0.25)(COMPLETIONS, ANSWERS)
  np.testing.assert_allclose(out.scores, CORRECT + 0.25 * FORMATTED)
  np.testing.assert_array_equal(out.correct, CORRECT.astype(bool))
  np.testing.assert_array_equal(out.errors, 0)
  assert out.terms.shape == (4, 1)


def test_weighted_sum_of_builtin_and_user_terms():
  mix = _mix("exact_match", "format", "test_reward_mix:length_bonus", weights=[1.0, 0.5, -2.0])
  out = mix(COMPLETIONS, ANSWERS, prompts=["p"] * 4)
  lengths = np.array([len(c) for c in COMPLETIONS]) / 100.0
  np.testing.assert_allclose(out.scores, CORRECT + 0.5 * FORMATTED - 2.0 * lengths, rtol=1e-6)
  np.testing.assert_allclose(out.terms, np.stack([CORRECT, FORMATTED, lengths], 1), rtol=1e-6)
  assert mix.term_names == ["exact_match", "format", "length_bonus"]
  # Accuracy stays the task verifier's, whatever the training reward is.
  np.testing.assert_array_equal(out.correct, CORRECT.astype(bool))


def test_user_functions_get_the_dataset_fields_they_accept():
  out = _mix("test_reward_mix:only_answers", "test_reward_mix:sees_all_fields")(
      COMPLETIONS, ANSWERS, prompts=["p"] * 4, fields={"id": [10, 11, 12, 13]})
  np.testing.assert_allclose(out.terms[:, 0], [1, 0, 0, 1])
  np.testing.assert_allclose(out.terms[:, 1], [10, 11, 12, 13])
  np.testing.assert_array_equal(out.errors, 0)


def test_none_means_not_applicable():
  out = _mix("exact_match", "test_reward_mix:answer_line_or_none", weights=[1.0, 3.0])(
      COMPLETIONS, ANSWERS)
  assert np.isnan(out.terms[2, 1]) and not np.isnan(out.terms[[0, 1, 3], 1]).any()
  np.testing.assert_allclose(out.scores, CORRECT + 3.0 * np.array([1, 1, 0, 1]))


def test_a_raising_function_costs_only_the_completion_it_fails_on():
  messages = []
  mix = _mix("exact_match", "test_reward_mix:fails_on_no_answer", log=messages.append)
  for _ in range(2):
    out = mix(COMPLETIONS, ANSWERS)
    np.testing.assert_allclose(out.terms[:, 1], [2, 2, 0, 2])
    np.testing.assert_array_equal(out.errors, [0, 0, 1, 0])
    np.testing.assert_allclose(out.scores, CORRECT + np.array([2, 2, 0, 2]))
  assert len(messages) == 1                      # logged once, counted every time
  assert "fails_on_no_answer" in messages[0] and "cannot parse" in messages[0]
  assert "'no answer here'" in messages[0] and "reward/errors" in messages[0]


def test_long_offending_completions_are_truncated_in_the_log():
  messages = []
  long = "no answer " + "x" * 5000
  _mix("test_reward_mix:fails_on_no_answer", log=messages.append)([long], ["1"])
  assert "x" * 190 in messages[0] and "x" * 300 not in messages[0] and "..." in messages[0]


def test_a_hanging_function_times_out_per_completion_even_holding_the_gil():
  with _mix("test_reward_mix:hangs_on_seven", timeout_s=1.0, log=lambda m: None) as mix:
    mix(COMPLETIONS[:1], ANSWERS[:1])           # the worker process is up
    start = time.perf_counter()
    out = mix(COMPLETIONS, ANSWERS)
    elapsed = time.perf_counter() - start
    np.testing.assert_allclose(out.terms[:, 0], [1, 1, 1, 0])
    np.testing.assert_array_equal(out.errors, [0, 0, 0, 1])
    # Two timed-out calls (the batch, then the completion) and two worker restarts;
    # the backtracking alone would take hours.
    assert elapsed < 60, elapsed
    assert mix._worker.restarts == 2
    np.testing.assert_allclose(mix(COMPLETIONS[:3], ANSWERS[:3]).terms[:, 0], 1.0)


def test_user_functions_may_use_math_verify_and_its_signal_timeouts():
  with _mix("test_reward_mix:math_verify_reward") as mix:
    out = mix(["so $\\frac{1}{2}$", "it is 0.5", "maybe 3"], ["0.5", "\\frac{1}{2}", "4"])
  np.testing.assert_allclose(out.terms[:, 0], [1, 1, 0])
  np.testing.assert_array_equal(out.errors, 0)


@pytest.mark.parametrize("spec", ["wrong_length", "returns_text", "zero_dim_array",
                                  "overflowing", "infinite_in_float32"])
def test_malformed_output_scores_zero_and_is_counted(spec):
  messages = []
  out = _mix("exact_match", f"test_reward_mix:{spec}", log=messages.append)(COMPLETIONS,
                                                                              ANSWERS)
  if spec == "wrong_length":     # right length for single completions: only batch fails
    np.testing.assert_array_equal(out.errors, 0)
    np.testing.assert_allclose(out.terms[:, 1], 1.0)
  else:
    np.testing.assert_array_equal(out.errors, 1)
    np.testing.assert_allclose(out.scores, CORRECT)
    assert {"returns_text": "a float or None is expected",
            "zero_dim_array": "cannot be read as a sequence",
            "overflowing": "rewards must be finite",
            "infinite_in_float32": "rewards must be within +-1e+09"}[spec] in messages[0]


@pytest.mark.parametrize("fns, weights, timeout, match", [
    (("no_such_reward",), (), 10.0, "neither a built-in reward"),
    (("no_such_module_xyz:f",), (), 10.0, "cannot import module 'no_such_module_xyz'"),
    (("test_reward_mix:missing",), (), 10.0, "has no callable 'missing'"),
    (("exact_match", "format"), (1.0,), 10.0, "reward.weights=.*1 entries but reward.fns has 2"),
    (("exact_match",), (float("nan"),), 10.0, "must be a finite number"),
    (("test_reward_mix:length_bonus", "other.mod:length_bonus"), (), 10.0, "two terms"),
    (("exact_match",), (), 0.0, "reward.timeout_s=0.0"),
    (("my_module:errors",), (), 10.0, "a term named 'errors' would overwrite reward/errors"),
])
def test_bad_reward_settings_are_refused_at_start_up(fns, weights, timeout, match):
  c = preset("grpo", "sagc")
  c.reward.update(dict(fns=fns, weights=weights, timeout_s=timeout))
  with pytest.raises(ValueError, match=match):
    validate(c)


def test_good_settings_pass_validation():
  c = preset("grpo", "sagc")
  c.reward.update(dict(fns=("exact_match", "format", "test_reward_mix:length_bonus"),
                       weights=(1.0, 0.1, 0.5)))
  validate(c)
  check_reward_config(c.reward)


def test_training_logs_each_term_and_the_weighted_total(shared, tmp_path):
  from test_trainer import run, small_config
  config = small_config(shared, steps=2)
  config.reward.update(dict(fns=("exact_match", "test_reward_mix:length_bonus",
                                 "test_reward_mix:fails_on_odd_length"),
                            weights=(1.0, 0.5, 0.25)))
  run(config, tmp_path)
  from sagc_jax.runtime.metrics import load_history
  rows = load_history(tmp_path)
  assert len(rows) == 2
  for row in rows:
    expected = (row["reward/exact_match"] + 0.5 * row["reward/length_bonus"]
                + 0.25 * row["reward/fails_on_odd_length"])
    assert row["reward_mean"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert row["reward/length_bonus"] > 0
    # Odd-length completions fail (score 0, counted), even ones score 1: the run goes on.
    assert row["reward/errors"] > 0
    assert row["reward/fails_on_odd_length"] + row["reward/errors"] / row["rollouts"] == (
        pytest.approx(1.0))


@pytest.mark.parametrize("source, match", [
    ("import time\ntime.sleep(3600)\ndef f(completions): return [0.0] * len(completions)\n",
     r"importing module '{m}' of '{m}:f' did not finish within 2 s"),
    ("def f(completions):\n  return [\n", r"importing '{m}:f' raised SyntaxError"),
    ("raise RuntimeError('no GPU here')\n", r"importing '{m}:f' raised RuntimeError: no GPU here"),
], ids=["blocks", "syntax-error", "raises"])
def test_a_reward_module_is_imported_apart_with_a_timeout(tmp_path, monkeypatch, source, match):
  """Start-up imports user reward modules in a child process with reward.timeout_s: a
  module that blocks at import is refused naming it (it used to hang start-up with no
  output), and one that fails to import is one line, not a traceback."""
  name = f"user_reward_{abs(hash(source)) % 10**8}"
  (tmp_path / f"{name}.py").write_text(source)
  monkeypatch.syspath_prepend(str(tmp_path))
  from sagc_jax.rewards import specs
  monkeypatch.setattr(specs, "IMPORT_TIMEOUT_S", 2.0)      # 60 s by default
  c = preset("grpo", "sagc")
  c.reward.update(dict(fns=(f"{name}:f",), timeout_s=1.0))
  start = time.perf_counter()
  with pytest.raises(ValueError, match=match.format(m=name)):
    validate(c)
  assert time.perf_counter() - start < 60
  assert name not in sys.modules                       # never imported in this process
