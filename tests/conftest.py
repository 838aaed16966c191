"""Test-session setup: 8 fake CPU devices for the sharding tests, one compilation cache
and one local cache for the whole session, and tests that share programs on one worker.

The device count is fixed when jax initialises its backend, so it must be set
before any test module imports jax. Single-device code is unaffected (arrays
live on device 0 unless a mesh says otherwise).

The suite is compile-bound (tiny models), so each program should compile once per
test run (docs/testing.md, "Where the time goes"):

- JAX's persistent compilation cache in a folder of the session serves every program
  without a host callback to both xdist workers and to later tests that build the same
  program again. A cache hit still counts as a compilation
  (``/jax/core/compile/backend_compile_duration``), so the "nothing compiles after
  warm-up" checks keep their strength.
- Programs with a host callback (every sampler's small length-stats program; the
  model programs carry none, ``tests/test_program_cache.py``) are never written to that
  cache, so tests that share them must share the objects that hold them: session
  fixtures (``llama``, ``qwen2``, ``sharded_llama``), ``test_sampler.fused_reference``
  and ``WORKER_GROUPS``, which sends the modules that use them to one worker.
- ``SAGC_CACHE_DIR`` (warm starts, converted models) is a folder of the session too:
  a run of the suite neither reads nor leaves anything in ``~/.cache``.
"""

import os
import shutil
import tempfile
from pathlib import Path


def _add_xla_flag(flag: str, unless: str | None = None) -> None:
  """Appends ``flag`` to ``XLA_FLAGS`` unless ``unless`` (default: the flag itself) is
  there already."""
  flags = os.environ.get("XLA_FLAGS", "")
  if (unless or flag) not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


_add_xla_flag("--xla_force_host_platform_device_count=8")

# One OpenMP thread per process (torch's reference models, BLAS): the suite runs one
# xdist worker per core, and torch's default of a thread per core then oversubscribes
# the cores; its OpenMP threads spin while they wait, which made one 64-token
# transformers generate take minutes instead of seconds beside a busy worker. XLA's own
# thread pool is not OpenMP and keeps its size.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The first process of a test run (xdist's controller, or a run without -n) makes the
# session folder; the workers and every process a test starts inherit it.
SESSION_DIR_ENV = "SAGC_TEST_SESSION_DIR"
_OWNS_SESSION_DIR = SESSION_DIR_ENV not in os.environ
if _OWNS_SESSION_DIR:
  os.environ[SESSION_DIR_ENV] = tempfile.mkdtemp(prefix="sagc-tests-")
SESSION_DIR = Path(os.environ[SESSION_DIR_ENV])
os.environ.setdefault("SAGC_CACHE_DIR", str(SESSION_DIR / "local_cache"))
# The trainer's runs in this session point their compilation cache here as well, and
# write every program to it, as the test processes do (``pytest_configure``).
JAX_CACHE_DIR = SESSION_DIR / "jax_cache"
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

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
    "test_launch", "test_multihost", "test_process_faults", "test_program_cache",
    "test_resume_fixture", "test_reward_mix", "test_stop_phases", "test_storage",
    "test_trainer"})

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
# LLVM's optimisation level 0 and XLA:CPU's classic elemental emitters instead of its
# MLIR fusion emitters, which together halve XLA:CPU compile time (the programs, their
# HLO and every check are the same; only CPU code generation differs). The slow half
# and a whole-suite run compile as the commands do. A value set in XLA_FLAGS by the
# caller wins.
QUICK_SUITE_XLA_FLAG = "--xla_backend_optimization_level=0"
QUICK_SUITE_CODEGEN_FLAG = "--xla_cpu_use_fusion_emitters=false"


def _is_xdist_controller(config) -> bool:
  """True in the process that hands tests to xdist's workers (``-n N``) and runs none."""
  return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config,
                                                                             "workerinput")


