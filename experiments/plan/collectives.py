"""Bytes each device moves through collectives in one run of a compiled program.

Read from the compiled HLO text (`compiled.as_text()`), per device, per kind:
an all-gather counts the piece the device contributes (its result / the group
size), a reduce-scatter its whole input (result × group size), an all-reduce,
all-to-all and collective-permute their buffer. A ragged all-to-all (expert
parallelism) moves a number of rows known only at run time: it counts the
smaller of its operand and its result, the rows it moves when every device
receives as many as it sends (its larger buffer is the worst case of uneven
loads), under "all-to-all". Asynchronous pairs count once
(`-start`; `-done` moves nothing new). Collectives over singleton groups (a mesh
axis of size 1) move nothing and are skipped. A collective inside a `while` body
counts once per iteration when the trip count is known: XLA's `known_trip_count`
(what `lax.scan` and `lax.map` compile to on CPU), or else a loop condition of the
form `counter < constant(N)` (the TPU compiler's loops, its windowed collective
matmuls included, count from 0 by 1: N trips). Any other loop counts once
(reported as `unknown_trips`). The counting convention is the one of the mesh
benchmarks (DESIGN.md §10, its traffic paragraph).
"""

from __future__ import annotations

import math
import re

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_INSTR = re.compile(r"=\s*(?P<shape>\([^=]*?\)|\S+)\s+(?P<op>ragged-all-to-all|"
                    + "|".join(OPS) + r")(?P<start>-start)?\((?P<operand>%?[\w.\-]+)")
_DEFINES = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s")
_ARRAY = re.compile(r"\b(pred|[su](?:4|8|16|32|64)|bf16|f16|f32|f64|f8e4m3fn|f8e5m2)"
                    r"\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2,
          "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
          "f8e4m3fn": 1, "f8e5m2": 1}
# `replica_groups=mesh['axis_0'=2,...], device_ids=(...) {'axis_0'}`: the newer spelling.
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(?P<sizes>[^\]]*)\][^{]*\{(?P<axes>[^}]*)\}")
_SINGLETONS = re.compile(r"replica_groups=(\{\{\d+\}(,\{\d+\})*\}|\[\d+,1\])")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_WHILE = re.compile(r"\bwhile\(.*?body=%?(?P<body>[\w.\-]+)")
_COND = re.compile(r"\bcondition=%?(?P<cond>[\w.\-]+)")
_CONSTANT = re.compile(r"%(?P<name>[\w.\-]+) = [su](?:32|64)\[\]\S* constant\((?P<n>\d+)\)")
_LESS = re.compile(r"ROOT %[\w.\-]+ = pred\[\]\S* compare\(%[\w.\-]+, %(?P<bound>[\w.\-]+)\)"
                   r".*direction=LT")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"')
_CALLS = re.compile(r"\b(?:to_apply|calls|branch_computations|true_computation|"
                    r"false_computation)=\{?(?P<names>%?[\w.\-]+(?:,\s*%?[\w.\-]+)*)\}?")


def _group_size(line: str) -> int:
  if m := _MESH_GROUPS.search(line):
    sizes = {a: int(n) for a, n in re.findall(r"'([^']+)'=(\d+)", m.group("sizes"))}
    return math.prod(sizes[a] for a in re.findall(r"'([^']+)'", m.group("axes")))
  if m := re.search(r"replica_groups=\{\{([0-9,]*)\}", line):
    return len(m.group(1).split(","))
  if m := re.search(r"replica_groups=\[\d+,(\d+)\]", line):
    return int(m.group(1))
  if m := re.search(r"source_target_pairs=\{(.*?)\}\}", line):   # collective-permute
    return 2 if m.group(1) else 1
  return 1


def _array_bytes(shape: str) -> float:
  return sum(_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d)
             for dt, dims in _ARRAY.findall(shape))


