"""Every command line the documentation shows gets past its tool's start-up checks.

README.md, docs/*.md and the module docstrings of configs/*.py show ``python -m
sagc_jax.<tool>`` command lines, and readers copy them. A stale flag, a renamed key, a
value a config refuses, or a variant that needs one more setting would stop such a
line at start-up, in one ``error:`` line, before any work. So each line is run here as
``python -m`` runs it (``runpy``: the tool's own flag parsing, config file and
``--config.*`` overrides, and checks), in a scratch folder that holds ``configs/`` and
``docs/``, up to the tool's first real work, which ``FIRST_WORK`` replaces by a stop:
no data, model, compilation or training. Shell variables are expanded from their
definition in the same document (``$PAPER_40``).

A line is one of:

* a command: it must reach its first real work. Placeholder paths (``--workdir D``,
  ``--out F``) are fine; what a command reads from an earlier step (a run's
  checkpoints, a comparison, a venv) is made here as bare as the checks accept
  (``EARLIER_STEP``), and so is a file a document defines (``# my_rewards.py``);
* a usage line (``[--out F]``, ``{a,b}``, ``<...>``, or a placeholder where the tool
  parses the value: ``--config F``, ``--config.seed=S``): its tool and its flags must
  exist;
* in prose, a tool's name (``python -m sagc_jax.train``): refused only for a missing
  required flag.

In a config's docstring, flags alone in a code span (``--config.x=v``) vary its first
command, and are checked with it.

A command whose data is a user's folder (a placeholder) cannot have its prompts
tokenized here; ``LONGEST_PROMPT`` holds their measured longest prompt instead, which
the run's start-up would check against the prompt buckets.
"""

from __future__ import annotations

import ast
import collections
import functools
import importlib.util
import itertools
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from absl import app as absl_app
from absl import flags as absl_flags
from ml_collections import config_flags

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "configs").glob("*.py"))]

# Commands that cannot reach their start-up checks here, and why (a substring of the
# command line -> the reason).
NOT_CHECKED = {
    "--config runs/compare_paper/arms/grpo_sagc_seed0/arm_config.py":
        "its config file is one a finished comparison wrote",
}

# Commands that are refused as written, for a reason their document states (a
# substring of the command line -> a substring of its one-line refusal). None now.
REFUSED: dict[str, str] = {}

# The longest prompt, in tokens, of a dataset read from a user's folder, by model
# (``data.name``, ``model.path``): measured once over every split with the model's
# tokenizer and chat template, as start-up tokenizes them. GSM8K: the
# openai/grade-school-math files, train.jsonl line 3332 (test: 237 tokens).
LONGEST_PROMPT = {("gsm8k_local", "smollm2-135m-instruct"): 272}

# What a command reads from an earlier step, made here as bare as its checks accept:
# (tool, flag) -> what is made at each (relative) path the flag names: a folder
# ('' itself, 'name/' inside it) or a file ('.' itself, 'name' inside it; JSON: {}).
EARLIER_STEP = {
    ("calibrate", "--workdir"): "checkpoints/",      # a training run
    ("compare", "--workdir"): "",                    # --merge_only: a comparison
    ("eval", "--workdir"): "config.json",            # a training run
    ("eval", "--hf_path"): "",                       # an imported or exported model
    ("claims", "--adaptation"): "results.csv",       # two comparisons
    ("bench", "--peer_python"): ".",                 # a venv with google-tunix
}

