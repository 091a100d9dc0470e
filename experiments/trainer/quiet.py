"""Keeping orbax's logging, warnings and asyncio noise off the terminal, scoped.

Nothing here changes process-wide state beyond the `with` block that asked
for it: the hooks and handlers it touches are put back on exit.

absl (which orbax logs through) calls `logging.basicConfig()` on its first
record whenever the root logger has no handler, which would add a stderr
handler to the user's root logger and make their own later
`logging.basicConfig(level=...)` a no-op. While orbax runs under
`absl_root_guard()`, the root logger holds a NullHandler (only if it had no
handler of its own), removed again when the last guard ends.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import warnings
from pathlib import Path

# orbax logs through absl (the "absl" python logger) and its own module loggers.
NOISY_LOGGERS = ("absl", "orbax", "jax._src.distributed", "asyncio", "tensorstore")
_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

_guard_lock = threading.Lock()
_guard_depth = 0
_guard_handler: logging.Handler | None = None


def hold_absl_root() -> None:
  """Starts a guard (see the module doc); pair with `release_absl_root`."""
  global _guard_depth, _guard_handler
  with _guard_lock:
    _guard_depth += 1
    if _guard_depth == 1 and not logging.root.handlers:
      _guard_handler = logging.NullHandler()
      logging.root.addHandler(_guard_handler)


def release_absl_root() -> None:
  global _guard_depth, _guard_handler
  with _guard_lock:
    _guard_depth = max(_guard_depth - 1, 0)
    if _guard_depth == 0 and _guard_handler is not None:
      logging.root.removeHandler(_guard_handler)
      _guard_handler = None


@contextlib.contextmanager
def absl_root_guard():
  hold_absl_root()
  try:
    yield
  finally:
    release_absl_root()


def file_handler(log_file: Path | None, *, delay: bool = False) -> logging.Handler | None:
  """A formatted FileHandler on `log_file`, or None (no file, or it cannot be opened)."""
  if log_file is None or not Path(log_file).parent.is_dir():
    return None
  try:
    handler = logging.FileHandler(log_file, delay=delay)
  except OSError:
    return None
  handler.setFormatter(logging.Formatter(_FORMAT))
  return handler


@contextlib.contextmanager
def quiet_logging(log_file: Path | None):
  """orbax's (absl's), asyncio's and tensorstore's log records go to `log_file` (if
  given and it can be opened), else nowhere, within the block; yields the handler."""
  handler = file_handler(log_file, delay=True)   # the file appears only if something is logged
  saved = []
  for name in NOISY_LOGGERS:
    logger = logging.getLogger(name)
    saved.append((logger, logger.propagate, list(logger.handlers)))
    logger.propagate = False
    logger.handlers = [handler] if handler is not None else [logging.NullHandler()]
  try:
    with absl_root_guard():
      yield handler
  finally:
    for logger, propagate, handlers in saved:
      logger.propagate, logger.handlers = propagate, handlers
    if handler is not None:
      handler.close()


@contextlib.contextmanager
def quiet_reads(log_file: Path | None):
  """Keeps orbax/asyncio logging and Python warnings (the never-awaited
  coroutines of an abandoned read) off the terminal while a checkpoint is read;
  their text goes to `log_file` (if given and it can be opened), else nowhere.
  The caller reports failures itself, in one line."""
  with quiet_logging(log_file) as handler:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      yield handler
      gc.collect()   # abandoned coroutines warn when collected: here, into the log
    if handler is not None and caught:
      with contextlib.suppress(OSError), open(handler.baseFilename, "a") as f:
        f.writelines(f"warning: {w.category.__name__}: {w.message}\n" for w in caught)


class OrbaxLogRoute:
  """While a Checkpointer with a log file is open, orbax's own log records
  (through absl: errors of background save threads, with tracebacks) go to that
  file instead of the terminal; the Checkpointer reports failures itself."""

  _LOGGERS = ("absl", "orbax")

  def __init__(self, handler: logging.Handler):
    self.handler = handler
    self.saved = []
    for name in self._LOGGERS:
      logger = logging.getLogger(name)
      self.saved.append((logger, logger.propagate))
      logger.addHandler(handler)
      logger.propagate = False

  @classmethod
  def install(cls, log_file: Path | None) -> OrbaxLogRoute | None:
    handler = file_handler(log_file, delay=True)
    return cls(handler) if handler is not None else None

  def remove(self) -> None:
    for logger, propagate in self.saved:
      logger.removeHandler(self.handler)
      logger.propagate = propagate
    self.handler.close()
