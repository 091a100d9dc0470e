"""Ending the threads of a failed orbax save now, not at orbax's timeout.

Each thread of an asynchronous orbax save first waits for a signal ("the step
directory exists") that a save which failed early never sends; it would wait
for orbax's coordination timeout (minutes), and Python waits for it at exit.
"""

from __future__ import annotations

import contextlib
import inspect
import threading

import jax


def end_abandoned_save_threads() -> None:
  """Cancels the orbax save threads still waiting, then wakes them with their
  signal: they return without writing.
  Single-process only (several processes share the signals); best effort over
  orbax's internals: without them the threads end at their timeout as before."""
  if jax.process_count() > 1:
    return
  try:
    from orbax.checkpoint._src.futures import future as orbax_future
  except ImportError:
    return
  waiting = [t for t in threading.enumerate()
             if isinstance(t, getattr(orbax_future, "_SignalingThread", ())) and t.is_alive()]
  for thread in waiting:
    with contextlib.suppress(Exception):
      thread.cancel()
      orbax_future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
  for thread in waiting:
    # Thread.join itself: orbax's join raises CancelledError for a cancelled thread.
    threading.Thread.join(thread, timeout=10)
    # Their coroutines never ran; closed, they do not warn "never awaited" at exit.
    for coroutine in _coroutines_in(getattr(thread, "_target", None)):
      coroutine.close()


def _coroutines_in(function, depth: int = 3) -> list:
  """The coroutine objects a function's closure holds (nested closures included)."""
  found = []
  for cell in getattr(function, "__closure__", None) or ():
    with contextlib.suppress(ValueError):   # an empty cell
      value = cell.cell_contents
      if inspect.iscoroutine(value):
        found.append(value)
      elif callable(value) and depth > 1:
        found += _coroutines_in(value, depth - 1)
  return found
