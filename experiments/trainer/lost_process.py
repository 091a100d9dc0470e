"""A multi-process run that loses a process ends in bounded time, in one line.

    watch = LostProcessWatch(timeout_s=120, workdir=..., command=...)   after
    watch.start()                                   jax.distributed.initialize
    watch.settle(error)      a survivor's error: the lost process's line, if one was lost

Why: when a process dies (a host lost, `kill -9`), JAX's runtime treats it late and
hard. A collective with the dead peer fails at once on CPU (gloo) or hangs (NCCL);
exiting then blocks in jax.distributed's shutdown barrier; and after its heartbeat
timeout the coordination service aborts every survivor (SIGABRT, a C++ stack trace,
dozens of log lines), whichever process it was.

So each process runs two daemon threads. The beater increments its own counter in
the coordination service's key-value store every `timeout_s / 12` seconds; the judge
reads the others' counters (in the beater's replies) and, when a peer's counter has
not moved for `timeout_s`, or the coordination service (process 0) has not answered
for `timeout_s`, writes one line naming the lost process and the command that
resumes, and ends the process with `EXIT_LOST` through `end_process`, which the CLI
gives (`experiments.cli.shutdown.end_process_now`: an immediate exit, because the
runtime's shutdown would block on the dead peer; library code never ends the process). A live process's counter moves whatever its main
thread does (compiling, saving, waiting in a collective). JAX's own heartbeat
timeout is set longer (`runtime_timeouts`), so the judge speaks first.

A process that exits in order marks its counter "exited": a peer finishing a few
seconds earlier, or one that stopped on an error of its own (which it printed), is
never called lost. The resume: every process committed its shards before process 0
renamed a step into place (orbax's commit), so the newest step directory is one
every process finished; a step a kill interrupted is a temporary folder, skipped.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from pathlib import Path

EXIT_LOST = 75   # EX_TEMPFAIL: the run can be resumed by running it again
DEFAULT_TIMEOUT_S = 120
_KEY = "lngram_alive"
_EXITED = "exited"   # ended in order (done, or an error it printed after `settle`)
_FAILED = "failed"   # stopping on an error of its own (in `settle`)


def runtime_timeouts(timeout_s: float) -> dict:
  """jax.distributed.initialize's heartbeat and shutdown timeouts (the arguments this
  jax takes), longer than the judge's, so that a lost process is reported by it."""
  import inspect

  import jax
  wanted = {"heartbeat_timeout_seconds": int(timeout_s) + 60,
            "shutdown_timeout_seconds": int(timeout_s) + 120}
  params = inspect.signature(jax.distributed.initialize).parameters
  return {k: v for k, v in wanted.items() if k in params}


def committed_steps(workdir) -> list[int]:
  """The step directories under `<workdir>/checkpoints` (orbax renames a step there
  only when every process has written its part)."""
  folder = Path(workdir) / "checkpoints"
  try:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and p.is_dir())
  except OSError:
    return []


def lost_process_line(lost: int | None, *, me: int, n: int, workdir, command: str,
                      what: str) -> str:
  """The one line a survivor ends with: who was lost (None: not known) and `what` befell
  it, and how the run resumes (the newest step every process committed)."""
  steps = committed_steps(workdir)
  resume = (f"it resumes from step {steps[-1]}, the newest checkpoint every process "
            f"committed ({Path(workdir) / 'checkpoints' / str(steps[-1])})" if steps
            else "no checkpoint was committed, so it starts the run again")
  if lost is None:
    who = "the coordination service"
  else:
    who = f"process {lost} of {n}" + (" (the coordinator)" if lost == 0 else "")
  return (f"error: {who} {what}; process {me} stops. Run the same command on every "
          f"host again ({command}): {resume}.")