def line_bytes(line: str, shapes: dict[str, str] | None = None) -> tuple[str, float] | None:
  """(kind, bytes per device) of one HLO instruction line, None if it moves nothing.
  `shapes`: {instruction name: shape} of the module (a ragged all-to-all's operand)."""
  line = re.sub(r"/\*index=\d+\*/", "", line)
  m = _INSTR.search(line)
  if m is None or _SINGLETONS.search(line):
    return None
  op = m.group("op")
  if op == "collective-permute" and re.search(r"source_target_pairs=\{\}", line):
    return None
  shape = m.group("shape")
  if m.group("start") and shape.startswith("("):
    # An async start returns (operands, results[, context]): count the results half. A
    # collective-permute-start's tuple is flat, (operand, result, context scalars...),
    # as the TPU compiler and XLA:GPU write it: its result is the second element.
    shape = _async_results(shape, flat=op == "collective-permute")
  nbytes = _array_bytes(shape)
  group = _group_size(line)
  if op == "ragged-all-to-all":
    operand = (shapes or {}).get(m.group("operand").lstrip("%"))
    if operand is not None:
      nbytes = min(nbytes, _array_bytes(operand))
    op = "all-to-all"
  if group <= 1 and op != "collective-permute":
    return None
  if op == "all-gather":       # the result holds every device's piece
    nbytes /= group
  elif op == "reduce-scatter":  # the result is one device's piece of the sum
    nbytes *= group
  return op, nbytes


def _async_results(shape: str, flat: bool = False) -> str:
  """The results element of an async start's tuple shape `((ins...), (outs...), ...)`;
  `flat`: of `(in, out, ...)` (a collective-permute-start)."""
  depth, parts, current = 0, [], ""
  for ch in shape[1:-1]:   # commas inside (...), [dims] and {layout} do not split
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    if ch == "," and depth == 0:
      parts.append(current)
      current = ""
    else:
      current += ch
  parts.append(current)
  if len(parts) > 1 and (flat or parts[0].strip().startswith("(")):
    return parts[1]
  return shape


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str | None]:
  comps, entry, name = {}, None, None
  for line in hlo_text.splitlines():
    if name is None:
      m = _HEADER.match(line)
      if m and "=" not in line.split("(")[0]:
        name = m.group("name")
        comps[name] = []
        if line.startswith("ENTRY"):
          entry = name
      continue
    if line.rstrip() == "}":   # a computation's end (a custom call's config may span lines)
      name = None
    else:
      comps[name].append(line)
  return comps, entry


def _bounded_trips(comps: dict[str, list[str]], cond) -> int | None:
  """N of a loop condition `counter < constant(N)` (module docstring), else None."""
  lines = comps.get(cond.group("cond").lstrip("%"), ()) if cond else ()
  constants = {m.group("name"): int(m.group("n")) for line in lines
               if (m := _CONSTANT.search(line))}
  for line in lines:
    if (m := _LESS.search(line)) and m.group("bound") in constants:
      return constants[m.group("bound")]
  return None


def collective_bytes(hlo_text: str, unknown_trip_count: int = 1) -> dict[str, float]:
  """{kind: bytes per device per run} over `OPS`, plus "unknown_trips": how many while
  loops holding collectives had no known trip count (counted `unknown_trip_count` times:
  once unless told; 0 leaves them out, e.g. a decode loop that ends on its end tokens)."""
  comps, entry = _computations(hlo_text)
  shapes = {m.group("name"): m.group("shape") for line in hlo_text.splitlines()
            if (m := _DEFINES.match(line))}
  memo: dict[str, dict[str, float]] = {}
  unknown = [0]

  def total(name: str, seen: frozenset) -> dict[str, float]:
    if name in memo:
      return memo[name]
    out = dict.fromkeys(OPS, 0.0)
    for line in comps.get(name, ()):
      found = line_bytes(line, shapes)
      if found:
        out[found[0]] += found[1]
      called: list[tuple[str, int]] = []
      if w := _WHILE.search(line):
        trips = _TRIPS.search(line)
        n = int(trips.group("n")) if trips else _bounded_trips(comps, _COND.search(line))
        body = w.group("body").lstrip("%")
        called.append((body, n if n else unknown_trip_count))
        if not n and any(total(body, seen | {name}).values()):
          unknown[0] += 1
      elif " fusion(" not in line:   # fusions hold no collectives
        for m in _CALLS.finditer(line):
          called += [(n.strip().lstrip("%"), 1) for n in m.group("names").split(",")]
      for callee, times in called:
        if callee in comps and callee not in seen and callee != name:
          for op, n in total(callee, seen | {name}).items():
            out[op] += times * n
    memo[name] = out
    return out

  if entry is None:   # not a module: read the lines as they are
    out = dict.fromkeys(OPS, 0.0)
    for line in hlo_text.splitlines():
      if found := line_bytes(line, shapes):
        out[found[0]] += found[1]
    return {**out, "unknown_trips": 0}
  return {**total(entry, frozenset()), "unknown_trips": unknown[0]}
