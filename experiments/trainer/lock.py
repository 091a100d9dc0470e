"""`WorkdirLock`: one training per run directory (`<workdir>/.lock`); `AnalysisLock`:
one `analyze` per run directory (`<workdir>/.analyze.lock`, the same rules).

The lock file holds JSON {pid, host, started}; it is created atomically
(written to a private file, then hard-linked to `.lock`, which fails if one
exists) and removed when training ends, however it ends. Training touches it at
every checkpoint save (a heartbeat: its mtime).

A lock left behind is stale, and taken over with a warning, when:
  - it was written on this host and its pid is no longer alive (a crash, kill -9);
  - it was written on another host and its heartbeat (mtime) is older than
    `OTHER_HOST_STALE_S` (24 hours): a live training saves far more often
    than that, and we cannot look at another host's processes.
Otherwise a second `train` raises `WorkdirLockedError` saying who holds it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from experiments.trainer.errors import CheckpointError, WorkdirLockedError

log = logging.getLogger("experiments")
LOCK_NAME = ".lock"
OTHER_HOST_STALE_S = 24 * 3600


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:   # alive, owned by someone else
    return True
  return True


class WorkdirNotWritableError(CheckpointError):
  """The run directory cannot be written (read-only, no permission, full)."""


class WorkdirLock:
  """Context manager holding `<workdir>/.lock` for a training run."""

  name = LOCK_NAME
  holder = "training"   # what the error calls the other process
  command = "train"

  def __init__(self, workdir):
    self.path = Path(workdir) / self.name
    self.info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                 "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    self.held = False

  def _read(self) -> dict | None:
    try:
      return json.loads(self.path.read_text())
    except (OSError, ValueError):
      return None

  def _stale(self, holder: dict | None) -> str | None:
    """Why the existing lock is stale, or None if it must be respected."""
    if holder is None:
      return None
    if holder.get("host") == self.info["host"]:
      if not _pid_alive(int(holder.get("pid", -1))):
        return f"process {holder.get('pid')} on this host is no longer running"
      return None
    try:
      age = time.time() - self.path.stat().st_mtime
    except OSError:
      return None
    if age > OTHER_HOST_STALE_S:
      return f"its heartbeat is {age / 3600:.0f} h old (more than {OTHER_HOST_STALE_S // 3600} h)"
    return None

  def _try_create(self) -> bool:
    tmp = self.path.with_name(f"{self.name}.{self.info['pid']}.tmp")
    try:
      tmp.write_text(json.dumps(self.info))
    except OSError as e:
      raise WorkdirNotWritableError(
          f"cannot write in the workdir {self.path.parent} ({e.strerror or e}): "
          f"{self.command} writes its lock and results there. Make it writable"
          + (" or train in another --workdir; `eval` and `sample` only read it."
             if self.command == "train" else ".")) from e
    try:
      os.link(tmp, self.path)
      return True
    except FileExistsError:
      return False
    finally:
      tmp.unlink(missing_ok=True)

  def acquire(self) -> None:
    for _ in range(3):
      if self._try_create():
        self.held = True
        return
      holder = self._read()
      reason = self._stale(holder)
      if reason is None:
        break
      log.warning("taking over the stale lock %s of pid %s on %s (%s).", self.path,
                  holder.get("pid"), holder.get("host"), reason)
      self.path.unlink(missing_ok=True)
    holder = self._read()
    who = (f"pid {holder.get('pid')} on host {holder.get('host')}, started "
           f"{holder.get('started_at', '?')}" if holder else "an unreadable lock file")
    raise WorkdirLockedError(
        f"the workdir {self.path.parent} is in use by another {self.holder} ({who}). Wait "
        f"for it to finish or stop it" + (", or train in a new --workdir"
                                          if self.command == "train" else "")
        + f". If no such {self.holder} runs any more (e.g. it ran on another host that "
        f"crashed), delete {self.path}.")

  def touch(self) -> None:
    """The heartbeat other hosts judge staleness by."""
    if self.held:
      try:
        os.utime(self.path)
      except OSError:
        pass

  def release(self) -> None:
    if not self.held:
      return
    self.held = False
    holder = self._read()
    if holder and (holder.get("pid"), holder.get("host"), holder.get("started")) == (
        self.info["pid"], self.info["host"], self.info["started"]):
      self.path.unlink(missing_ok=True)

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()
    return False


class AnalysisLock(WorkdirLock):
  """Context manager holding `<workdir>/.analyze.lock`: two `analyze` runs on one run
  directory would interleave their result files. A running `train` does not take
  it (analyses read a checkpoint, which training never rewrites)."""

  name = ".analyze.lock"
  holder = "analyze"
  command = "analyze"
