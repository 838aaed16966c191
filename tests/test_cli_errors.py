"""Every command-line error message, word for word (a snapshot).

A user who gives a bad setting gets one ``error: ...`` line on stderr and exit status
2 (``sagc_jax.cli``; ``sagc_jax.eval`` reports through argparse, whose line is
``python -m sagc_jax.eval: error: ...``). Those lines are the tools' interface: they
name the key, the value and what is allowed. This test pins each one, so that a
change to how settings are checked (a refactor of config validation, say) cannot
change a message, or which check answers first, without this snapshot changing too.

``CASES`` below is the table: one bad setting per case (a few need a second setting
to reach the check, e.g. ``data.name=jsonl`` with ``data.files``), covering every
distinct ``raise ValueError`` of the config checks that a command line can reach:
``config/validate.py``, ``config/checks.py``, ``control/controller.py`` and the
controller classes it builds, ``rewards/specs.py`` (``check_reward_config``),
``rl/config.py`` (``LearnerConfig``, ``check_split``), ``cli.py`` (unknown key, bad
type, repeated override, positional argument, a config file missing or without
``get_config``), ``train.py``, ``eval.py``, ``simulate.py`` with ``replay/worlds.py``,
``replay/entry_points.py`` and (``--trace``) ``replay/trace.py`` / ``replay/costs.py`` /
``experiments/signals.py`` (``--learning``), ``calibrate.py``,
``compare.py`` and ``aot/__main__.py``. ``tests/fixtures/cli_errors.json`` holds, per
case, the command line, its exit status and the last line of its stderr, made by
running the commands at the commit that wrote it:

    PYTHONPATH=. python tests/test_cli_errors.py --regenerate

(run it after adding a case or when a message is changed on purpose; it checks that
every message is an error line and that no two cases answer the same line). The test
runs each command line in the warm command server (``commands``: no interpreter start
or library import per case) and compares. One case pins a status other than 2, as the
tool has it: ``eval`` of a folder without ``config.json`` exits 1 (its ``error: ...``
is raised as ``SystemExit``).

Placeholders in a command line: ``{tmp}`` is the case's own folder, in which
``run/config.json`` is ``{}`` (a training run directory whose config is the schema's
defaults, for ``eval``), ``damaged_run/config.json`` a truncated JSON file,
``not_a_folder`` an empty file, ``syntax_error.py``, ``raises.py`` and ``no_get_config.py``
config files that fail to load (a syntax error; an exception in ``get_config``; no
``get_config``), ``damaged_comparison/per_hour.json`` a truncated JSON file and
``empty_comparison/per_hour.json`` ``{}``. The training cases use ``--workdir
{tmp}/not_a_folder``: a command line that passes validation (a check that went
missing) then fails at once on that file, instead of training for minutes (the
``compare``, ``eval`` and ``aot`` cases have no such guard). In a message, ``{tmp}``
and ``{repo}`` stand for the case's folder and the repository.

Raises that no command line reaches (each with why), so no case:

* ``controller.<key> is not a controller setting``, ``pool.<key> is not a pool
  setting``, ``learner.<key> is not a learner setting``: the config files are
  locked, so an unknown key is refused earlier (``--config.X: no such config key``);
* ``controller.<key>=... must be a sequence``: ml_collections turns a single value
  given for a tuple key into a one-tuple (``candidates=5`` is ``(5,)``);
* ``static_g is required for a 'static' controller``: ``controller.static_g`` is an
  int key (``None`` is refused as an invalid literal);
* ``<key>=... must be True or False`` (``rollout.compaction``, ``segmented_eval``,
  ``overlap_rewards``, ``train.eval_greedy``, ``learner.scan_layers``, ``fsdp``,
  ``packing``, ``recompute_old_logprobs``) and ``SyntheticConfig.allow_mul must be a
  bool``: a bool key accepts only booleans (``1`` is True, ``3`` is refused by absl);
* ``<key>=... must be a string`` (``model.path``, ``train.wandb_project``, the folder
  keys), ``rollout.<buckets>=... must be a tuple of positive ints`` (not iterable),
  ``reward.fns: ... must be a string``, ``compare.time_budget_s=... must be a number``
  (a bool or a string): ml_collections keeps each key's type;
* ``config key ... is missing`` (``checks.lookup``): every key it looks up is in the
  schema, and a config file cannot drop one from the command line; a controller's
  ``<name> must be a number`` (``check_range``): its keys are float keys, which take
  only numbers (NaN reaches ``<name>=nan is outside ...``);
* ``data.format=... is not one of``: ``data.name`` is checked first;
* ``train.wandb_project=... needs the wandb package`` and ``format='parquet' needs
  pyarrow``: depend on what is installed (both are installed where this snapshot was
  made);
* ``reward.fns: importing ... raised``, ``... did not finish within``, ``the process
  importing ... died``, ``... did not start within``: need a user module that fails,
  blocks or kills its interpreter at import; ``GGUF import needs the package(s)`` and
  ``the package ... has no ...``: depend on the install;
* ``aot``: ``--topology=...: cannot build the abstract TPU topology`` (libtpu missing)
  and ``mesh.shape=... does not use the N devices`` (needs libtpu to build the
  topology: minutes of compilation follow when it succeeds); ``only=... is not one
  of``: absl's enum flag ``--only`` refuses it first;
* ``compare``: ``compare.static_sizes`` / ``compare.contextual`` (absent from the
  shipped compare configs, and locked), the merge-only report's errors (need a
  damaged comparison folder).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "fixtures" / "cli_errors.json"

T = ("--config", "configs/tiny_cpu.py", "--workdir", "{tmp}/not_a_folder")   # train
S = ("--config", "configs/simulate.py", "--out", "{tmp}/sim/results.json")   # simulate
P = ("--config", "configs/simulate_prompts.py", "--out", "{tmp}/sim/results.json")
C = ("--config", "configs/compare_tiny_cpu.py", "--workdir", "{tmp}/compare")
A = ("--config", "configs/tiny_cpu.py", "--model_config", "configs/models/qwen2_5_3b.json")
E = ("--workdir", "{tmp}/run")                                               # eval
JSONL = ("--config.data.name=jsonl", "--config.data.files=('train.jsonl',)",
         "--config.data.eval_files=('test.jsonl',)")
TRAIN, SIM, EVAL = "sagc_jax.train", "sagc_jax.simulate", "sagc_jax.eval"
CALIBRATE = "sagc_jax.calibrate"
TRACE = "configs/traces/smollm2_word_problems_before_rl.jsonl"
AOT_REPORT = "configs/aot/llama3_2_3b_16k_v5e_4x4.json"
COMPARE, AOT = "sagc_jax.compare", "sagc_jax.aot"

# (case id, module, argv): one bad setting each (module docstring).
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    # ---- cli.py: the flags themselves
    ("cli.unknown_key_with_suggestion", TRAIN, (*T, "--config.train.stepz=3")),
    ("cli.unknown_key", TRAIN, (*T, "--config.zzz=1")),
    ("cli.bad_int", TRAIN, (*T, "--config.train.steps=abc")),
    ("cli.bad_bool", TRAIN, (*T, "--config.data.synthetic.allow_mul=3")),
    ("cli.repeated_tuple", TRAIN, (*T, "--config.controller.candidates=(4,8)",
                                   "--config.controller.candidates=(16,32)")),
    ("cli.repeated_scalar", TRAIN, (*T, "--config.train.steps=3", "--config.train.steps=4")),
    ("cli.positional", TRAIN, (*T, "extra")),
    ("cli.missing_workdir", TRAIN, ("--config", "configs/tiny_cpu.py")),
    ("cli.unknown_flag", TRAIN, (*T, "--foo=1")),
    ("train.max_steps", TRAIN, (*T, "--max_steps=0")),
    ("cli.config_syntax_error", TRAIN, ("--config", "{tmp}/syntax_error.py",
                                        "--workdir", "{tmp}/not_a_folder")),
    ("cli.config_raises", TRAIN, ("--config={tmp}/raises.py", "--workdir", "{tmp}/not_a_folder")),
    ("cli.config_no_get_config", TRAIN, ("--config", "{tmp}/no_get_config.py",
                                         "--workdir", "{tmp}/not_a_folder")),
    ("cli.config_missing", TRAIN, ("--config={tmp}/missing.py", "--workdir", "{tmp}/not_a_folder",
                                   "--config.train.steps=3")),
    # ---- config/validate.py and config/checks.py: model, mesh
    ("model.dtype", TRAIN, (*T, "--config.model.dtype=float16")),
    ("model.require_path", TRAIN, (*T, "--config.model.require_path=True")),
    ("model.gguf_missing", TRAIN, (*T, "--config.model.path=missing.gguf")),
    ("model.init_std", TRAIN, (*T, "--config.model.init_std=0")),
    ("model.init_std_nan", TRAIN, (*T, "--config.model.init_std=nan")),
    ("mesh.shape", TRAIN, (*T, "--config.mesh.shape=(2,1,1)")),
    ("mesh.axes", TRAIN, (*T, "--config.mesh.axes=('rows','model')")),
    # ---- data
    ("data.manual_dir", TRAIN, (*T, "--config.data.name=gsm8k_local")),
    ("data.files_empty", TRAIN, (*T, "--config.data.name=jsonl")),
    ("data.prompt_field", TRAIN, (*T, *JSONL, "--config.data.prompt_field=")),
    ("data.answer_field", TRAIN, (*T, *JSONL, "--config.data.answer_field=prompt")),
    ("data.prompt_template", TRAIN, (*T, *JSONL, "--config.data.prompt_template=Q:")),
    ("data.eval_split", TRAIN, (*T, *JSONL[:2])),
    ("data.files_ignored", TRAIN, (*T, "--config.data.files=('train.jsonl',)")),
    ("data.synthetic_int", TRAIN, (*T, "--config.data.synthetic.max_operand=0")),
    # ---- reward (validate.py, rewards/specs.py check_reward_config)
    ("reward.fns_errors_name", TRAIN, (*T, "--config.reward.fns=('my_rewards:errors',)")),
    ("reward.fns_duplicate", TRAIN, (*T, "--config.reward.fns=('format','format')")),
    ("reward.timeout_s", TRAIN, (*T, "--config.reward.timeout_s=0")),
    ("reward.fns_malformed", TRAIN, (*T, "--config.reward.fns=('length penalty',)")),
    ("reward.fns_no_module", TRAIN, (*T, "--config.reward.fns=('no_such_module_xyz:f',)")),
    ("reward.fns_no_callable", TRAIN, (*T, "--config.reward.fns=('os:no_such_fn',)")),
    ("reward.weights_count", TRAIN, (*T, "--config.reward.weights=(1.0,)")),
    ("reward.weights_finite", TRAIN, (*T, "--config.reward.fns=('format',)",
                                      "--config.reward.weights=(1e999,)")),
    # ---- controller (control/controller.py and the classes it builds)
    ("controller.kind", TRAIN, (*T, "--config.controller.kind=magic")),
    ("controller.candidates_positive", TRAIN, (*T, "--config.controller.candidates=(0,4)")),
    ("controller.candidates_duplicate", TRAIN, (*T, "--config.controller.candidates=(4,4)")),
    ("controller.candidates_too_few", TRAIN, (*T, "--config.controller.candidates=(4,)")),
    ("controller.event", TRAIN, (*T, "--config.controller.event=sometimes")),
    ("controller.tau", TRAIN, (*T, "--config.controller.tau=1.0")),
    ("controller.seed", TRAIN, (*T, "--config.controller.seed=-1")),
    ("controller.initial_g", TRAIN, (*T, "--config.controller.initial_g=3")),
    ("controller.static_g", TRAIN, (*T, "--config.controller.kind=static",
                                    "--config.controller.static_g=5")),
    ("controller.per_prompt_event", TRAIN, (*T, "--config.controller.kind=per_prompt",
                                            "--config.controller.event=step")),
    ("controller.tail_edges", TRAIN, (*T, "--config.controller.kind=prompt_aware",
                                      "--config.controller.tail_edges=(2.0,1.0)")),
    ("controller.history_size", TRAIN, (*T, "--config.controller.kind=prompt_aware",
                                        "--config.controller.history_size=0")),
    ("controller.history_forgetting", TRAIN, (*T, "--config.controller.kind=prompt_aware",
                                              "--config.controller.history_forgetting=0")),
    # The one message that changed with the typed config: a contextual controller's
    # P(G) of 0 was reported as "controller: prompts_per_g gives P(4)=0: must be a
    # positive int" (an argument name the user never set); the budget rule that
    # names the key now runs first.
    ("controller.contextual_budget", TRAIN, (*T, "--config.controller.kind=prompt_aware",
                                         "--config.rollout.mode=hold_rollouts",
                                         "--config.rollout.rollouts_per_step=2")),
    ("controller.per_prompt_refill", TRAIN, (*T, "--config.controller.kind=per_prompt",
                                             "--config.rollout.refill_slots=2")),
    ("controller.per_prompt_rows", TRAIN, (*T, "--config.controller.kind=per_prompt",
                                           "--config.rollout.max_rows_per_call=64")),
    # ---- rollout
    ("rollout.rollouts_not_divisible", TRAIN, (*T, "--config.rollout.mode=hold_rollouts",
                                               "--config.rollout.rollouts_per_step=20")),
    ("rollout.max_new_tokens", TRAIN, (*T, "--config.rollout.max_new_tokens=0")),
    ("rollout.top_p", TRAIN, (*T, "--config.rollout.top_p=0")),
    ("rollout.prompt_buckets", TRAIN, (*T, "--config.rollout.prompt_buckets=()")),
    ("rollout.response_buckets", TRAIN, (*T, "--config.rollout.response_buckets=(32,)")),
    ("rollout.max_rows_per_call_negative", TRAIN, (*T, "--config.rollout.max_rows_per_call=-1")),
    ("rollout.max_rows_per_call_small", TRAIN, (*T, "--config.rollout.max_rows_per_call=3")),
    ("rollout.decode_segment", TRAIN, (*T, "--config.rollout.decode_segment=-2")),
    ("rollout.kv_pages", TRAIN, (*T, "--config.rollout.kv_pages=-1")),
    ("rollout.paged_kernel", TRAIN, (*T, "--config.rollout.paged_kernel=cuda")),
    ("rollout.refill_slots_data_axis", TRAIN, (*T, "--config.mesh.shape=(2,1)",
                                               "--config.rollout.refill_slots=3")),
    # ---- train
    ("train.steps", TRAIN, (*T, "--config.train.steps=0")),
    ("train.metrics_sync_secs", TRAIN, (*T, "--config.train.metrics_sync_secs=-1")),
    ("train.eval_k_one", TRAIN, (*T, "--config.train.eval_k=1")),
    ("train.eval_k_batch", TRAIN, (*T, "--config.train.eval_k=200")),
    ("train.eval_k_rows", TRAIN, (*T, "--config.train.eval_k=32",
                                  "--config.rollout.max_rows_per_call=16")),
    ("train.max_consecutive_skipped", TRAIN, (*T, "--config.train.max_consecutive_skipped=-1")),
    ("train.time_budget_s", TRAIN, (*T, "--config.train.time_budget_s=-1")),
    ("train.time_budget_s_inf", TRAIN, (*T, "--config.train.time_budget_s=inf")),
    ("train.eval_points", TRAIN, (*T, "--config.train.eval_points=4")),
    ("train.remote_data_dir", TRAIN, (*T, "--config.data.data_dir=gs://bucket/tfds")),
    # ---- learner (rl/config.py)
    ("learner.algorithm", TRAIN, (*T, "--config.learner.algorithm=ppo")),
    ("learner.lr", TRAIN, (*T, "--config.learner.lr=0")),
    ("learner.b1", TRAIN, (*T, "--config.learner.b1=1.0")),
    ("learner.weight_decay", TRAIN, (*T, "--config.learner.weight_decay=-1")),
    ("learner.clip_low", TRAIN, (*T, "--config.learner.clip_low=1.5")),
    ("learner.clip_c", TRAIN, (*T, "--config.learner.clip_c=0.5")),
    ("learner.mini_batches", TRAIN, (*T, "--config.learner.mini_batches=0")),
    ("learner.warmup_steps", TRAIN, (*T, "--config.learner.warmup_steps=-1")),
    ("learner.schedule", TRAIN, (*T, "--config.learner.schedule=linear")),
    ("learner.min_lr_ratio", TRAIN, (*T, "--config.learner.min_lr_ratio=2.0")),
    ("learner.agg", TRAIN, (*T, "--config.learner.agg=sum")),
    ("learner.agg_scale", TRAIN, (*T, "--config.learner.agg_scale=2.0")),
    ("learner.kl_kind", TRAIN, (*T, "--config.learner.kl_kind=k4")),
    ("learner.logits_chunk", TRAIN, (*T, "--config.learner.logits_chunk=0")),
    ("learner.attention", TRAIN, (*T, "--config.learner.attention=flash")),
    ("learner.overlong_buffer", TRAIN, (*T, "--config.learner.overlong_buffer=100")),
    ("learner.split", TRAIN, (*T, "--config.learner.mini_batches=3")),
    # ---- sft
    ("sft.warmup_steps", TRAIN, (*T, "--config.sft.warmup_steps=800")),
    # ---- simulate (replay/worlds.py, replay/entry_points.py)
    ("simulate.steps", SIM, (*S, "--config.sim.steps=0")),
    ("simulate.tail_factor", SIM, (*S, "--config.sim.tail_factor_max=1.5")),
    ("simulate.static_arm_delta", SIM, (*S, "--config.controller.delta=0")),
    ("simulate.claims_seeds", SIM, (*S, "--config.sim.steps=2", "--claims_seeds=-1")),
    ("simulate_prompts.pool_size", SIM, (*P, "--config.pool.size=0")),
    ("simulate_prompts.tail_prob_open", SIM, (*P, "--config.sim.tail_prob_start=0.0")),
    # ---- simulate --trace (replay/trace.py, replay/costs.py)
    ("simulate.trace_missing", SIM, ("--trace", "{tmp}/missing.jsonl", "--out", "{tmp}/r.json")),
    ("simulate.trace_empty", SIM, ("--trace", "{tmp}/not_a_folder", "--out", "{tmp}/r.json")),
    ("simulate.trace_three", SIM, ("--trace", f"{TRACE},{TRACE},{TRACE}", "--out", "{tmp}/r")),
    ("simulate.trace_algorithms", SIM, ("--trace", TRACE, "--algorithms=ppo",
                                        "--out", "{tmp}/r.json")),
    ("simulate.trace_replicates", SIM, ("--trace", TRACE, "--replicates=2",
                                        "--out", "{tmp}/r.json")),
    ("simulate.trace_taus", SIM, ("--trace", TRACE, "--taus=wide", "--out", "{tmp}/r.json")),
    ("simulate.trace_delta", SIM, ("--trace", TRACE, "--cost=aot:" + AOT_REPORT, "--delta=1.5",
                                   "--out", "{tmp}/r.json")),
    ("simulate.trace_cost", SIM, ("--trace", TRACE, "--cost=gpu", "--out", "{tmp}/r.json")),
    ("simulate.trace_aot_missing", SIM, ("--trace", TRACE, "--cost=aot:{tmp}/missing.json",
                                         "--out", "{tmp}/r.json")),
    ("simulate.learning_damaged", SIM, ("--trace", TRACE, "--cost=aot:" + AOT_REPORT,
                                        "--horizon_s=60", "--learning",
                                        "{tmp}/damaged_comparison", "--out", "{tmp}/r.json")),
    ("simulate.learning_no_pairs", SIM, ("--trace", TRACE, "--cost=aot:" + AOT_REPORT,
                                         "--horizon_s=60", "--learning",
                                         "{tmp}/empty_comparison", "--out", "{tmp}/r.json")),
    # ---- calibrate (calibrate.py, training/trace_sampling.py)
    ("calibrate.no_out", CALIBRATE, ("--config", "configs/tiny_cpu.py")),
    ("calibrate.no_config", CALIBRATE, ("--out", "{tmp}/cal")),
    ("calibrate.prompts", CALIBRATE, ("--config", "configs/tiny_cpu.py", "--out", "{tmp}/cal",
                                      "--prompts=0")),
    ("calibrate.workdir", CALIBRATE, ("--config", "configs/tiny_cpu.py", "--out", "{tmp}/cal",
                                      "--workdir", "{tmp}/no_run")),
    ("calibrate.validate", CALIBRATE, ("--config", "configs/tiny_cpu.py", "--out", "{tmp}/cal",
                                       "--config.rollout.top_p=1.5")),
    ("calibrate.trace_missing", CALIBRATE, ("--out", "{tmp}/cal", "--trace", "{tmp}/no.jsonl")),
    ("calibrate.signal_checks_damaged", CALIBRATE, ("--out", "{tmp}/cal", "--trace", TRACE,
                                                    "--signal_checks",
                                                    "{tmp}/damaged_run/config.json")),
    # ---- eval
    ("eval.no_run", EVAL, ("--workdir", "{tmp}/no_run")),
    ("eval.damaged_config", EVAL, ("--workdir", "{tmp}/damaged_run")),
    ("eval.examples", EVAL, (*E, "--examples=0")),
    ("eval.hf_path", EVAL, (*E, "--hf_path", "{tmp}/no_model")),
    ("eval.unexpected_argument", EVAL, (*E, "--bogus")),
    ("eval.unknown_key", EVAL, (*E, "--config.train.stepz=3")),
    ("eval.validate", EVAL, (*E, "--config.rollout.temperature=-1")),
    # ---- compare
    ("compare.remote_workdir", COMPARE, ("--workdir", "gs://bucket/compare")),
    ("compare.no_config", COMPARE, ("--workdir", "{tmp}/compare")),
    ("compare.seeds", COMPARE, (*C, "--config.compare.seeds=0")),
    ("compare.arms", COMPARE, (*C, "--arms=grpo_magic")),
    ("compare.arm_invalid", COMPARE, (*C, "--config.train.steps=0")),
    ("compare.time_budget_s", COMPARE, (*C, "--config.compare.time_budget_s=-1")),
    ("compare.eval_points", COMPARE, (*C, "--config.compare.eval_points=0")),
    ("compare.targets", COMPARE, (*C, "--config.compare.targets=(0.5,1.5)")),
    # ---- aot
    ("aot.refill_slots_search", AOT, (*A, "--refill_slots_search=64,many")),
    ("aot.search_learner_only", AOT, (*A, "--only=learner", "--refill_slots_search=64")),
    ("aot.search_without_refill", AOT, (*A, "--refill_slots_search=64")),
    ("aot.search_with_kv_pages", AOT, (*A, "--refill_slots_search=64",
                                       "--config.rollout.refill_slots=8",
                                       "--config.rollout.kv_pages=4")),
    ("aot.search_not_positive", AOT, (*A, "--refill_slots_search=0",
                                      "--config.rollout.refill_slots=8")),
    ("aot.validate", AOT, (*A, "--config.rollout.top_k=-1")),
    ("aot.no_model_config", AOT, ("--config", "configs/tiny_cpu.py")),
    ("aot.model_config_missing", AOT, ("--config", "configs/tiny_cpu.py",
                                       "--model_config", "configs/models/missing.json")),
    ("aot.topology_format", AOT, (*A, "--topology=v5e")),
    ("aot.topology_generation", AOT, (*A, "--topology=v9:2x2")),
]

# Cases whose lines are the same on purpose: none (each case reaches its own check).
SAME_LINE: frozenset[str] = frozenset()


def prepare(tmp: Path) -> None:
  """The files the placeholders name (module docstring)."""
  (tmp / "run").mkdir()
  (tmp / "run" / "config.json").write_text("{}\n")
  (tmp / "damaged_run").mkdir()
  (tmp / "damaged_run" / "config.json").write_text('{"model": ')
  (tmp / "not_a_folder").write_text("")
  (tmp / "syntax_error.py").write_text("def get_config(:\n  return None\n")
  (tmp / "raises.py").write_text("import ml_collections\n\n\ndef get_config():\n"
                                 "  raise ValueError('no such model: big')\n")
  (tmp / "no_get_config.py").write_text("import ml_collections\n")
  for name, text in (("damaged_comparison", '{"pairs": '), ("empty_comparison", "{}")):
    (tmp / name).mkdir()
    (tmp / name / "per_hour.json").write_text(text)


def fill(argv, tmp: Path) -> list[str]:
  return [a.replace("{tmp}", str(tmp)) for a in argv]


def last_line(stderr: str, tmp: Path) -> str:
  """The last line of stderr, with the machine's folders as placeholders."""
  lines = stderr.strip().splitlines()
  line = lines[-1] if lines else ""
  for path, name in ((tmp.resolve(), "{tmp}"), (tmp, "{tmp}"), (REPO, "{repo}")):
    line = line.replace(str(path), name)
  return line


