"""HBM traffic of a compiled TPU program, read off its optimised HLO.

Why: XLA's ``cost_analysis()["bytes accessed"]`` sums every instruction's operand and
output bytes in every memory space. On TPU most data of a memory-bound program passes
through on-chip VMEM: a weight is prefetched from HBM into VMEM (``slice-start`` /
``copy-start``) and the fusion that uses it then reads the VMEM copy, and both count.
For a decode step that figure is about twice what HBM actually serves, so it cannot
say whether a decode step is within 1.5x of "read the weights plus the cache once".

This module counts only HBM. After memory-space assignment every array in the
compiled HLO carries its memory space in its layout: no ``S(n)`` (space 0) is HBM,
``S(1)`` VMEM, higher spaces are scalar/sync memories. Per top-level instruction of
the entry computation:

* a prefetch (``slice-start``, ``copy-start``) reads the bytes it moves (its
  destination buffer) from HBM, if its source is there, and writes them to HBM, if
  its destination is there;
* an in-place ``dynamic-update-slice`` of an HBM buffer reads and writes only the
  update;
* any other instruction (fusions, copies, collectives, custom calls) reads each HBM
  operand in full and writes each HBM output in full;
* bookkeeping (``parameter``, ``get-tuple-element``, ``bitcast``, ``tuple``, the
  ``*-done`` halves of async pairs, constants) moves nothing.

It is an estimate with known biases: a fusion that reads only a slice of an HBM
operand (an embedding gather) is charged the whole operand (over-count), and a fusion
that re-reads an operand several times is charged once (under-count). Programs with
control flow (``while``, ``conditional``, ``call``) are refused: their bodies would
be counted once, however many times they run.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any

__all__ = ["hbm_traffic"]

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
             "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([\d,]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*")
_MOVES_NOTHING = {"parameter", "get-tuple-element", "bitcast", "tuple", "constant",
                  "slice-done", "copy-done", "all-gather-done", "all-reduce-done",
                  "collective-permute-done", "async-done", "send-done", "recv-done",
                  "after-all", "partition-id", "replica-id", "opt-barrier", "iota"}
_CONTROL_FLOW = {"while", "conditional", "call"}


def _arrays(shape: str) -> list[tuple[int, bool]]:
  """(bytes, in HBM) of every array in an HLO shape string (a tuple has several)."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(shape):
    size = math.prod(int(d) for d in dims.split(",") if d) * _ITEMSIZE[dtype]
    space = re.search(r"S\((\d+)\)", layout or "")
    out.append((size, space is None or space.group(1) == "0"))
  return out


def _hbm(shape: str) -> int:
  return sum(size for size, in_hbm in _arrays(shape) if in_hbm)


def _split_instruction(line: str) -> tuple[str, str, str, list[str]] | None:
  """(name, result shape, opcode, operand names) of one HLO instruction line."""
  m = _INSTRUCTION.match(line)
  if not m:
    return None
  rest = line[m.end():]
  # The shape is a balanced prefix (tuples nest parentheses); the opcode follows it.
  depth = 0
  for i, c in enumerate(rest):
    depth += (c in "({[") - (c in ")}]")
    if c == " " and depth == 0:
      break
  else:
    i = len(rest)
  shape, tail = rest[:i], rest[i:].lstrip()
  op = re.match(r"([a-z][\w\-]*)\(", tail)
  if not op:
    return None
  # Operands: the balanced parenthesised list right after the opcode.
  start = op.end()
  depth, j = 1, start
  while j < len(tail) and depth:
    depth += {"(": 1, ")": -1}.get(tail[j], 0)
    j += 1
  operands = re.findall(r"%[\w.\-]+", tail[start:j - 1])
  return m.group(1), shape, op.group(1), operands


def hbm_traffic(hlo_text: str) -> dict[str, Any]:
  """Estimated HBM bytes one run of a compiled program moves (see the module docstring).

  Returns ``{"bytes": total, "by_opcode": {opcode: bytes}}``; raises ``ValueError`` for
  a program with control flow in its entry computation.
  """
  at = hlo_text.find("\nENTRY ")
  if at < 0:
    raise ValueError("no ENTRY computation in the HLO text")
  shapes: dict[str, str] = {}
  by_opcode: collections.Counter = collections.Counter()
  for line in hlo_text[at + 1:].splitlines()[1:]:
    if line.startswith("}"):
      break
    parsed = _split_instruction(line)
    if parsed is None:
      continue
    name, shape, op, operands = parsed
    shapes[name] = shape
    if op in _CONTROL_FLOW:
      raise ValueError(f"the entry computation has a {op!r}: its body would be counted once")
    if op in _MOVES_NOTHING:
      continue
    if op in ("slice-start", "copy-start"):
      # Result: (source(s), destination, context...): the moved bytes are the destination's.
      arrays = _arrays(shape)
      dest_index = 1 if op == "slice-start" else 0
      moved, dest_in_hbm = arrays[dest_index] if len(arrays) > dest_index else (0, False)
      source_in_hbm = bool(operands) and _hbm(shapes.get(operands[0], "")) > 0
      nbytes = moved * (int(source_in_hbm) + int(dest_in_hbm))
    elif op == "dynamic-update-slice" and operands and _hbm(shapes.get(operands[0], "")):
      nbytes = 2 * sum(size for size, _ in _arrays(shapes.get(operands[1], "")))
    else:
      nbytes = sum(_hbm(shapes.get(o, "")) for o in operands) + _hbm(shape)
    by_opcode[op] += nbytes
  return {"bytes": float(sum(by_opcode.values())),
          "by_opcode": {k: float(v) for k, v in by_opcode.most_common()}}