# Flags whose value is a path: a placeholder there (``--workdir D``) is a command's,
# anywhere else (``--config F``, ``--topology T``) a usage line's.
PATH_FLAGS = {"--workdir", "--out", "--trace", "--check", "--learning", "--hf_path",
              "--peer_python", "--source", "--base", "--adaptation", "--plot", "--reuse",
              "--config.model.path", "--config.data.manual_dir",
              "--config.train.local_cache_dir"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
MISSING_REQUIRED = re.compile(r"must have a value other than None|arguments are required")


class Started(BaseException):
  """A tool reached its first real work: every start-up check passed. (Not an
  ``Exception``: no tool's error handling may take it for a failure.)"""


def _stop(*args, **kwargs):
  raise Started


# --------------------------------------------------------------------------- collection

def _blank(text: str, spans) -> str:
  """``text`` with ``spans`` turned into spaces (line numbers kept)."""
  for start, end in spans:
    text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
  return text


def _collect(path: Path) -> list[tuple[int, str, bool]]:
  """``(line, command, in prose)`` of every command line of ``path``: inline code spans
  (across line breaks too) anywhere, and lines of code blocks (a config's docstring:
  its text) that start one, continued by a trailing backslash."""
  text = path.read_text()
  if path.suffix == ".py":
    node = ast.parse(text).body[0]
    lines = text.splitlines(True)
    text = _blank(text, [(0, len("".join(lines[:node.lineno - 1]))),
                         (len("".join(lines[:node.end_lineno])), len(text))])
    prose = text
  else:
    fences = [m.span() for m in re.finditer(r"^```.*?^```", text, re.M | re.S)]
    prose = _blank(text, fences)
    between = zip([(0, 0), *fences], [*fences, (len(text), len(text))])
    code = _blank(text, [(a, b) for (_, a), (b, _) in between])     # the fences alone
  found, spans, variants = [], [], []
  for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", prose, re.S):  # `a`, ``a``
    spans.append(m.span())
    hit = re.search(r"python\s+-m\s+sagc_jax\.", m.group(2))
    if hit:
      found.append((m.start(2) + hit.start(), m.group(2)[hit.start():], True))
    elif path.suffix == ".py" and m.group(2).startswith("--"):
      variants.append((m.start(2), m.group(2)))
  if path.suffix == ".py":
    code = _blank(prose, spans)
  for m in re.finditer(r"(?:^[ \t]*|&& |-- |Run: )(python -m sagc_jax\.(?:.*\\\n)*.*)",
                       code, re.M):
    found.append((m.start(1), re.sub(r"\\\\?\n", " ", m.group(1)), False))
  # A config's docstring: flags alone (``--config.data.name=...``) vary its first command.
  found += [(start, f"{min(found)[1]} {flags}", False) for start, flags in variants]
  variables = dict(re.findall(r"`(\w+)` stands for\s+`([^`]+)`", text))
  variables.update(re.findall(r'^(\w+)="([^"]*)"$', text, re.M))
  expand = functools.partial(re.sub, r"\$\{?(\w+)\}?",
                             lambda v: variables.get(v.group(1), v.group(0)))
  return sorted((text.count("\n", 0, start) + 1, " ".join(expand(command).split()), prose)
                for start, command, prose in found)


def _commands():
  """Every document's commands and their ids, ``doc:line`` (``#2``: a second one)."""
  commands, ids, seen = [], [], collections.Counter()
  for path in DOCS:
    for line, command, prose in _collect(path):
      name = f"{path.relative_to(REPO)}:{line}"
      seen[name] += 1
      ids.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
      commands.append((command, prose))
  return commands, ids


COMMANDS, IDS = _commands()

# Files the documents define for their commands (a code block opening ``# NAME.py``).
DEFINED_FILES = {m.group(1): m.group(2) for path in DOCS if path.suffix == ".md" for m in
                 re.finditer(r"^```python\n# (\w+\.py)[^\n]*\n(.*?)^```", path.read_text(),
                             re.M | re.S)}


# ------------------------------------------------------------------------------ checks

def _placeholder_value(argv: list[str]) -> bool:
  """Whether a placeholder stands where the tool parses the value (``--config F``,
  ``--config.seed=S``): a usage line's."""
  flag = None
  for arg in argv:
    name, _, value = arg.partition("=") if arg.startswith("--") else (None, "", arg)
    flag = name or flag
    parts = re.split(r"[/:,.]", value)
    if value and flag not in PATH_FLAGS and any(PLACEHOLDER.match(p) for p in parts):
      return True
  return False


def _flag_names(module: str) -> set[str]:
  """The flags ``module`` defines (absl or argparse), read from its source."""
  spec = importlib.util.find_spec(module)
  path = Path(spec.origin)
  if spec.submodule_search_locations:
    path = path.with_name("__main__.py")
  source = path.read_text()
  return set(re.findall(r'DEFINE_\w+\(\s*"(\w+)"', source) +
             re.findall(r'add_argument\(\s*"--(\w+)"', source))


def _check_prompts(config) -> None:
  """What start-up's prompt-length check would say of data in a user's folder."""
  longest = LONGEST_PROMPT.get((config.data.name, config.model.path))
  buckets = tuple(config.rollout.prompt_buckets)
  if longest and max(buckets) < longest:
    raise ValueError(f"rollout.prompt_buckets={buckets}: {config.data.name} has a "
                     f"{longest}-token prompt; the largest bucket must hold every prompt "
                     f"(add a bucket >= {longest})")


def _train_start(config, *args, **kwargs):
  _check_prompts(config)
  raise Started


def _compare_start(config, workdir, arms, **kwargs):
  from sagc_jax.config import validate
  for arm in arms.values():
    _check_prompts(validate(arm))
  raise Started


def _topology_start(topology, *args):
  from sagc_jax.aot.chips import generation_of
  generation_of(topology)               # the name is checked; building it needs minutes
  raise Started


# Each tool's first real work (or a read of a run that may be on gs://).
FIRST_WORK = {
    "sagc_jax.runtime.metrics.finished_summary": lambda *args: None,
    "sagc_jax.training.loop.Trainer": _train_start,
    "sagc_jax.experiments.arms.run_arms": _compare_start,
    "sagc_jax.experiments.compare.report": _stop,
    "sagc_jax.training.trace_sampling.open_policy": _stop,
    "sagc_jax.experiments.calibration.calibration_report": _stop,
    "sagc_jax.aot.compile_report.topology_mesh": _topology_start,
    "sagc_jax.replay.entry_points.simulate": _stop,
    "sagc_jax.experiments.replay_tables.trace_tables": _stop,
    "sagc_jax.experiments.figures.regenerate": _stop,
    "sagc_jax.training.export.export": _stop,
    "sagc_jax.models.gguf_import.import_gguf": _stop,
    "sagc_jax.training.evaluation.evaluate_run": _stop,
    "sagc_jax.experiments.claims.adaptation_table": _stop,
    "sagc_jax.experiments.goal.load_per_hour": _stop,
    "sagc_jax.bench.real_model.resolve_model": _stop,
    **{f"sagc_jax.bench.{name}.run": _stop
       for name in ("controller", "heavy_tail", "learner", "overlap", "sampler")},
}


def _private_flags(monkeypatch) -> None:
  """absl flags into a fresh ``FlagValues`` per command (a process defines a tool's
  flags once; this one runs many tools), parsed as ``absl.app.run`` parses them."""
  values = absl_flags.FlagValues()
  for name in ("DEFINE_string", "DEFINE_integer", "DEFINE_float", "DEFINE_bool",
               "DEFINE_enum", "DEFINE_list", "mark_flags_as_required"):
    monkeypatch.setattr(absl_flags, name,
                        functools.partial(getattr(absl_flags, name), flag_values=values))
  monkeypatch.setattr(config_flags, "DEFINE_config_file",
                      functools.partial(config_flags.DEFINE_config_file, flag_values=values))
  monkeypatch.setattr(absl_flags, "FLAGS", values)
  monkeypatch.setattr(absl_app, "define_help_flags", lambda: None)
  monkeypatch.setattr(absl_app, "run", lambda main, argv, flags_parser: main(flags_parser(argv)))


def _prepare(folder: Path, tool: str, argv: list[str]) -> None:
  """The scratch folder a command runs in: ``configs/`` and ``docs/`` (the files the
  commands read), the documents' files and the inputs of earlier steps it names."""
  for name in ("configs", "docs"):
    (folder / name).symlink_to(REPO / name)
  for name, body in DEFINED_FILES.items():
    (folder / name).write_text(body)
  for i, arg in enumerate(argv):
    made = EARLIER_STEP.get((tool, arg))
    if made is None:
      continue
    for value in itertools.takewhile(lambda v: not v.startswith("-"), argv[i + 1:]):
      path = folder / value / made
      if Path(value).is_absolute():        # another machine's path: left as it is
        continue
      if not made or made.endswith("/"):
        path.mkdir(parents=True, exist_ok=True)
      else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}" if path.suffix == ".json" else "")


