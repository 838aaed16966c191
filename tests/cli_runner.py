"""One warm process that runs ``python -m MODULE ARGS`` command lines as forked children.

A command-line test that only checks an early exit (a bad flag, ``--help``, a finished
run) spends most of its second in interpreter start-up and imports. This server starts
once, imports the third-party libraries the commands import (jax, absl, ml_collections,
flax, optax, matplotlib, and the TFDS and orbax that train, eval, compare and aot import
before they check their settings; no ``sagc_jax`` module), and forks a child per command line:
the child runs the module as ``-m`` would (``runpy``, ``__main__``), with its own
``sys.argv``, working directory, standard output and error (files) and exit status.

Whatever the libraries print while they are imported goes to the server's own error
stream, which the client hands back (``WarmCommands.startup_output``): a test that
checks a command's exact output also checks that this is empty, so a line printed at
import time still fails it, as it would in a fresh process.

Protocol: one JSON request per line on stdin, ``{"module", "argv", "cwd", "env"}``
(``env``: variables added to the child's environment); one JSON reply per line on
stdout, ``{"returncode", "stdout", "stderr"}``. The first reply line is
``{"ready": true, "startup_output": ...}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types

PRELOADED = ("jax", "numpy", "absl.app", "absl.flags", "ml_collections",
             "ml_collections.config_flags", "flax.nnx", "optax", "matplotlib",
             "tensorflow_datasets", "orbax.checkpoint")


def _serve() -> None:
  replies = os.fdopen(os.dup(1), "w")
  startup = tempfile.TemporaryFile(mode="w+")
  saved = {fd: os.dup(fd) for fd in (1, 2)}
  for fd in saved:
    os.dup2(startup.fileno(), fd)
  try:
    import importlib
    for name in PRELOADED:
      importlib.import_module(name)
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, copy in saved.items():
      os.dup2(copy, fd)
  startup.seek(0)
  replies.write(json.dumps({"ready": True, "startup_output": startup.read()}) + "\n")
  replies.flush()
  for line in sys.stdin:
    request = json.loads(line)
    with tempfile.TemporaryDirectory() as folder:
      out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
      pid = os.fork()
      if pid == 0:
        _child(request, out, err)
      _, status = os.waitpid(pid, 0)
      with open(out) as f_out, open(err) as f_err:
        reply = {"returncode": os.waitstatus_to_exitcode(status), "stdout": f_out.read(),
                 "stderr": f_err.read()}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()


def _child(request: dict, out: str, err: str) -> None:
  """Runs the command line as ``python -m`` would and exits with its status."""
  import runpy
  import traceback

  code = 0
  try:
    os.chdir(request["cwd"])
    os.environ.update(request.get("env") or {})
    for fd, path in ((1, out), (2, err)):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)    # not the server's request pipe
    sys.argv = [request["module"], *request["argv"]]
    sys.path.insert(0, request["cwd"])      # as ``python -m`` puts its directory first
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
  except SystemExit as stop:
    if stop.code is None or isinstance(stop.code, int):
      code = stop.code or 0
    else:
      print(stop.code, file=sys.stderr)
      code = 1
  except BaseException:       # what the interpreter prints for an uncaught exception
    traceback.print_exc()
    code = 1
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class WarmCommands:
  """The client: ``run(module, *argv, cwd=...)`` -> a ``CompletedProcess``-like object."""

  def __init__(self):
    self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
    ready = json.loads(self.process.stdout.readline())
    assert ready["ready"]
    self.startup_output: str = ready["startup_output"]

  def run(self, module: str, *argv: str, cwd: str | os.PathLike = ".",
          env: dict[str, str] | None = None) -> types.SimpleNamespace:
    request = {"module": module, "argv": list(argv), "cwd": os.path.abspath(cwd),
               "env": dict(env or {})}
    self.process.stdin.write(json.dumps(request) + "\n")
    self.process.stdin.flush()
    reply = self.process.stdout.readline()
    if not reply:
      raise RuntimeError(f"the warm command server died running {module} {argv}")
    return types.SimpleNamespace(**json.loads(reply))

  def close(self) -> None:
    self.process.stdin.close()
    self.process.wait(timeout=60)


if __name__ == "__main__":
  _serve()
