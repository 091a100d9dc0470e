"""The logging every `lngram-exp` command runs under."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings


@contextlib.contextmanager
def command_logging():
  """While a command runs: our progress lines at INFO on stderr, a warning as one line,
  orbax/absl chatter only from WARNING up; all put back after (a test or a notebook may
  run a command in its own process)."""
  from absl import logging as absl_logging
  ours = logging.getLogger("experiments")
  saved = (ours.level, ours.propagate, absl_logging.get_verbosity(), warnings.formatwarning)
  handler = logging.StreamHandler(sys.stderr)
  # On a terminal, erase the progress bar being redrawn; it reappears on the next step.
  prefix = "\r\x1b[K" if sys.stderr.isatty() else ""
  handler.setFormatter(logging.Formatter(prefix + "%(asctime)s %(message)s", "%H:%M:%S"))
  absl_logging.set_verbosity(absl_logging.WARNING)
  ours.setLevel(logging.INFO)
  ours.addHandler(handler)
  ours.propagate = False
  warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"
  try:
    yield
  finally:
    ours.removeHandler(handler)
    ours.setLevel(saved[0])
    ours.propagate = saved[1]
    absl_logging.set_verbosity(saved[2])
    warnings.formatwarning = saved[3]