class LostProcessWatch:
  """The beater and the judge of one process (module docstring)."""

  def __init__(self, *, timeout_s: float, workdir, command: str, client=None,
               process_id: int | None = None, num_processes: int | None = None,
               clock=time.monotonic, end_process=None):
    if client is None:
      from jax._src import distributed  # the client orbax's multihost code reads too
      client = distributed.global_state.client
      process_id = distributed.global_state.process_id
      num_processes = distributed.global_state.num_processes
    self.client, self.me, self.n = client, int(process_id), int(num_processes)
    self.timeout_s, self.workdir, self.command = float(timeout_s), workdir, command
    self.interval_s = max(self.timeout_s / 12, 0.05)
    self.clock = clock
    # Ends the process with a status, now (the CLI's); None: the line alone is printed
    # (tests, or a caller that ends the process its own way).
    self.end_process = end_process
    now = clock()
    self.contact = now                       # the service's last answer
    self.seen = {p: (None, now) for p in range(self.n) if p != self.me}   # counter, when
    self.exited: set[int] = set()
    self.failed: dict[int, float] = {}   # peer -> when it was first seen stopping
    self.lost: int | None = None
    self._stop = threading.Event()
    self._stopping = False   # this process is in `settle`
    self._marked: str | None = None
    self._beats = 0

  def start(self) -> LostProcessWatch:
    for target in (self._beat, self._judge):
      threading.Thread(target=target, name=f"lost-process-{target.__name__}",
                       daemon=True).start()
    atexit.register(self.mark_exited)   # runs before jax's shutdown (registered earlier)
    return self

  # -- the beater: this process's counter, the peers' counters --------------------------

  def beat_once(self) -> None:
    self._beats += 1
    own = self._marked or str(self._beats)   # a mark stays: the counter stops with it
    self.client.key_value_set(f"{_KEY}/{self.me}", own, allow_overwrite=True)
    for peer in self.seen:
      try:
        value = self.client.key_value_try_get(f"{_KEY}/{peer}")
      except Exception:   # not written yet: the peer is still starting
        continue
      if value == _EXITED:
        self.exited.add(peer)
      elif value == _FAILED:
        self.failed.setdefault(peer, self.clock())
      elif value != self.seen[peer][0]:
        self.seen[peer] = (value, self.clock())
    self.contact = self.clock()

  def _beat(self) -> None:
    while not self._stop.is_set():
      try:
        self.beat_once()
      except Exception:   # the service unreachable: the judge counts the silence
        pass
      self._stop.wait(self.interval_s)

  # -- the judge ------------------------------------------------------------------------

  def verdict(self) -> int | None:
    """The process found lost now, or None: silent for `timeout_s`, or stopped on an
    error `timeout_s` ago while this one still runs (a collective that hangs)."""
    now = self.clock()
    ended = self.exited | set(self.failed)
    if self.me != 0 and 0 not in ended and now - self.contact > self.timeout_s:
      return 0   # the coordination service lives in process 0
    if now - self.contact > self.timeout_s:
      return None   # this process is cut off, not its peers (process 0 decides)
    late = [p for p, (_, when) in self.seen.items()
            if p not in ended and now - when > self.timeout_s]
    late += [p for p, when in self.failed.items()
             if p not in self.exited and not self._stopping and now - when > self.timeout_s]
    return min(late) if late else None

  def message(self, lost: int) -> str:
    what = ("stopped on an error (its own output says which)" if lost in self.failed
            else f"was lost (no sign of life for {self.timeout_s:g} s)")
    return lost_process_line(lost, me=self.me, n=self.n, workdir=self.workdir,
                             command=self.command, what=what)

  def _judge(self) -> None:
    while not self._stop.wait(self.interval_s / 2):
      lost = self.verdict()
      if lost is not None:
        self.fire(lost)

  def fire(self, lost: int) -> None:
    if self.lost is not None:   # the judge and the runtime's callback: one line
      return
    self.lost = lost
    try:
      sys.stdout.flush()
      print(self.message(lost), file=sys.stderr, flush=True)
    finally:
      if self.end_process is not None:
        self.end_process(EXIT_LOST)

  # -- orderly ends ---------------------------------------------------------------------

  def settle(self, error: BaseException) -> None:
    """Called with the error a run stopped on: if a peer is lost (a collective with it
    failed), waits for the judge, which ends the process with the lost process's line;
    returns when every peer stopped in order too (an error of the run itself) or after
    `timeout_s`."""
    del error
    self._stopping = True
    self._mark(_FAILED)   # stopping: the peers wait for this mark, not call it lost
    deadline = self.clock() + self.timeout_s + 2 * self.interval_s
    while self.clock() < deadline and len(self.exited | set(self.failed)) < len(self.seen):
      time.sleep(self.interval_s / 4)

  def mark_exited(self) -> None:
    """This process ends in order: never report it lost. The judge keeps watching, so
    that a shutdown blocked by a lost peer still ends."""
    self._mark(_EXITED)

  def _mark(self, value: str) -> None:
    self._marked = value
    try:
      self.client.key_value_set(f"{_KEY}/{self.me}", value, allow_overwrite=True)
    except Exception:   # the service gone: the peers' judges count the silence
      pass
