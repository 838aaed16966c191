"""The package's architecture, checked from its source (no imports run).

Imports flow one way, from the host-side pieces at the bottom to the command-line
tools at the top; a module may import only from its own layer or below, and no
group of modules imports itself round in a cycle (function-level imports count:
a lazy import is still a dependency). Importing ``a.b.c`` runs ``a/__init__`` and
``a/b/__init__`` first, so those packages count as dependencies too. The package
root holds only the CLIs, and only the CLIs and the config schema (what users
write) import ml_collections: everything below reads typed config sections.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "sagc_jax"

# Layer of each part (dotted module prefix below ``sagc_jax``; the longest prefix wins).
LAYERS = {
    "base": 0,             # the config-value checks and the statistics every report shares
    "control": 1,          # the controller protocol, the registry of kinds, the controllers
    "rewards": 1,          # verifiers and the reward mix
    "replay": 2,           # the offline replay: engine, worlds, traces, costs (numpy only)
    "runtime": 2,          # processes, compilation, checkpoints, storage, metrics
    "models": 3,
    "data": 3,
    "sampling": 4,
    "rl": 4,
    "config": 5,           # schema, presets, the typed sections and their checks (no JAX)
    "training": 6,
    "cli": 7,              # absl plumbing the CLIs share
    "experiments": 8,
    "aot": 8,
    "bench": 8,
    "": 9,                 # the command-line tools at the package root
}
ROOT_MODULES = {"__init__", "cli", "train", "eval", "export", "import_model", "simulate", "compare",
                "claims", "figures", "calibrate"}
MAX_LINES = 450


def module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE).with_suffix("").parts
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def imports_of(path: pathlib.Path) -> set[str]:
  """Modules of ``sagc_jax`` that ``path`` imports anywhere (dotted, without the prefix)."""
  name = module_name(path)
  package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.ImportFrom):
      if node.level:
        base = package[:len(package) - node.level + 1]
        target = ".".join(["sagc_jax", *base] + ([node.module] if node.module else []))
      else:
        target = node.module or ""
      if target == "sagc_jax" or target.startswith("sagc_jax."):
        # ``from pkg import name``: ``name`` may be a module; ``resolve`` decides.
        found.update(f"{target}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name.startswith("sagc_jax."))
  return {t.removeprefix("sagc_jax.") for t in found}


def resolve(target: str, modules: set[str]) -> str:
  """The module a dotted import names (``from pkg import name`` may name a module or
  an attribute of ``pkg``)."""
  while target and target not in modules:
    target = target.rpartition(".")[0]
  return target


def layer(module: str) -> int:
  best = ""
  for prefix in LAYERS:
    if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
      best = prefix
  if best == "" and "." in module:
    raise AssertionError(f"sagc_jax.{module} is in no layer of LAYERS: add its folder")
  return LAYERS[best]


def with_parent_packages(modules: set[str]) -> set[str]:
  """``modules`` and every package whose ``__init__`` importing them runs."""
  out = set(modules)
  for module in modules:
    parts = module.split(".")
    out.update(".".join(parts[:i]) for i in range(1, len(parts)))
  return out


def graph() -> dict[str, set[str]]:
  files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
  modules = set(files)
  return {name: with_parent_packages({resolve(t, modules) for t in imports_of(path)})
          - {name, ""} for name, path in files.items()}


# What may import ml_collections: the config schema and presets (users' config files
# build on them) and the command-line tools that parse --config.
ML_COLLECTIONS_ALLOWED = {"config.schema", "config.presets", "cli", "train", "compare",
                          "simulate", "calibrate", "aot.__main__"}


def test_only_the_command_line_and_the_schema_import_ml_collections():
  found = set()
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      if any(n == "ml_collections" or n.startswith("ml_collections.") for n in names):
        found.add(module_name(path))
  assert found <= ML_COLLECTIONS_ALLOWED, (
      f"ml_collections imported below the command line: {sorted(found - ML_COLLECTIONS_ALLOWED)}")


def test_imports_flow_one_way():
  upward = [f"sagc_jax.{m} (layer {layer(m)}) imports sagc_jax.{d} (layer {layer(d)})"
            for m, deps in sorted(graph().items()) for d in sorted(deps)
            if layer(d) > layer(m) and not m.startswith(d + ".")]
  assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles():
  edges = graph()
  # A package's __init__ importing its own submodules is not a cycle of the design.
  edges = {m: {d for d in deps if not d.startswith(m + ".") and not m.startswith(d + ".")}
           for m, deps in edges.items()}
  state: dict[str, int] = {}
  cycles = []

  def visit(node, stack):
    state[node] = 1
    stack.append(node)
    for dep in sorted(edges.get(node, ())):
      if state.get(dep) == 1:
        cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
      elif dep not in state:
        visit(dep, stack)
    stack.pop()
    state[node] = 2

  for node in sorted(edges):
    if node not in state:
      visit(node, [])
  assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_package_root_holds_only_the_command_line_tools():
  root = {p.stem for p in PACKAGE.glob("*.py")}
  assert root <= ROOT_MODULES, f"library modules at the package root: {sorted(root - ROOT_MODULES)}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p))
def test_module_size(path):
  lines = len(path.read_text(encoding="utf-8").splitlines())
  assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MAX_LINES})"


def test_no_private_names_imported_across_modules():
  bad = []
  for path in PACKAGE.rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sagc_jax"):
        bad += [f"{module_name(path)}: from {node.module} import {a.name}"
                for a in node.names if a.name.startswith("_")]
  assert not bad, "private names imported:\n" + "\n".join(bad)


# Private attributes of other types that are public API: NamedTuple methods, os._exit.
_PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_exit"}


def test_no_private_attributes_used_across_modules():
  """``obj._name`` only where this module defines ``_name`` itself (its own classes)."""
  bad = []
  for path in PACKAGE.rglob("*.py"):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
           and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}
    own |= {n.name for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    # A line that says so (``pylint: disable=protected-access``) reads a third-party
    # private on purpose.
    waived = {i + 1 for i, line in enumerate(path.read_text(encoding="utf-8").splitlines())
              if "protected-access" in line}
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
          and node.lineno not in waived
          and not node.attr.startswith("__") and node.attr not in _PUBLIC_UNDERSCORE
          and node.attr not in own
          and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
        bad.append(f"{module_name(path)}:{node.lineno}: .{node.attr}")
  assert not bad, "private attributes of other modules used:\n" + "\n".join(bad)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
  """The checks above can fail: a planted upward import and cycle are reported."""
  fake = tmp_path / "sagc_jax"
  (fake / "control").mkdir(parents=True)
  (fake / "models").mkdir()
  (fake / "__init__.py").write_text("")
  (fake / "control" / "__init__.py").write_text("")
  (fake / "models" / "__init__.py").write_text("")
  (fake / "control" / "a.py").write_text("from sagc_jax.models.b import x\n")
  (fake / "models" / "b.py").write_text("def f():\n  from sagc_jax.control import a\n")
  monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
  with pytest.raises(AssertionError, match="control.a .layer 1. imports sagc_jax.models.b"):
    test_imports_flow_one_way()
  with pytest.raises(AssertionError, match="import cycles"):
    test_no_import_cycles()


def test_control_imports_nothing_from_runtime():
  """The controllers and the replay engine are host-side numpy: they run where no
  process group, mesh or checkpoint exists (LAYERS puts runtime above control)."""
  assert layer("runtime") > layer("control")
  found = sorted(f"{m} -> {d}" for m, deps in graph().items() if m.startswith("control")
                 for d in deps if d.startswith("runtime"))
  assert not found, f"control/ imports runtime/: {found}"
