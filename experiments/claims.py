"""Claim files: several processes on one machine share a run queue without a fixed split.

    with claim(workdir) as mine:
      if mine: train(workdir)

A claim is `<workdir>.claim` beside the run directory, holding the claimer's pid and
host, written under a lock on the folder. A claim whose process has died on this host (a queue
killed with SIGKILL or SIGTERM leaves its file) is taken over; a claim from another host
always counts as live, since its process cannot be checked from here: remove such a file
by hand once that process is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path

SUFFIX = ".claim"
LOCK = ".claims.lock"


def claim_path(workdir) -> Path:
  workdir = Path(workdir)
  return workdir.parent / f"{workdir.name}{SUFFIX}"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # another user's live process
    return True
  return True


def holder(workdir) -> dict | None:
  """{"pid", "host"} of the live claim on `workdir`, or None (no claim, or a dead one)."""
  path = claim_path(workdir)
  try:
    owner = json.loads(path.read_text())
    pid, host = int(owner["pid"]), str(owner["host"])
  except (OSError, ValueError, KeyError, TypeError):   # none, or unreadable (claims are
    return None                                        # written whole): nobody holds it
  if host == socket.gethostname() and not _alive(pid):
    return None
  return {"pid": pid, "host": host}


def try_claim(workdir) -> bool:
  """Claims `workdir` for this process; False when a live process holds it. Checking and
  writing happen under an exclusive lock on the folder's `.claims.lock`, so two processes
  finding the same dead claim cannot both take it over."""
  path = claim_path(workdir)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path.parent / LOCK, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes (or the process dies)
    if path.exists() and holder(workdir) is not None:
      return False
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    os.replace(tmp, path)
    return True


def release(workdir) -> None:
  """Removes this process's claim on `workdir` (another's is left alone)."""
  path = claim_path(workdir)
  try:
    owner = json.loads(path.read_text())
  except (OSError, ValueError):
    return
  if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
    with contextlib.suppress(FileNotFoundError):
      path.unlink()


@contextlib.contextmanager
def claim(workdir):
  """Yields whether this process holds the claim; releases it on the way out."""
  mine = try_claim(workdir)
  try:
    yield mine
  finally:
    if mine:
      release(workdir)