def _snapshot() -> dict:
  """The snapshot; empty when it is missing (``test_the_snapshot_has_every_case`` then
  says how to make it)."""
  return json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}


def test_the_snapshot_has_every_case():
  """The snapshot was made from ``CASES`` as they stand (same ids, command lines)."""
  made = [(case_id, case["module"], case["argv"]) for case_id, case in _snapshot().items()]
  assert made == [(case_id, module, list(argv)) for case_id, module, argv in CASES], (
      "CASES changed: PYTHONPATH=. python tests/test_cli_errors.py --regenerate")


@pytest.mark.parametrize("case_id", list(_snapshot()))
def test_the_error_message_is_unchanged(commands, tmp_path, case_id):
  case = _snapshot()[case_id]
  prepare(tmp_path)
  proc = commands.run(case["module"], *fill(case["argv"], tmp_path), cwd=REPO)
  assert (proc.returncode, last_line(proc.stderr, tmp_path)) == (
      case["returncode"], case["stderr_last_line"]), proc.stderr


def regenerate() -> None:
  """Runs every case and writes the snapshot (module docstring)."""
  import tempfile

  sys.path.insert(0, str(REPO / "tests"))
  from cli_runner import WarmCommands

  warm = WarmCommands()
  assert warm.startup_output == "", warm.startup_output
  snapshot, problems = {}, []
  try:
    for case_id, module, argv in CASES:
      with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        prepare(tmp)
        proc = warm.run(module, *fill(argv, tmp), cwd=REPO)
        line = last_line(proc.stderr, tmp)
      snapshot[case_id] = {"module": module, "argv": list(argv),
                           "returncode": proc.returncode, "stderr_last_line": line}
      print(f"{case_id}: {proc.returncode} {line}")
      if proc.returncode == 0 or "error: " not in line or "Traceback" in proc.stderr:
        problems.append(f"{case_id}: not a one-line error (status {proc.returncode}):\n"
                        f"{proc.stderr}")
  finally:
    warm.close()
  seen: dict[str, str] = {}
  for case_id, case in snapshot.items():
    line = case["stderr_last_line"]
    if line in seen and not {case_id, seen[line]} <= SAME_LINE:
      problems.append(f"{seen[line]} and {case_id} answer the same line: {line}")
    seen.setdefault(line, case_id)
  if len(snapshot) != len(CASES):
    problems.append("two cases share an id")
  if problems:
    raise SystemExit("\n".join(problems))
  SNAPSHOT.parent.mkdir(exist_ok=True)
  SNAPSHOT.write_text(json.dumps(snapshot, indent=1) + "\n")
  print(f"wrote {SNAPSHOT} ({len(snapshot)} cases)")


if __name__ == "__main__":
  if sys.argv[1:] != ["--regenerate"]:
    raise SystemExit(f"usage: PYTHONPATH=. python {sys.argv[0]} --regenerate")
  regenerate()
