"""Writes that survive a power cut, and reads that refuse what one leaves.

    write_text(path, text)       a file under a temporary name, fsynced, renamed onto
    write_bytes(path, data)      `path`, then its folder fsynced
    copy_file(source, path)      the same for a copy
    publish(tmp, final)          a finished file or folder renamed into place
    sync_tree(root) / sync_dir(path)
    read_json(path, what)        a JSON file, or one line naming it when it is empty,
                                 cut short or not JSON

A rename makes a file or folder appear whole to other processes at once, but after
a power cut the file system may hold the rename without the data written before it:
the new name then points at empty or partial files. So every writer that renames
into place fsyncs the files, then the folder holding them (their names), renames,
and fsyncs the parent folder (the rename itself). Nothing here is needed against a
killed process, only against a machine that stops.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path


def sync_file(path) -> None:
  """Flushes a file's data to the disk."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def sync_dir(path) -> None:
  """Flushes a folder's entries (the names created, renamed or removed in it)."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:   # a file system without directory handles: nothing to flush
    return
  try:
    os.fsync(fd)
  except OSError as e:   # some file systems refuse fsync on a folder (EINVAL)
    if e.errno != errno.EINVAL:
      raise
  finally:
    os.close(fd)


def sync_tree(root) -> None:
  """Every file under `root`, then every folder from the deepest up (`root` last)."""
  root = Path(root)
  if not root.is_dir():
    sync_file(root)
    return
  folders = []
  for top, dirs, files in os.walk(root):
    folders.append(top)
    for name in files:
      path = os.path.join(top, name)
      if not os.path.islink(path):
        sync_file(path)
    dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
  for folder in reversed(folders):
    sync_dir(folder)


def publish(tmp, final, *, replace: bool = True) -> None:
  """Renames the finished file or folder `tmp` onto `final` durably: its contents
  fsynced first, the parent folder after. `replace=False`: os.rename, which never
  merges a folder into a non-empty one (the caller handles its OSError)."""
  sync_tree(tmp)
  (os.replace if replace else os.rename)(tmp, final)
  sync_dir(Path(final).parent)


def _tmp(path: Path) -> Path:
  return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _replace_with(path, fill) -> Path:
  """`fill(tmp)` writes a temporary beside `path`; it is fsynced, renamed onto `path`, and
  the folder fsynced: all or nothing, after a kill or a power cut."""
  path = Path(path)
  tmp = _tmp(path)
  try:
    fill(tmp)
    sync_file(tmp)
    os.replace(tmp, path)
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise
  sync_dir(path.parent)
  return path


def write_bytes(path, data: bytes) -> Path:
  """`data` in `path`, all or nothing, after a kill or a power cut."""
  return _replace_with(path, lambda tmp: Path(tmp).write_bytes(data))


def write_text(path, text: str) -> Path:
  return write_bytes(path, text.encode("utf-8"))


def copy_file(source, path) -> Path:
  """A copy of `source` at `path`, all or nothing, after a kill or a power cut."""
  return _replace_with(path, lambda tmp: shutil.copyfile(source, tmp))


def read_json(path, what: str = "file"):
  """The JSON value in `path`; a one-line ValueError naming it when it is empty or not
  JSON (a write cut short, e.g. by a power cut before these writers fsynced)."""
  path = Path(path)
  data = path.read_bytes()
  if not data.strip():
    raise ValueError(f"{path}: the {what} is empty ({len(data)} bytes; a write cut short, "
                     "e.g. by a power cut); remove it or write it again.")
  try:
    return json.loads(data)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: the {what} is not whole JSON ({' '.join(str(e).split())}; "
                     f"{len(data)} bytes: cut short?); remove it or write it again.") from None
