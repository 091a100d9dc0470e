"""Claim files: several processes on one machine share a run queue without a fixed split.

    with claim(workdir) as mine:
      if mine: train(workdir)

A claim is `<workdir>.claim` beside the run directory, holding the claimer's pid, host,
boot id and process start time, written under a lock on the folder. A claim whose process
has died on this host (a queue killed with SIGKILL or SIGTERM leaves its file; after a
reboot its pid may belong to another process, which the boot id and start time tell) is
taken over; a claim from another host always counts as live, since its process cannot be
checked from here: remove such a file by hand once that process is gone.
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


def _boot_id() -> str | None:
  try:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
  except OSError:
    return None


def _start_time(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (Linux /proc), else None."""
  try:
    stat = Path(f"/proc/{pid}/stat").read_text()
  except OSError:
    return None
  return stat.rsplit(")", 1)[1].split()[19]   # field 22; the name may hold spaces


def _identity(pid: int) -> dict:
  return {"pid": pid, "host": socket.gethostname(), "boot": _boot_id(),
          "start": _start_time(pid)}


def _alive(owner: dict) -> bool:
  """The claimer still runs: same boot, its pid alive, and (where /proc tells) the same
  process, not a later one that reuses the pid."""
  pid = int(owner["pid"])
  if owner.get("boot") and _boot_id() and owner["boot"] != _boot_id():
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # another user's live process
    pass
  start = _start_time(pid)
  return not (owner.get("start") and start and owner["start"] != start)


def holder(workdir) -> dict | None:
  """{"pid", "host", ...} of the live claim on `workdir`, or None (no claim, or a dead one)."""
  path = claim_path(workdir)
  try:
    owner = json.loads(path.read_text())
    int(owner["pid"]), str(owner["host"])
  except (OSError, ValueError, KeyError, TypeError):   # none, or unreadable (claims are
    return None                                        # written whole): nobody holds it
  if owner["host"] == socket.gethostname() and not _alive(owner):
    return None
  return owner


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
    tmp.write_text(json.dumps(_identity(os.getpid())))
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
