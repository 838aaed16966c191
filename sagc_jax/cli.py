"""Shared plumbing of the absl/ml_collections command-line tools.

Flags are defined only when a tool actually runs (never at import, so tests
and other tools can import the modules freely). Every user mistake ends the
same way: a one-line ``error: ...`` on stderr and exit status 2. That covers a
``ValueError`` from config validation, a bad ``--config.*`` override (an unknown
key, named with the closest existing one; a value of the wrong type) and a config
file that fails to load (its line and the Python error), which absl /
ml_collections would otherwise report as a traceback.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, Sequence


def run_absl_tool(main: Callable[[Sequence[str], object], None],
                  define_flags: Callable[[], object]) -> None:
  """Defines the flags, parses ``sys.argv`` (config-file flags define their override
  flags from it), runs ``main(argv, FLAGS)`` under ``absl.app`` once ``argv`` holds no
  positional argument."""
  from sagc_jax.runtime.platform import prepare_process

  prepare_process()             # before JAX starts: no TPU probe on hosts without one
  from absl import app
  from absl import flags as absl_flags

  flags = define_flags()
  app.define_help_flags()       # --help / --helpfull, which app.run would define
  argv = list(sys.argv)
  try:
    reject_repeated_overrides(argv[1:])
  except ValueError as err:
    _fail(str(err))
  try:
    try:
      remaining = flags(argv)   # config files load and overrides apply here
    except SystemExit as done:
      # absl's help flags print the usage and exit with status 1; asking for help
      # is not an error.
      if done.code == 1 and _asks_for_help(argv):
        raise SystemExit(0) from None
      raise
  except Exception as err:        # pylint: disable=broad-except
    broken = _config_file_error(err, argv) or _config_load_error(err, argv)
    if broken:
      _fail(broken)
    # ml_collections raises AttributeError / KeyError / TypeError for an unknown key or
    # a type it cannot override.
    if isinstance(err, (absl_flags.Error, AttributeError, KeyError, TypeError)):
      _fail(_override_message(str(err), argv))
    raise

  def checked_main(args: Sequence[str]) -> None:
    reject_positional(args)
    main(args, flags)

  try:
    app.run(checked_main, argv=argv, flags_parser=lambda _: remaining)
  except (ValueError, OSError) as err:     # bad settings, unreadable or missing files
    _fail(_config_load_error(err, argv) or str(err))


_HELP_FLAGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def _config_file_error(err: BaseException, argv: Sequence[str]) -> str | None:
  """One line for an error raised while a config file given on the command line was
  loaded (a syntax error, or an exception in its ``get_config``): the file, the line
  and the Python error. None when no such file is in the error's traceback."""
  import traceback

  files = {os.path.realpath(value): value for _, value in _flag_values(argv)
           if value.endswith(".py") and os.path.isfile(value)}
  while err is not None:          # absl wraps the loader's error: follow the chain
    path = line = None
    if isinstance(err, SyntaxError) and err.filename:
      path, line = os.path.realpath(err.filename), err.lineno
    for frame in traceback.extract_tb(err.__traceback__):
      if os.path.realpath(frame.filename) in files:
        path, line = os.path.realpath(frame.filename), frame.lineno
    if path in files:
      what = (f"{type(err).__name__}: {err.msg}" if isinstance(err, SyntaxError)
              else f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)
      return f"config file {files[path]}, line {line}: {' '.join(what.split())}"
    err = err.__cause__ or err.__context__
  return None


_LOAD_ERROR = re.compile(r"module '(\w+)_config' has no attribute 'get_config'"
                         r"|Failed loading config file (\w+)_config")


def _config_load_error(err: BaseException, argv: Sequence[str]) -> str | None:
  """One line naming the file for a config file ml_collections could not load (missing,
  or without ``get_config``): its own message names the module it made of the file
  ('config_config'), and a missing file surfaces only at the first use of the config,
  as a multi-line error. None for any other error."""
  found = _LOAD_ERROR.search(str(err))
  given = [value for name, value in _flag_values(argv)
           if found and name == (found.group(1) or found.group(2))]
  if not given:
    return None
  path = given[-1].split(":", 1)[0]       # 'file.py:arg' passes arg to get_config
  if found.group(1):
    return f"config file {path} defines no get_config() (which returns the config)"
  return f"config file {path} does not exist"     # the one error the loader collects


