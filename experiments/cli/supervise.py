"""A multi-process `train` runs under a small parent that turns the runtime's abort into one line.

    lngram-exp train ... --coordinator=host0:1234 --num_processes=N --process_id=i
      parent (this module): no jax; forwards SIGINT / SIGTERM; filters the child's stderr
        child: the same command line (`python -m experiments ...`), the run itself

Why a parent: when process 0, the coordinator, dies, every other process's JAX client
finds the coordination service gone at once and ends the process from a C++ thread
(`LOG(FATAL)` in the client's error callback: an abort, a Check failure stack trace,
exit 134). No Python code runs before that, and the jax this project supports offers no
working hook to replace the callback. So the abort is read from outside: the parent
passes the child's stderr through line by line until the runtime's fatal line, keeps
what follows (the stack trace) off the terminal, and when the child then dies of SIGABRT
prints the lost-process line of `experiments.trainer.lost_process` (naming the
coordinator and the step the rerun resumes from) and exits with `EXIT_LOST`, like a
survivor whose watch found a peer lost. Any other end passes through unchanged: the
child's own exit status (a signal as 128 + its number), its output as it was.

The child is started in its own process group so that a Ctrl-C at the terminal reaches
it once, through the parent; SIGTERM from a scheduler is forwarded the same way.
`LNGRAM_EXP_SUPERVISED=1` in the environment runs the command without a parent (the
child has it; so may a launcher that supervises its processes itself).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

SUPERVISED_ENV = "LNGRAM_EXP_SUPERVISED"
# The JAX client's fatal line when the coordination service reports an error; what it
# prints after it (the C++ stack trace, Python's fault handler) is the dying process's.
_FATAL = re.compile(r"^F\d{4} .*(distributed service detected fatal errors|"
                    r"coordination service)")
# The service itself unreachable: the coordinator (process 0, which runs it) is gone.
_SERVICE_GONE = re.compile(r"Failed to send RPC to coordination service|"
                           r"leader task was preempted/died")
# The lines of the runtime that lead up to the fatal one (kept back, shown only if no
# fatal line follows).
_RUNTIME_ERROR = re.compile(r"^E\d{4} .*coordination_service")


def needed(argv: list[str], environ=os.environ) -> bool:
  """Whether `lngram-exp` should run `argv` under a parent: a multi-process `train`
  (`--coordinator` or JAX_COORDINATOR_ADDRESS) that is not already supervised."""
  if len(argv) < 2 or argv[1] != "train" or environ.get(SUPERVISED_ENV) == "1":
    return False
  if {"--help", "-h", "-help", "--helpfull"} & set(argv[2:]):
    return False
  return (any(a == "--coordinator" or a.startswith("--coordinator=") for a in argv[2:])
          or bool(environ.get("JAX_COORDINATOR_ADDRESS")))


def _flag(argv: list[str], name: str, env: str | None = None, default=None):
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return os.environ.get(env, default) if env else default


class AbortFilter:
  """Reads the child's stderr lines: passes them through until the runtime's fatal line,
  holds back the runtime's error lines that precede it, drops everything after it."""

  def __init__(self):
    self.fatal: str | None = None   # the runtime's fatal line, once seen
    self.held: list[str] = []

  def feed(self, line: str) -> list[str]:
    """The lines to show now for one line of the child's stderr."""
    if self.fatal is not None:
      return []
    if _FATAL.match(line):
      self.fatal, self.held = line, []
      return []
    if _RUNTIME_ERROR.match(line):
      self.held.append(line)
      return []
    shown, self.held = [*self.held, line], []
    return shown

  def flush(self) -> list[str]:
    shown, self.held = self.held, []
    return shown

  @property
  def coordinator_lost(self) -> bool:
    return self.fatal is not None and bool(_SERVICE_GONE.search(self.fatal))


def abort_line(argv: list[str], *, coordinator_lost: bool) -> str:
  """The one line for a child the runtime aborted (the lost-process line's words)."""
  from experiments.trainer.lost_process import lost_process_line
  me = int(_flag(argv, "process_id", "JAX_PROCESS_ID", 0))
  n = int(_flag(argv, "num_processes", "JAX_NUM_PROCESSES", 0) or 0)
  workdir = _flag(argv, "workdir", default=".")
  command = f"lngram-exp train ... --workdir={workdir}, each with its --process_id"
  if coordinator_lost:
    address = _flag(argv, "coordinator", "JAX_COORDINATOR_ADDRESS", "?")
    return lost_process_line(0, me=me, n=n, workdir=workdir, command=command,
                             what=f"was lost (its coordination service at {address} "
                                  "stopped answering)")
  return lost_process_line(None, me=me, n=n, workdir=workdir, command=command,
                           what="stopped this process: another process failed (its own "
                                "output says which)")


def run_supervised(argv: list[str]) -> int:
  """Runs `argv` (a `train` command line) as a child process; its exit status, or
  EXIT_LOST with one line when the runtime aborted it for a lost process."""
  from experiments.trainer.lost_process import EXIT_LOST
  env = dict(os.environ, **{SUPERVISED_ENV: "1"})
  child = subprocess.Popen([sys.executable, "-m", "experiments", *argv[1:]], env=env,
                           stderr=subprocess.PIPE, start_new_session=True)
  forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  lines = AbortFilter()
  try:
    for raw in child.stderr:
      _show(lines.feed(raw.decode(errors="replace")))
    status = child.wait()
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    if child.poll() is None:
      child.kill()
  _show(lines.flush())
  if lines.fatal is not None and status == -signal.SIGABRT:
    print(abort_line(argv, coordinator_lost=lines.coordinator_lost),
          file=sys.stderr, flush=True)
    return EXIT_LOST
  return status if status >= 0 else 128 - status


def _show(lines: list[str]) -> None:
  for line in lines:
    sys.stderr.write(line)
  sys.stderr.flush()
