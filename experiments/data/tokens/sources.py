"""Input files of `prepare`: listing them, and reading their documents.

An input is a comma-separated list of files, folders and globs. By name:
  *.parquet              one document per row of the text column (`text_field`,
                         "text" by default, as FineWeb-Edu ships it)
  *.jsonl, *.ndjson      one document per line, a JSON object with `text_field`
  anything else          a plain text file: the whole file is one document
In folders, hidden entries and binary files (a NUL byte in the first 8 KiB)
are skipped, as for the byte-level corpus (experiments/data/corpus.py).

A file is read once however many names reach it (compared by `os.path.realpath`:
`a.jsonl,./a.jsonl,/abs/a.jsonl` and a symlink are one input). Nothing under the
command's own output (`exclude`) is ever an input: a folder that holds the output
(`--input=corpus --out=corpus/prepared`) is listed without it, so a rerun does
not read back the manifest, tokenizer and done-records it wrote; naming the output
itself, or an input inside it, is refused (the output would swallow its input).

A document is yielded as its UTF-8 bytes; text that is not UTF-8 is counted
and skipped (`on_bad_utf8="skip"`) or refused (`"error"`).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path

from experiments.data.tokens.format import TokenDataError

PARQUET = (".parquet",)
JSONL = (".jsonl", ".ndjson")
BAD_UTF8 = ("skip", "error")
_SNIFF_BYTES = 8192
_PARQUET_BATCH = 1024


def kind_of(path: str) -> str:
  name = path.lower()
  if name.endswith(PARQUET):
    return "parquet"
  if name.endswith(JSONL):
    return "jsonl"
  return "text"


def _is_text(path: Path) -> bool:
  with open(path, "rb") as f:
    return b"\0" not in f.read(_SNIFF_BYTES)


def _under(path: str, root: str | None) -> bool:
  """Whether real path `path` is `root` or inside it."""
  return root is not None and (path == root or path.startswith(root.rstrip(os.sep) + os.sep))


def _walk(root: Path, exclude: str | None = None) -> list[str]:
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                         and not _under(os.path.realpath(os.path.join(dirpath, d)), exclude))
    for name in filenames:
      path = Path(dirpath) / name
      if name.startswith(".") or not path.is_file() or _under(os.path.realpath(path), exclude):
        continue
      if kind_of(name) != "text" or _is_text(path):
        found.append(str(path))
  return found


def list_inputs(spec: str, *, exclude: str | os.PathLike | None = None,
                what: str = "--out") -> list[str]:
  """The files named by a comma-separated list of files, folders and globs (sorted,
  each file once however it is spelled); refuses a name that matches nothing and an
  input with no file. `exclude`: the command's output (`what` names it in errors),
  never read as input: skipped inside a listed folder or among a glob's matches,
  refused when named itself, when it holds a named input, or when it holds every
  match of a glob."""
  out = None if exclude is None else os.path.realpath(os.path.expanduser(exclude))
  found: list[str] = []

  def refuse_inside(entry: str) -> None:
    real = os.path.realpath(os.path.expanduser(entry))
    if _under(real, out):
      relation = "is" if real == out else "is inside"
      raise TokenDataError(
          f"--input: {entry!r} {relation} {what}={str(exclude)!r}: the output would be read "
          f"back as input; write {what} outside the inputs (a folder inside an input folder "
          "is fine: its files are never read).")

  for entry in (e.strip() for e in str(spec).split(",")):
    if not entry:
      continue
    path = Path(entry).expanduser()
    if path.is_dir():
      refuse_inside(entry)
      found.extend(_walk(path, out))
    elif path.is_file():
      refuse_inside(entry)
      found.append(str(path))
    elif glob.has_magic(entry):
      matches = sorted(glob.glob(os.path.expanduser(entry), recursive=True))
      if not matches:
        raise TokenDataError(f"--input: {entry!r} matches no file.")
      outside = [m for m in matches if not _under(os.path.realpath(m), out)]
      if not outside:   # every match is the output's: the glob names nothing else
        refuse_inside(matches[0])
      for match in outside:
        found.extend(_walk(Path(match), out) if Path(match).is_dir() else [match])
    else:
      raise TokenDataError(f"--input: {entry!r} is not a file, a folder or a glob that "
                           "matches one.")
  # One file, one input: the first spelling in sorted order stands for all of them.
  unique: dict[str, str] = {}
  for name in sorted(found):
    unique.setdefault(os.path.realpath(name), name)
  if not unique:
    raise TokenDataError(f"--input={spec!r} names no input file (empty folders?).")
  return sorted(unique.values())


def first_line_is_json_object(path: str, limit: int = 1 << 20) -> bool:
  """Whether a file read as plain text starts with a line that is a JSON object (it
  is probably JSON lines under another name, e.g. `data.json`); reads <= `limit` bytes."""
  with open(path, "rb") as f:
    head = f.read(limit)
  line = head.split(b"\n", 1)[0].strip()
  if not line.startswith(b"{"):
    return False
  try:
    return isinstance(json.loads(line), dict)
  except ValueError:
    return False


class BadText:
  """A counter of documents skipped as not UTF-8; raises instead under "error"."""

  def __init__(self, on_bad_utf8: str):
    if on_bad_utf8 not in BAD_UTF8:
      raise TokenDataError(f"on_bad_utf8={on_bad_utf8!r} must be one of {BAD_UTF8}.")
    self.mode, self.count = on_bad_utf8, 0

  def check(self, data: bytes, where: str) -> bytes | None:
    try:
      data.decode("utf-8")
    except UnicodeDecodeError as e:
      if self.mode == "error":
        raise TokenDataError(f"{where} is not UTF-8 text (byte {e.start}); pass "
                             "--on_bad_utf8=skip to count and skip such documents.") from None
      self.count += 1
      return None
    return data


def _parquet_docs(path: str, text_field: str) -> Iterator[tuple[str, bytes | str]]:
  try:
    import pyarrow.parquet as pq
  except ModuleNotFoundError:
    raise TokenDataError(f"{path}: reading parquet needs pyarrow: pip install "
                         "'lngram-jax[data]'.") from None

  try:
    file = pq.ParquetFile(path)
  except Exception as e:  # pyarrow raises its own error types, ArrowInvalid among them
    raise TokenDataError(f"{path}: not a readable parquet file ({e}).") from None
  columns = file.schema_arrow.names
  if text_field not in columns:
    raise TokenDataError(f"{path}: no column {text_field!r} (found: {', '.join(columns)}); "
                         "pass --text_field=<one of them>.")
  row = 0
  for batch in file.iter_batches(columns=[text_field], batch_size=_PARQUET_BATCH):
    for value in batch.column(0).to_pylist():
      row += 1
      if value is not None:
        yield f"{path} row {row - 1}", value


def _jsonl_docs(path: str, text_field: str) -> Iterator[tuple[str, bytes | str]]:
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path} line {number}"
      try:
        record = json.loads(line)
      except UnicodeDecodeError:
        yield where, line   # left to the UTF-8 rule
        continue
      except ValueError as e:
        raise TokenDataError(f"{where}: not a JSON object ({e}).") from None
      if not isinstance(record, dict) or text_field not in record:
        keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise TokenDataError(f"{where}: no field {text_field!r} (found: {keys}); pass "
                             "--text_field=<one of them>.")
      if record[text_field] is not None:
        yield where, record[text_field]


def documents(path: str, text_field: str, bad: BadText) -> Iterator[bytes]:
  """The UTF-8 bytes of every document of one input file, in file order."""
  kind = kind_of(path)
  if kind == "text":
    items = iter([(path, Path(path).read_bytes())])
  else:
    items = (_parquet_docs if kind == "parquet" else _jsonl_docs)(path, text_field)
  for where, value in items:
    if isinstance(value, str):
      try:
        value = value.encode("utf-8")
      except UnicodeEncodeError:   # lone surrogates from a JSON escape
        value = value.encode("utf-8", "surrogatepass")
    elif not isinstance(value, bytes):
      raise TokenDataError(f"{where}: {text_field!r} holds {type(value).__name__}, not text.")
    data = bad.check(value, where)
    if data is not None:
      yield data