def _run(module: str, argv: list[str], folder: Path, monkeypatch, capsys):
  """``(exit status, stderr)`` of ``python -m module argv`` run in ``folder``; status
  None: it reached its first real work."""
  _private_flags(monkeypatch)
  for target, stand_in in FIRST_WORK.items():
    monkeypatch.setattr(target, stand_in)
  # Work too: reading a trace an earlier command writes (configs/ holds the others) and
  # fetching a built-in model on first use.
  from sagc_jax.models import gguf_import
  from sagc_jax.replay import trace
  read, resolve = trace.read_trace, gguf_import.resolve_source
  monkeypatch.setattr(trace, "read_trace", lambda path: read(path) if Path(path).exists()
                      or str(path).startswith("configs/") else _stop())
  monkeypatch.setattr(gguf_import, "resolve_source", lambda source, *args, **kwargs: (
      Path(source) if source in gguf_import.BUILTIN_SOURCES else resolve(source, *args,
                                                                          **kwargs)))
  monkeypatch.chdir(folder)
  monkeypatch.syspath_prepend(str(folder))          # python -m puts the folder first
  monkeypatch.setattr(sys, "argv", [module, *argv])
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    status, message = 0, ""
  except Started:
    status, message = None, ""
  except SystemExit as stop:
    status, message = ((stop.code or 0, "") if not isinstance(stop.code, str) else
                       (1, stop.code))
  return status, (capsys.readouterr().err + message).strip()


