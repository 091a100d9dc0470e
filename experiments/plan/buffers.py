"""What fills a compiled program's memory peak: its largest buffers live there, by name.

    options = dump_options(directory)              compile options that make XLA write its
    compiled = lowered.compile(options)            buffer assignment for this compile
    peak = peak_buffers(directory, top=10)         {"live_bytes", "time", "buffers": [...]}

XLA writes, per compiled module, its buffer assignment (every HLO value with its size and
allocation), the live range of each value on the final schedule (instruction positions)
and the optimised program, whose instructions carry the JAX operation that made them and
a stack frame (file and line). Sweeping the live ranges of the values that temporaries
hold (not the parameters) gives the schedule position where the most bytes are live, the
peak; the values live there, largest first, are what fills it. Each comes with its HLO
shape, bytes, the instruction that defines it, the JAX operation name and the innermost
source line that traced it. XLA:CPU and XLA:GPU write these files; a compiler that writes
none (libtpu's TPU compiler may not) gives None, and the plan says so.
"""

from __future__ import annotations

import re
from pathlib import Path

_ALLOCATION = re.compile(r"^allocation (?P<id>\d+): size (?P<size>\d+)(?P<rest>.*)$")
_VALUE = re.compile(r"^ value: <\d+ (?P<name>[^ ]+) @\d+> \(size=(?P<size>\d+),offset=\d+\): "
                    r"(?P<shape>.*)$")
_RANGE = re.compile(r"^\s+(?P<name>\S+\{[\d,]*\}):(?P<start>\d+)-(?P<end>\d+)$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = .*?metadata=\{(?P<meta>[^}]*)\}")
_OP_NAME = re.compile(r'op_name="(?P<op>[^"]*)"')
_SOURCE = re.compile(r'source_file="(?P<file>[^"]*)" source_line=(?P<line>\d+)')
_FRAME_ID = re.compile(r"stack_frame_id=(?P<id>\d+)")


def dump_options(directory: str | Path, compiler: str = "XLA:CPU") -> dict:
  """Compile options (XLA debug options) that write this compile's buffer assignment,
  live ranges and optimised program as text under `directory` (for XLA:GPU without its
  LLVM IR)."""
  options = {"xla_dump_to": str(directory), "xla_dump_hlo_as_text": True}
  if compiler == "XLA:GPU":
    options["xla_gpu_dump_llvmir"] = False
  return options


def _module_files(directory: Path) -> dict[str, Path] | None:
  """The largest module's buffer-assignment, live-range and optimised-program files (a
  step compiles one large module; small helper modules may be written beside it)."""
  assignments = sorted(directory.glob("*after_optimizations-buffer-assignment.txt"),
                       key=lambda p: p.stat().st_size)
  if not assignments:
    return None
  assignment = assignments[-1]
  stem = assignment.name[:-len("-buffer-assignment.txt")]
  files = {"assignment": assignment, "ranges": directory / f"{stem}-live-range.txt",
           "program": directory / f"{stem}.txt"}
  return files if all(p.is_file() for p in files.values()) else None


def _temp_values(text: str) -> dict[str, tuple[int, str]]:
  """{value name{index}: (bytes, shape)} of the values held by non-parameter, non-constant
  allocations (the program's temporaries and outputs)."""
  values, keep = {}, False
  for line in text.splitlines():
    if m := _ALLOCATION.match(line):
      keep = "parameter" not in m.group("rest") and "constant" not in m.group("rest")
      continue
    if keep and (m := _VALUE.match(line)):
      name = m.group("name")
      key = name if name.endswith("}") else f"{name}{{}}"
      values[key] = (int(m.group("size")), m.group("shape").split("{")[0].strip())
  return values


def _ranges(text: str) -> dict[str, tuple[int, int]]:
  return {m.group("name"): (int(m.group("start")), int(m.group("end")))
          for line in text.splitlines() if (m := _RANGE.match(line))}


def _sources(text: str) -> dict[str, tuple[str, str]]:
  """{instruction: (JAX operation name, innermost "file:line")} of the optimised program."""
  files = _table(text, "FileNames", r'^(?P<id>\d+) "(?P<v>[^"]*)"')
  locations = _table(text, "FileLocations",
                     r"^(?P<id>\d+) \{file_name_id=(?P<v>\d+) function_name_id=\d+ line=(?P<l>\d+)")
  frames = _table(text, "StackFrames", r"^(?P<id>\d+) \{file_location_id=(?P<v>\d+)")
  out = {}
  for line in text.splitlines():
    m = _INSTRUCTION.match(line)
    if m is None:
      continue
    meta = m.group("meta")
    op = _OP_NAME.search(meta)
    source = ""
    if s := _SOURCE.search(meta):
      source = f"{s.group('file')}:{s.group('line')}"
    elif (f := _FRAME_ID.search(meta)) and f.group("id") in frames:
      location = locations.get(frames[f.group("id")][0])
      if location:
        source = f"{files.get(location[0], ('?',))[0]}:{location[1]}"
    out[m.group("name")] = (op.group("op") if op else "", source)
  return out


def _table(text: str, title: str, pattern: str) -> dict[str, tuple[str, ...]]:
  """A numbered table at the top of an HLO dump (FileNames, FileLocations, StackFrames)."""
  row = re.compile(pattern)
  out, inside = {}, False
  for line in text.splitlines():
    if line.strip() == title:
      inside = True
      continue
    if inside:
      m = row.match(line.strip())
      if m is None:
        if line.strip():
          break
        continue
      out[m.group("id")] = tuple(v for k, v in m.groupdict().items() if k != "id")
  return out


def peak_buffers(directory: str | Path, top: int = 10) -> dict | None:
  """The largest `top` values live at the schedule position where the temporaries' live
  bytes peak: {"live_bytes", "time", "buffers": [{"name", "shape", "bytes", "op", "source",
  "live"}]}; None when the compiler wrote no buffer assignment there."""
  files = _module_files(Path(directory))
  if files is None:
    return None
  values = _temp_values(files["assignment"].read_text())
  ranges = _ranges(files["ranges"].read_text())
  live = {k: (values[k], ranges[k]) for k in values if k in ranges}
  if not live:
    return None
  events: dict[int, int] = {}
  for (size, _), (start, end) in live.values():
    events[start] = events.get(start, 0) + size
    events[end + 1] = events.get(end + 1, 0) - size
  running, best, when = 0, -1, 0
  for t in sorted(events):
    running += events[t]
    if running > best:
      best, when = running, t
  at_peak = sorted(((size, shape, k, rng) for k, ((size, shape), rng) in live.items()
                    if rng[0] <= when <= rng[1]), reverse=True)
  sources = _sources(files["program"].read_text())
  buffers = []
  for size, shape, key, rng in at_peak[:top]:
    instruction = key.split("{")[0]
    op, source = sources.get(instruction, ("", ""))
    buffers.append({"name": key, "shape": shape, "bytes": size, "op": op, "source": source,
                    "live": rng})
  return {"live_bytes": best, "time": when, "buffers": buffers}