def _flag_values(argv: Sequence[str]) -> list[tuple[str, str]]:
  """``(name, value)`` of every ``--name=value`` or ``--name value`` in ``argv[1:]``."""
  pairs = []
  for i, arg in enumerate(argv[1:], 1):
    if arg.startswith("--"):
      name, eq, value = arg[2:].partition("=")
      pairs.append((name, value if eq else argv[i + 1] if i + 1 < len(argv) else ""))
  return pairs


def _asks_for_help(argv: Sequence[str]) -> bool:
  return any(arg.split("=")[0].replace("--", "-", 1) in
             {h.replace("--", "-", 1) for h in _HELP_FLAGS} for arg in argv[1:])


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  raise SystemExit(2)


def _override_message(raw: str, argv: Sequence[str]) -> str:
  """One line naming the bad ``--config.*`` flag and, for an unknown key, the closest
  existing one (ml_collections' own suggestion)."""
  raw = raw.strip()
  if len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\"":   # a KeyError's repr
    raw = raw[1:-1].replace("\\n", "\n").replace("\\'", "'")
  first = raw.splitlines()[0].strip().strip("'\"") if raw else ""
  suggestion = re.search(r'Did you mean "([^"]+)"', raw)
  for key, _ in _config_flags(argv[1:]):
    parts = key.split(".")
    if first in parts[1:]:
      if suggestion:
        fixed = ".".join(suggestion.group(1) if p == first else p for p in parts)
        return f"--{key}: no such config key (did you mean --{fixed}?)"
      return f"--{key}: no such config key"
  return " ".join(raw.split())


def apply_config_overrides(config: Any, overrides: Sequence[str]) -> Any:
  """``config`` with ``--config.KEY=VALUE`` arguments applied, parsed exactly as the
  config-file tools parse them (for tools whose config is not a file, e.g. a run's
  ``config.json``). A bad key or value raises ValueError with the one-line message."""
  from absl import flags as absl_flags
  from ml_collections import config_flags

  argv = ["tool", *overrides]
  for arg in overrides:
    if not re.match(r"--config\.\w", arg):
      raise ValueError(f"unexpected argument {arg!r} (settings are --config.KEY=VALUE)")
  reject_repeated_overrides(overrides)
  values = absl_flags.FlagValues()
  saved = sys.argv
  sys.argv = argv        # config_flags defines one flag per override it finds in sys.argv
  try:
    config_flags.DEFINE_config_dict("config", config, flag_values=values)
    values(argv)
  except (absl_flags.Error, AttributeError, KeyError, TypeError) as err:
    raise ValueError(_override_message(str(err), argv)) from None
  finally:
    sys.argv = saved
  return values.config


def reject_repeated_overrides(args: Sequence[str]) -> None:
  """Refuses a ``--config.KEY`` given more than once. ml_collections would join the
  values of a tuple key (``candidates=(4,8)`` then ``=(16,32)`` gives (4, 8, 16, 32))
  and keep the last of any other: neither is what a user who repeated a flag by
  mistake, or to change it, means. ``--config.KEY=()`` clears a tuple."""
  seen: dict[str, str] = {}
  for key, value in _config_flags(args):
    if key in seen:
      tuple_like = any(v.strip().startswith(("(", "[")) for v in (seen[key], value))
      hint = f" (a tuple whole, e.g. --{key}='(4, 8)'; '()' clears it)" if tuple_like else ""
      raise ValueError(f"--{key} is given twice ({seen[key]!r} and {value!r}): "
                       f"give it once{hint}")
    seen[key] = value


_CONFIG_FLAG = re.compile(r"--(config(?:\.\w+)+)(?:=(.*))?$")


def _config_flags(args: Sequence[str]) -> list[tuple[str, str]]:
  """``(key, value)`` of every ``--config.KEY=VALUE`` or ``--config.KEY VALUE`` in
  ``args`` (the value of a last flag without one: '')."""
  return [(m.group(1), m.group(2) if m.group(2) is not None
           else args[i + 1] if i + 1 < len(args) else "")
          for i, m in enumerate(map(_CONFIG_FLAG.match, args)) if m]


def reject_positional(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")


def checked_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
  """A ``--kinds`` list: each a registry name or ``module:Class``, checked before any
  work (an error names the flag and the kind); duplicates refused."""
  from sagc_jax.control.controller import kind_class

  kinds = tuple(k.strip() for k in kinds if k.strip())
  if len(set(kinds)) != len(kinds):
    raise ValueError(f"--kinds={','.join(kinds)} names a kind twice")
  for kind in kinds:
    try:
      kind_class(kind)
    except ValueError as err:
      raise ValueError(f"--kinds: {err}") from None
  return kinds
