"""Test-session setup: 8 fake CPU devices for the sharding tests.

The device count is fixed when jax initialises its backend, so it must be set
before any test module imports jax. Single-device code is unaffected (arrays
live on device 0 unless a mesh says otherwise).
"""

import os


def _add_xla_flag(flag: str, unless: str | None = None) -> None:
  """Appends ``flag`` to ``XLA_FLAGS`` unless ``unless`` (default: the flag itself) is
  there already."""
  flags = os.environ.get("XLA_FLAGS", "")
  if (unless or flag) not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


_add_xla_flag("--xla_force_host_platform_device_count=8")

# No TPU here: JAX on CPU without loading libtpu (its noise and lockfile), as every
# command does (runtime/platform.py); AOT compilation for abstract TPU topologies
# loads libtpu itself and works with the CPU platform.
from sagc_jax.runtime.platform import choose_platform  # noqa: E402

choose_platform()

# libtpu (the `tpu` extra, for the AOT tests) takes a per-machine lockfile when JAX
# initialises; the AOT CLI test starts a second process that must load it too.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import collections  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

# Modules whose tests train, start several processes, compile TPU programs or load the
# real model: marked ``slow`` and run after everything else, so that a first failure
# in the fast correctness tests shows within minutes. ``pytest -m "not slow"`` is the
# quick suite, ``pytest -m slow`` the rest (docs/testing.md).
SLOW_MODULES = frozenset({
    "test_aot", "test_compare", "test_completion_log", "test_export", "test_import_model",
    "test_launch", "test_multihost", "test_process_faults", "test_reward_mix",
    "test_stop_phases", "test_storage", "test_trainer"})

# Single tests of quick modules that take half a minute or more on 2 cores and repeat
# what a quicker sibling in the quick suite checks (another parameter, a mesh, a
# subprocess; the forward options keep each option row once, on a rotating family):
# ``slow`` too, to shorten the quick suite. Node ids without the ``tests/`` prefix; a
# name of a collected module that matches none of its tests fails the session.
SLOW_TESTS = frozenset({
    "test_bench.py::test_real_model_learner_reports_both_layouts_on_sampled_lengths",
    "test_evaluation.py::test_evaluation_reports_pass_at_k_without_new_compilations[segmented]",
    "test_learner.py::test_gradient_accumulation_equals_one_big_minibatch[seq-mean-token-sum-norm]",
    "test_learner.py::test_zero_compilations_after_warmup_across_group_sizes[True]",
    "test_models.py::test_train_cli_reports_a_truncated_checkpoint_in_one_line",
    "test_packing.py::test_packed_and_padded_learners_equal_the_reference_on_8_devices",
    "test_packing.py::test_packed_and_padded_learners_equal_the_reference[grpo-seq-mean-token-mean-uniform-1]",
    "test_packing.py::test_packed_and_padded_learners_equal_the_reference[grpo-token-mean-heavy-2]",
    "test_packing.py::test_packed_and_padded_learners_equal_the_reference[dapo-token-mean-uniform-2]",
    "test_refill.py::test_refill_on_a_mesh_samples_the_single_device_fused_tokens[2x4-reference]",
    "test_refill.py::test_refill_on_a_mesh_samples_the_single_device_fused_tokens[4x2-reference]",
    "test_refill.py::test_refill_on_a_mesh_samples_the_single_device_fused_tokens[4x2-xla]",
    "test_refill.py::test_refill_samples_the_fused_tokens_with_4_slots_for_16_rows[0.0-1.0]",
    "test_refill.py::test_refill_samples_the_fused_tokens_with_4_slots_for_16_rows[1.0-1.0]",
    "test_scale.py::test_memory_knobs_and_fsdp_give_the_plain_update[splash]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options0-512-llama]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options0-512-qwen2]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options1-512-llama]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options1-512-qwen3]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options2-512-llama]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options2-512-qwen2]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options3-5-qwen2]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options3-5-qwen3]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options4-4-llama]",
    "test_scale.py::test_forward_options_give_the_plain_loss_and_gradients[options4-4-qwen3]",
    "test_scale.py::test_no_compilation_after_warmup_with_every_knob_on_a_mesh",
    "test_segmented.py::test_compaction_off_keeps_every_row_and_the_same_tokens",
    "test_segmented.py::test_segmented_on_8_devices_samples_the_single_device_fused_tokens",
    "test_segmented.py::test_segmented_samples_the_fused_tokens_across_compactions[0.0-1.0]",
    "test_segmented.py::test_segmented_samples_the_fused_tokens_across_compactions[1.0-1.0]",
    "test_warm_start.py::test_guess_stage_makes_answer_only_solutions_the_likely_start",
})