def pytest_configure(config):
  if config.getoption("markexpr", "") == "not slow":
    _add_xla_flag(QUICK_SUITE_XLA_FLAG, unless="xla_backend_optimization_level")
    _add_xla_flag(QUICK_SUITE_CODEGEN_FLAG, unless="xla_cpu_use_fusion_emitters")
  if not _is_xdist_controller(config):      # the controller starts the workers without jax
    import jax

    jax.config.update("jax_compilation_cache_dir", str(JAX_CACHE_DIR))
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
  config.addinivalue_line("markers", "slow: trains, runs several processes, compiles for "
                          "TPU or loads the real model (runs last; -m 'not slow' skips)")
  config.addinivalue_line("markers", "libtpu: compiles for an abstract TPU topology (needs "
                          "the tpu extra; slow)")
  if os.environ.get("SAGC_TEST_PROFILE"):
    import compile_profile      # where the time goes, per test (docs/testing.md)
    config.pluginmanager.register(compile_profile, "sagc-compile-profile")
  # With pytest-xdist (-n N) the terminal shows one dot per test and no module names:
  # the controller prints a line as each module finishes instead.
  if _is_xdist_controller(config):
    config.pluginmanager.register(ModuleProgress(config), "sagc-module-progress")


def pytest_unconfigure(config):
  if _OWNS_SESSION_DIR:             # workers inherit the folder; its maker removes it
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


# Modules whose tests share session fixtures and the programs those hold (the samplers'
# stats programs carry a host callback, which the persistent cache cannot serve): under
# xdist each group runs on one worker, so its programs compile once per test run. The
# other quick modules run whole on a worker (their module fixtures build once); the
# slow modules are spread test by test (each test starts its own processes or runs).
WORKER_GROUPS = {
    "test_sampler": "tiny_hf_llama", "test_segmented": "tiny_hf_llama",
    "test_refill": "tiny_hf_llama", "test_reward_overlap": "tiny_hf_llama",
}


def worker_scope(nodeid: str) -> str:
  """The unit of work xdist hands a worker for test ``nodeid``."""
  path, _, _ = nodeid.partition("::")
  module = path.rpartition("/")[2].removesuffix(".py")
  if module in SLOW_MODULES or nodeid.rpartition("tests/")[2].partition("@")[0] in SLOW_TESTS:
    return nodeid
  return WORKER_GROUPS.get(module, module)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
  """``-n N`` (xdist's ``load``): whole units of ``worker_scope`` per worker, the units
  with most tests first."""
  if config.getvalue("dist") != "load":
    return None
  from xdist.scheduler import LoadScopeScheduling

  class SharedProgramScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
      return worker_scope(nodeid)

  return SharedProgramScheduling(config, log)


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


# ---------------------------------------------------------------- session fixtures
@pytest.fixture(scope="session")
def commands():
  """``commands.run(module, *argv, cwd=...)``: ``python -m module argv`` as a child of one
  warm process (``cli_runner``), for command lines whose start-up would be most of
  their time."""
  from cli_runner import WarmCommands

  warm = WarmCommands()
  # What the libraries print at import lands in the server, not in each command's
  # output: it must be nothing, so that each command's own output is the whole story.
  assert warm.startup_output == "", warm.startup_output
  yield warm
  warm.close()


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
  """The runs' TFDS data folder (one per worker: TFDS prepares a dataset in place) and
  the session's compilation cache (``test_trainer.small_config``)."""
  return {"data_dir": str(tmp_path_factory.mktemp("tfds")), "cache": str(JAX_CACHE_DIR)}


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
  """A tiny random transformers Llama (untied head), saved and loaded with our loader:
  ``.torch`` is the reference model, ``.model`` ours (test_sampler, test_segmented,
  test_refill, test_reward_overlap: one worker, see ``WORKER_GROUPS``)."""
  return _load_hf_case(tmp_path_factory, "llama_untied")


@pytest.fixture(scope="session")
def qwen2(tmp_path_factory):
  """A tiny random transformers Qwen2 (tied head, q/k/v biases), as ``llama``."""
  return _load_hf_case(tmp_path_factory, "qwen2_tied")


@pytest.fixture(scope="session")
def sharded_llama(llama):
  """(mesh, model): the llama weights on a (2 data, 4 model) mesh of fake devices."""
  import jax

  from sagc_jax.models import from_pretrained

  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices: see tests/conftest.py")
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  return mesh, from_pretrained(llama.folder, mesh=mesh)[0]


def _load_hf_case(tmp_path_factory, name):
  import types

  pytest.importorskip("torch")
  import hf_fixtures as hf
  from sagc_jax.models import from_pretrained

  torch_model = hf.build_hf_model(hf.CASES[name])
  folder = hf.save_hf_model(torch_model, tmp_path_factory.mktemp(name))
  model, cfg = from_pretrained(folder)
  return types.SimpleNamespace(torch=torch_model, folder=folder, model=model, cfg=cfg)
