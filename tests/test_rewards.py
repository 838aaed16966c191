"""Rewards: answer extraction, exact match, math-verify in process and in a spawn pool."""

import concurrent.futures
import threading

import numpy as np
import pytest

from sagc_jax.rewards.verifiers import (REWARD_NAMES, ExactMatchReward, MathVerifyReward, RewardResult,
                              extract_synthetic_answer, last_boxed_content, make_reward_fn)


def test_extract_synthetic_answer():
  assert extract_synthetic_answer("7+5=12\n12-3=9\nanswer 9\n") == "9"
  assert extract_synthetic_answer("answer -12") == "-12"
  assert extract_synthetic_answer("answer 3\ncheck 1+2=3\nanswer 4\n") == "4"  # the last
  assert extract_synthetic_answer("answer 9\nsome trailing text") == "9"
  assert extract_synthetic_answer("answer  9 \n") == "9"
  assert extract_synthetic_answer("12-3=9\n") is None
  assert extract_synthetic_answer("the answer 9\n") is None        # not at line start
  assert extract_synthetic_answer("answer 9\nanswer nine\n") is None  # last line unparseable
  assert extract_synthetic_answer("answer 9x") is None
  assert extract_synthetic_answer("") is None


def test_last_boxed_content():
  assert last_boxed_content("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
  assert last_boxed_content("\\boxed{1} then \\boxed{ {a}{b} }") == " {a}{b} "
  assert last_boxed_content("\\boxed{2} and \\boxed{unclosed") == "2"
  assert last_boxed_content("\\boxed 5 apples") == "5"
  assert last_boxed_content("\\fbox{7}") == "7"
  assert last_boxed_content("no box") is None
  assert last_boxed_content("\\boxedx") is None


def test_exact_match_scores():
  reward = make_reward_fn("exact_match")
  assert isinstance(reward, ExactMatchReward)
  responses = ["1+2=3\nanswer 3\n", "answer 4\n", "1+2=3\n", "answer -2\n",
               "answer 3\njunk after", "answer 3", " answer 3"]
  answers = ["3", "3", "3", "-2", "3", " 3 ", "3"]
  res = reward(responses, answers)
  assert isinstance(res, RewardResult)
  np.testing.assert_array_equal(res.correct, [1, 0, 0, 1, 1, 1, 0])
  np.testing.assert_array_equal(res.formatted, [1, 1, 0, 1, 1, 1, 0])
  assert res.scores.dtype == np.float32
  np.testing.assert_array_equal(res.scores, res.correct.astype(np.float32))


def test_exact_match_format_bonus_and_submit():
  reward = make_reward_fn("exact_match", format_weight=0.1)
  res = reward(["answer 3", "answer 4", "nothing"], ["3", "3", "3"])
  np.testing.assert_allclose(res.scores, [1.1, 0.1, 0.0], rtol=1e-6)
  fut = reward.submit(["answer 3"], ["3"])
  assert isinstance(fut, concurrent.futures.Future) and fut.done()
  np.testing.assert_allclose(fut.result().scores, [1.1], rtol=1e-6)
  empty = reward([], [])
  assert empty.scores.shape == (0,) and empty.correct.dtype == bool
  with pytest.raises(ValueError, match="2 responses but 1 answers"):
    reward(["a", "b"], ["a"])
  with pytest.raises(TypeError, match="sequence of str"):
    reward("answer 3", "3")
  with pytest.raises(TypeError, match=r"answers\[0\] must be a str"):
    reward(["answer 3"], [3])


def test_make_reward_fn_errors():
  with pytest.raises(ValueError, match=r"allowed: \['exact_match', 'math_verify'\]"):
    make_reward_fn("f1")
  with pytest.raises(ValueError, match="format_weight"):
    make_reward_fn("exact_match", format_weight=float("nan"))
  with pytest.raises(ValueError, match="workers"):
    make_reward_fn("math_verify", workers=-1)
  assert REWARD_NAMES == ("exact_match", "math_verify")


# (response, reference answer, correct, formatted)
MATH_CASES = [
    ("So the result is \\boxed{\\frac{1}{2}}.", "0.5", True, True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True, True),
    ("\\boxed{3}", "4", False, True),
    ("She pays 5 * 3 = 15 dollars, then 15 + 3 = 18.\n#### 18", "18", True, False),
    ("The total is 1,234 apples.", "1234", True, False),
    ("First \\boxed{4}, no wait: \\boxed{5}", "5", True, True),
    ("\\boxed{5} no wait \\boxed{4}", "5", False, True),
    ("\\boxed{\\sqrt{2}}", "2^{1/2}", True, True),
    ("\\boxed{-3}", "$-3$", True, True),
    ("I do not know.", "7", False, False),
    ("", "7", False, False),
    ("\\boxed{x+1}", "1+x", True, True),
]


def _expected(format_weight):
  correct = np.array([c[2] for c in MATH_CASES])
  formatted = np.array([c[3] for c in MATH_CASES])
  return correct, formatted, correct + format_weight * formatted


def test_math_verify_in_process():
  responses, answers = [c[0] for c in MATH_CASES], [c[1] for c in MATH_CASES]
  with make_reward_fn("math_verify", format_weight=0.25) as reward:
    assert isinstance(reward, MathVerifyReward)
    res = reward(responses, answers)
    fut = reward.submit(responses[:2], answers[:2])
    assert fut.done() and fut.result().correct.tolist() == [True, True]
  correct, formatted, scores = _expected(0.25)
  np.testing.assert_array_equal(res.correct, correct)
  np.testing.assert_array_equal(res.formatted, formatted)
  np.testing.assert_allclose(res.scores, scores, rtol=1e-6)
  with pytest.raises(RuntimeError, match="closed"):
    reward(responses, answers)


def test_math_verify_off_main_thread():
  responses, answers = [c[0] for c in MATH_CASES], [c[1] for c in MATH_CASES]
  reward = make_reward_fn("math_verify")
  out = {}
  thread = threading.Thread(target=lambda: out.setdefault("res", reward(responses, answers)))
  thread.start()
  thread.join()
  np.testing.assert_array_equal(out["res"].correct, _expected(0.0)[0])


def test_math_verify_process_pool_matches_in_process():
  responses = [c[0] for c in MATH_CASES] * 3
  answers = [c[1] for c in MATH_CASES] * 3
  in_process = make_reward_fn("math_verify", format_weight=0.1)(responses, answers)
  with make_reward_fn("math_verify", format_weight=0.1, workers=2) as reward:
    futures = [reward.submit(responses, answers), reward.submit(responses[::-1], answers[::-1])]
    pooled, reversed_ = (f.result(timeout=120) for f in futures)
    again = reward(responses[:5], answers[:5])  # the pool is reused
    assert reward([], []).scores.shape == (0,)
  for a, b in zip(in_process, pooled):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(reversed_.correct, in_process.correct[::-1])
  np.testing.assert_array_equal(again.correct, in_process.correct[:5])
  assert reward._pool is None  # closed by the context manager