# Modules (and tests marked ``libtpu``) that compile for abstract TPU topologies: they
# need libtpu (the ``tpu`` extra, ~680 MB, kept out of the ``test`` extra so that the
# quick suite installs without it), run in the slow half, and skip with the install
# line when libtpu is missing.
LIBTPU_MODULES = frozenset({"test_aot", "test_hbm_traffic"})


# The quick suite's models are tiny, so compiling is most of its time: it compiles with
# LLVM's optimisation level 0, which cuts XLA:CPU compile time by about a third (the
# programs, their HLO and every check are the same; only CPU code generation is less
# optimised). The slow half and a whole-suite run compile as the commands do. A level
# set in XLA_FLAGS by the caller wins.
QUICK_SUITE_XLA_FLAG = "--xla_backend_optimization_level=0"


def pytest_configure(config):
  if config.getoption("markexpr", "") == "not slow":
    _add_xla_flag(QUICK_SUITE_XLA_FLAG, unless="xla_backend_optimization_level")
  config.addinivalue_line("markers", "slow: trains, runs several processes, compiles for "
                          "TPU or loads the real model (runs last; -m 'not slow' skips)")
  config.addinivalue_line("markers", "libtpu: compiles for an abstract TPU topology (needs "
                          "the tpu extra; slow)")
  # With pytest-xdist (-n N) the terminal shows one dot per test and no module names:
  # the controller prints a line as each module finishes instead.
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    config.pluginmanager.register(ModuleProgress(config), "sagc-module-progress")


class ModuleProgress:
  """Under pytest-xdist: ``tests/test_x.py: 12 tests, 0 failed, done at 3 min 5 s`` per
  module finished, so a run on a user's machine shows where it is and what failed (a
  test counts once, whether its setup, call or teardown failed)."""

  def __init__(self, config):
    self.config = config
    self.start = time.monotonic()
    self.left: collections.Counter | None = None
    self.failed: dict[str, set[str]] = collections.defaultdict(set)
    self.total: dict[str, int] = {}

  @pytest.hookimpl(optionalhook=True)
  def pytest_xdist_node_collection_finished(self, node, ids):
    if self.left is None:                     # every worker collects the same tests
      self.left = collections.Counter(i.split("::")[0] for i in ids)
      self.total = dict(self.left)

  def pytest_runtest_logreport(self, report):
    module = report.nodeid.split("::")[0]
    if self.left is None or module not in self.left:
      return
    if report.failed:
      self.failed[module].add(report.nodeid)
    if report.when != "teardown":
      return
    self.left[module] -= 1
    if self.left[module] == 0:
      minutes, seconds = divmod(int(time.monotonic() - self.start), 60)
      reporter = self.config.pluginmanager.get_plugin("terminalreporter")
      if reporter is not None:                 # None with -p no:terminal
        reporter.write(f"\n{module}: {self.total[module]} tests, "
                       f"{len(self.failed[module])} failed, done at {minutes} min {seconds} s\n")


def pytest_collection_modifyitems(config, items):
  import importlib.util

  no_libtpu = pytest.mark.skip(
      reason="needs libtpu for TPU ahead-of-time compilation on this host: "
             "pip install -e '.[tpu]' (the slow suite's install line)")
  has_libtpu = importlib.util.find_spec("libtpu") is not None
  unmatched, modules = set(SLOW_TESTS), set()
  for item in items:
    module = item.module.__name__.rpartition(".")[2]
    needs_libtpu = module in LIBTPU_MODULES or item.get_closest_marker("libtpu") is not None
    test_id = item.nodeid.rpartition("tests/")[2]
    unmatched.discard(test_id)
    modules.add(test_id.partition("::")[0])
    if module in SLOW_MODULES or needs_libtpu or test_id in SLOW_TESTS:
      item.add_marker(pytest.mark.slow)
    if needs_libtpu and not has_libtpu:
      item.add_marker(no_libtpu)
  # A renamed test must not slip back into the quick suite unnoticed; checked for the
  # modules collected whole (not under -k, --lf or a test id).
  stale = sorted(t for t in unmatched if t.partition("::")[0] in modules
                 and not config.getoption("-k") and not config.getoption("--lf", False))
  if stale and not any("::" in a for a in config.args):
    raise pytest.UsageError(f"tests/conftest.py SLOW_TESTS names tests that do not exist: "
                            f"{stale}")
  items.sort(key=lambda item: item.get_closest_marker("slow") is not None)  # stable
