"""How a command-line process ends: Ctrl-C, late asyncio noise, a failed save.

For the CLI's `main` only; a library call (a notebook's `restore()`, `train()`)
never goes through here, so it leaves the process's hooks alone. Everything is
scoped to `cli_noise_filter()`: on exit the hooks and the SIGINT handler are the
caller's again.

  - Ctrl-C is raised as KeyboardInterrupt only where it cannot do harm. Landing
    inside an import, it left a half-initialised nanobind extension (jaxlib), and
    inside an XLA compile, a compilation running on in XLA's thread pool: both
    crashed the interpreter's exit (segmentation fault). Landing inside a
    garbage-collection callback (jax runs one), Python reported it as "Exception
    ignored in ..." and the command ran on. In these places it is delivered
    again a moment later instead. `run_interruptible` then closes the open
    checkpointers, waits for the device work already dispatched, prints one line
    and returns 130; a second Ctrl-C during that clean-up is ignored.
  - After a failed read, orbax's abandoned asyncio work can still report "Event
    loop is closed" from another thread, seconds later, through any of four
    channels: an unraisable exception, an uncaught exception in a thread,
    asyncio's logger, or `sys.excepthook` (tensorstore's C++ threads print a
    failed `call_soon_threadsafe` callback with PyErr_Print, which calls it).
    Those reports, and the "Exception ignored" reports of the failed read's own
    coroutines when they are collected, go to `log_file`, or nowhere. The filter is in
    place for the whole command, not installed after a failure: the reports
    can start while the failing read is still unwinding.
    After a Ctrl-C, what the interrupted read left in asyncio (suspended
    coroutines, tasks with unretrieved errors) is settled before the filter
    ends, so nothing of it prints at the interpreter's exit.
  - A failed save needs nothing here: `Checkpointer.close()` ends its threads.
"""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import gc
import inspect
import logging
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

INTERRUPTED = 130   # the shell's status for "stopped by SIGINT"
_RETRY_S = 0.05


class _Interrupts:
  """The SIGINT handler of a CLI process (see the module doc)."""

  def __init__(self):
    self.stopping = False   # set once KeyboardInterrupt was raised: later ones are ignored
    self.retry: threading.Timer | None = None
    self.last_noise = 0.0   # time.monotonic() of the last late-loop report filtered

  def later(self) -> None:
    if self.retry is None or not self.retry.is_alive():
      self.retry = threading.Timer(_RETRY_S, self._again)
      self.retry.daemon = True
      self.retry.start()

  def _again(self) -> None:
    if not self.stopping:
      _thread.interrupt_main()   # runs `handle` in the main thread, as a real SIGINT

  def handle(self, signum, frame) -> None:
    if self.stopping:
      return
    if _unsafe_to_interrupt(frame):
      return self.later()
    self.stopping = True
    raise KeyboardInterrupt


_interrupts = _Interrupts()


# jax's call into XLA's compiler: interrupted there, the compilation runs on in
# XLA's thread pool and crashed the interpreter's exit (segmentation fault).
_COMPILING = "backend_compile_and_load"


# asyncio's event-loop set-up and tear-down (orbax reads run one per call):
# interrupted there, a half-built loop without its self-pipe reported
# "AttributeError: ... '_ssock'" from its __del__ at exit.
_ASYNCIO_DIR = str(Path(asyncio.__file__).parent)
_LOOP_LIFECYCLE = frozenset({"__init__", "_make_self_pipe", "new_event_loop", "close",
                             "_close_self_pipe", "__del__", "shutdown_asyncgens",
                             "shutdown_default_executor", "_cancel_all_tasks"})


def _unsafe_to_interrupt(frame) -> bool:
  """Whether the main thread is inside an import, a gc callback, an XLA compile or
  the building or closing of an asyncio event loop."""
  callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
  while frame is not None:
    code = frame.f_code
    if (code.co_filename.startswith("<frozen importlib") or code in callbacks
        or code.co_name == _COMPILING
        or (code.co_filename.startswith(_ASYNCIO_DIR) and code.co_name in _LOOP_LIFECYCLE)):
      return True
    frame = frame.f_back
  return False


def _from_asyncio(obj) -> bool:
  """An asyncio object or function (a loop's __del__, say) reporting while unwinding."""
  code = getattr(obj, "__code__", None) or getattr(obj, "cr_code", None)
  module = getattr(type(obj), "__module__", "") or ""
  return ((code is not None and code.co_filename.startswith(_ASYNCIO_DIR))
          or module.startswith("asyncio"))


def _abandoned_orbax_read(obj) -> bool:
  """A coroutine of an orbax read that failed, collected with its error unretrieved."""
  code = getattr(obj, "cr_code", None)
  return code is not None and "orbax" in code.co_filename


def _is_late_loop_noise(exc) -> bool:
  return isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc)


class _LateLoopNoise(logging.Filter):
  """Drops asyncio's logged "Event loop is closed" reports (into the log file)."""

  def __init__(self, note):
    super().__init__()
    self.note = note

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    if _is_late_loop_noise(exc) or "Event loop is closed" in record.getMessage():
      self.note(exc or record.getMessage())
      return False
    return True