@pytest.mark.parametrize("command,prose", COMMANDS, ids=IDS)
def test_documented_command_passes_its_start_up_checks(command, prose, tmp_path,
                                                       monkeypatch, capsys):
  assert "$" not in command, f"a shell variable the document does not define: {command}"
  usage = re.search(r"[][{}<>]|\.\.\.", command)   # optional parts, choices, <...>
  python, dash_m, module, *argv = (command.split() if usage else
                                   shlex.split(command, comments=True))
  assert (python, dash_m) == ("python", "-m")
  tool = module.removeprefix("sagc_jax.")
  assert importlib.util.find_spec(module), f"no tool {module}"
  if usage or _placeholder_value(argv):
    unknown = {a.split("=")[0] for a in argv if a.startswith("--") and
               not a.startswith("--config.")} - {f"--{n}" for n in _flag_names(module)}
    assert not unknown, f"{module} has no flag {sorted(unknown)}"
    return
  if any(part in command for part in NOT_CHECKED):
    pytest.skip(next(why for part, why in NOT_CHECKED.items() if part in command))
  _prepare(tmp_path, tool, argv)
  status, stderr = _run(module, argv, tmp_path, monkeypatch, capsys)
  if status in (None, 0):
    return
  refusal = stderr.splitlines()[-1] if stderr else ""
  if prose and MISSING_REQUIRED.search(refusal):
    return                             # names the tool, e.g. `python -m sagc_jax.train`
  documented = [reason for part, reason in REFUSED.items() if part in command]
  assert documented and documented[0] in refusal, f"refused (exit {status}):\n{stderr}"
  lines = [line for line in stderr.splitlines() if not line.startswith(("usage:", " "))]
  assert status == 2 and len(lines) == 1, f"not a one-line refusal:\n{stderr}"


def test_the_console_scripts_the_documents_name_exist():
  scripts = set(re.findall(r'"(sagc-[\w-]+)=', (REPO / "setup.py").read_text()))
  named = {name for path in DOCS for name in re.findall(r"`(sagc-[\w-]+)`", path.read_text())}
  assert named and named <= scripts, sorted(named - scripts)
