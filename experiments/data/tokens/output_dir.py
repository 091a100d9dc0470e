"""The directory prepare-data writes into (experiments/data/tokens/prepare.py): what it may
write among, and one run at a time.

`out` is a new or empty directory, or one prepare-data wrote; a `tokenizer.json` there is
replaced only when it is prepare-data's own (the tokenizer of the directory's manifest or
shards) or the same tokenizer. A run holds an flock on `out/.lock`; the temporary files a
killed run left behind are removed by the next one under that lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from pathlib import Path

from experiments.data.tokens import format as fmt
from experiments.data.tokens.format import TokenDataError
from experiments.data.tokens.tokenizer import FILE as TOKENIZER_FILE
from experiments.data.tokens.tokenizer import TokenizerInfo, canonical_sha256

_SHARD_FILE = re.compile(r"\d{5,}\.(tokens|offsets|val|done\.json)(\.\d+)?(\.tmp)?")
_TOP_TMP = re.compile(r"(manifest|tokenizer)\.json(\.\d+)?\.tmp")


def _ours(root: Path) -> set[str]:
  """The tokenizer digests this directory's manifest and done-records were written with."""
  digests = set()
  try:
    digests.add(json.loads((root / fmt.MANIFEST).read_text())["tokenizer"]["sha256"])
  except (OSError, ValueError, KeyError, TypeError):
    pass
  for path in (root / fmt.SHARDS).glob("*.done.json"):
    try:
      digests.add(json.loads(path.read_text())["settings"]["tokenizer_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
      pass
  return digests


def check_out(root: Path, out: str, info: TokenizerInfo) -> None:
  """Refuses an `out` prepare-data must not write into: not a directory, a directory
  of other files (no manifest.json or shards/ of ours), a manifest of another program
  or a newer format, or a tokenizer.json prepare-data did not write."""
  if not root.exists():
    return
  if not root.is_dir():
    raise TokenDataError(f"--out={out!r} exists and is not a directory; prepare-data "
                         "writes a data directory.")
  if not {p.name for p in root.iterdir()} - {fmt.LOCK}:
    return
  if (root / fmt.MANIFEST).exists():
    try:
      fmt.read_manifest(root)
    except TokenDataError as e:
      raise TokenDataError(f"--out={out!r}: {e}".rstrip(".") + "; pass a new or empty "
                           "--out.") from None
  elif not _shards_of_ours(root):
    raise TokenDataError(
        f"--out={out!r} is not empty and is not a prepare-data directory (no {fmt.MANIFEST} "
        f"or {fmt.SHARDS}/ of prepare-data); pass a new or empty --out: prepare-data never "
        "writes among other files.")
  existing = root / TOKENIZER_FILE
  if existing.exists():
    digest = canonical_sha256(existing)
    if digest != info.sha256 and digest not in _ours(root):
      raise TokenDataError(
          f"--out={out!r}: {existing} is not a tokenizer this directory was prepared with, "
          "and prepare-data never overwrites a file it did not write; pass a new --out "
          "(or move that file away first).")


def _shards_of_ours(root: Path) -> bool:
  shards = root / fmt.SHARDS
  return shards.is_dir() and all(_SHARD_FILE.fullmatch(p.name) for p in shards.iterdir())


@contextlib.contextmanager
def locked(root: Path, out: str):
  """Holds `root/.lock` (flock, non-blocking): a second prepare-data into the same
  directory is refused at once rather than racing this one on its shards. The file
  names the holder's pid; it is removed on exit, and left by a killed run, whose
  lock the kernel released."""
  path = root / fmt.LOCK
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      for _ in range(50):   # the holder writes its pid just after it takes the lock
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if holder.isdigit():
          break
        time.sleep(0.01)
      os.close(fd)
      raise TokenDataError(
          f"another prepare-data is writing into {out}"
          + (f" (pid {holder})" if holder.isdigit() else "")
          + "; wait for it to finish (or stop it) and rerun.") from None
    try:   # the holder may have removed the file between our open and flock
      same = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    yield
  finally:
    path.unlink(missing_ok=True)   # before the unlock: a next run makes a fresh file
    os.close(fd)


def remove_stale_tmp(root: Path) -> None:
  """Temporary files of killed runs (this run holds the lock: nobody else writes them)."""
  for path in root.iterdir():
    if _TOP_TMP.fullmatch(path.name):
      path.unlink(missing_ok=True)
  shards = root / fmt.SHARDS
  if shards.is_dir():
    for path in shards.iterdir():
      if path.name.endswith(".tmp") and _SHARD_FILE.fullmatch(path.name):
        path.unlink(missing_ok=True)