@contextlib.contextmanager
def cli_noise_filter(log_file: Path | None = None):
  """Within the block: the late "Event loop is closed" reports of abandoned orbax
  reads go to `log_file` (appended; None: dropped) instead of the terminal, all
  other errors still show, and Ctrl-C is delivered only where it is safe. The
  hooks and the SIGINT handler in place before are restored on exit."""

  def note(exc) -> None:
    _interrupts.last_noise = time.monotonic()
    if log_file is not None:
      with contextlib.suppress(OSError), open(log_file, "a") as f:
        f.write(f"late asyncio report after a failed read: {exc}\n")

  unraisable_hook, thread_hook, except_hook = (sys.unraisablehook, threading.excepthook,
                                               sys.excepthook)

  def unraisable(report):
    if _is_late_loop_noise(report.exc_value) or _abandoned_orbax_read(report.object):
      return note(report.exc_value)
    if _interrupts.stopping and _from_asyncio(report.object):   # unwound by the Ctrl-C
      return note(report.exc_value)
    if report.exc_type is KeyboardInterrupt:   # swallowed where no handler saw it coming
      _interrupts.stopping = False
      return _interrupts.later()
    unraisable_hook(report)

  def thread(args):
    if _is_late_loop_noise(args.exc_value):
      return note(args.exc_value)
    thread_hook(args)

  def uncaught(exc_type, exc_value, exc_tb):
    if _is_late_loop_noise(exc_value):
      return note(exc_value)
    except_hook(exc_type, exc_value, exc_tb)

  main_thread = threading.current_thread() is threading.main_thread()
  previous_sigint = signal.signal(signal.SIGINT, _interrupts.handle) if main_thread else None
  _interrupts.stopping = False
  asyncio_filter = _LateLoopNoise(note)
  asyncio_logger = logging.getLogger("asyncio")
  sys.unraisablehook, threading.excepthook, sys.excepthook = unraisable, thread, uncaught
  asyncio_logger.addFilter(asyncio_filter)
  try:
    yield
  finally:
    asyncio_logger.removeFilter(asyncio_filter)
    sys.unraisablehook, threading.excepthook, sys.excepthook = (unraisable_hook, thread_hook,
                                                                except_hook)
    if main_thread:
      _interrupts.stopping = True   # a retry still pending must not fire after the block
      signal.signal(signal.SIGINT, previous_sigint)


def stop_checkpoint_threads() -> None:
  """Closes the checkpointers still open, newest first (their orbax threads end)."""
  if "experiments.trainer.checkpoint" in sys.modules:
    sys.modules["experiments.trainer.checkpoint"].close_open_checkpointers()


def settle_device_work() -> None:
  """Waits for the device work already dispatched, so the interpreter does not exit
  under computations still running on XLA's threads."""
  jax = sys.modules.get("jax")
  if jax is None:
    return
  with contextlib.suppress(Exception):
    jax.effects_barrier()
  with contextlib.suppress(Exception):
    for array in jax.live_arrays():
      array.block_until_ready()


def end_process_now(status: int) -> None:
  """Ends the process at once with `status`, skipping the interpreter's and the runtime's
  shutdown: what a multi-process run does when a peer is lost
  (`experiments.trainer.lost_process`), whose shutdown barrier would wait on the dead
  peer."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


def run_interruptible(command, *args, **kwargs) -> int:
  """`command(*args, **kwargs)`'s exit status; Ctrl-C -> one line on stderr and 130.

  The checkpointers still open are closed in any case, so no orbax or
  tensorstore thread outlives the command. The CLI's `main`:

    with cli_noise_filter():
      status = run_interruptible(run_main, argv)
    sys.exit(status)
  """
  unwinding = contextlib.ExitStack()
  try:
    return command(*args, **kwargs)
  except KeyboardInterrupt:
    _interrupts.stopping = True
    # The coroutines an interrupted orbax read had made but not yet awaited are
    # collected from here on; their "never awaited" warnings say nothing to the user.
    unwinding.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                            category=RuntimeWarning)
  finally:
    stop_checkpoint_threads()
  with unwinding:
    # Outside the except block, so the interrupted frames are released: what they
    # held (data iterators and their threads, device buffers) is finalised now,
    # while the interpreter is whole, not during its shutdown.
    gc.collect()
    settle_device_work()
    _let_abandoned_reads_report()
    _settle_abandoned_async_work()
  print("interrupted", file=sys.stderr)
  return INTERRUPTED


def _settle_abandoned_async_work() -> None:
  """What the interrupted command left in asyncio, settled here, inside the filter.
  Held to the interpreter's exit (by orbax's event loop, a task, a traceback), each
  piece reported when collected there, past the filter, with a traceback after
  "interrupted":
    - a suspended coroutine of an orbax read: its close raised ("Exception ignored
      in: <coroutine ...>"; orbax turns the GeneratorExit into `Exception(...) from e`);
    - a task or future done with an exception nobody retrieved, the KeyboardInterrupt
      itself when it landed inside a task ("Task exception was never retrieved");
    - a task still pending ("Task was destroyed but it is pending!").
  """
  for obj in gc.get_objects():
    if inspect.iscoroutine(obj):
      if _abandoned_orbax_read(obj) and obj.cr_frame is not None and not obj.cr_running:
        try:
          obj.close()
        except Exception:  # noqa: BLE001 - the read's own error, the one being silenced
          pass
    elif isinstance(obj, asyncio.Future):
      if not obj.done():
        if isinstance(obj, asyncio.Task):
          obj._log_destroy_pending = False
      elif not obj.cancelled():
        obj.exception()   # marks it retrieved


def _let_abandoned_reads_report(quiet_s: float = 0.5, limit_s: float = 3.0) -> None:
  """An interrupted orbax read leaves tensorstore reads in flight that report "Event
  loop is closed" as they finish: wait (inside the filter) until none came for
  `quiet_s`, at most `limit_s`, so that none reaches the terminal after it."""
  if "tensorstore" not in sys.modules:
    return
  start = time.monotonic()
  while time.monotonic() - start < limit_s:
    if time.monotonic() - max(start, _interrupts.last_noise) >= quiet_s:
      return
    time.sleep(0.05)
