"""A directory that appears whole or not at all: the writers of export-hf and import-hf.

    with new_directory(out, "out", "export-hf", "checkpoint") as tmp:
      ...write every file into tmp...      # renamed onto `out` when the block ends

A command killed at any instruction must leave either nothing at `out` or its
whole result, never a directory that reads as complete without its tokenizer
or memory file; and two writers into one `out` must never mix.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

from experiments.hf.safetensors_io import HFCheckpointError
from experiments.trainer import durable


def check_new_directory(path, flag: str, command: str, what: str) -> Path:
  """`path` (expanded) if it is new or an empty directory; else one line naming why not."""
  path = Path(path).expanduser()
  if path.exists() and not path.is_dir():
    raise HFCheckpointError(f"--{flag}={path} is a file, not a directory; {command} writes "
                            f"a new {what} directory.")
  if path.is_dir() and any(path.iterdir()):
    raise HFCheckpointError(f"--{flag}={path} exists and is not empty; {command} writes a "
                            f"new {what} directory.")
  return path


def _writer_alive(tmp: Path) -> bool:
  """Whether a live process still writes the temporary directory `tmp` (it holds an
  flock on it until it exits; the kernel drops the lock of a killed process)."""
  try:
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    return True
  except OSError:   # no flock on this file system: the pid in the name
    pid = int(tmp.name.rsplit("-", 1)[1])
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    except PermissionError:
      return True
    return True
  finally:
    os.close(fd)
  return False


@contextlib.contextmanager
def new_directory(path, flag: str, command: str, what: str):
  """Yields a private temporary directory beside `path`; renames it onto `path` when
  the block ends without an exception, and removes it otherwise.

  Why: a command killed halfway must leave either nothing at `path` or the whole
  result, never a directory that reads as complete without its tokenizer or memory
  file. The temporary directory is `<path>.tmp-<pid>` in the same parent (one file
  system, so the rename is atomic) and its writer holds an flock on it: another
  writer into the same `path` sees it and is refused at once, and a temporary
  directory left by a killed writer (no lock) is removed. The rename itself never
  merges: a `path` that became a non-empty directory meanwhile (a writer that
  raced past the first check) makes this one fail in one line, its own output
  removed, the other's untouched. Durable across a power cut too: every file and
  folder is fsynced before the rename, and the parent after it
  (experiments/trainer/durable.py).
  """
  path = check_new_directory(path, flag, command, what)
  # Absolute, links resolved: "." has a name and a parent, and a link to an empty
  # directory is published onto its target. Messages keep the path as given.
  final = Path(os.path.realpath(path))
  parent = final.parent
  parent.mkdir(parents=True, exist_ok=True)
  pattern = re.compile(re.escape(final.name) + r"\.tmp-\d+")
  for other in sorted(parent.iterdir()):
    if not pattern.fullmatch(other.name) or not other.is_dir():
      continue
    if _writer_alive(other):
      raise HFCheckpointError(f"--{flag}={path} is being written by another process "
                              f"({other.name}); {command} writes a new {what} directory: "
                              "wait for it, or choose another path.")
    shutil.rmtree(other, ignore_errors=True)   # left by a killed run
  tmp = parent / f"{final.name}.tmp-{os.getpid()}"
  os.mkdir(tmp)
  fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
  try:
    with contextlib.suppress(OSError):   # without flock, the pid in the name tells
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
      yield tmp
      try:
        # Onto nothing or an empty directory; never merges.
        durable.publish(tmp, final, replace=False)
      except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
          raise
        raise HFCheckpointError(
            f"--{flag}={path} was written by another process while this {command} ran; "
            f"it is left as that one wrote it, and nothing of this one was kept.") from None
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  finally:
    os.close(fd)
