"""Run control around the training loop: the stop signal, the profiler window, the clock.

    StopOnSignal  the first SIGTERM / SIGINT becomes a stop request (the loop
                  finishes the step, saves and returns); a second Ctrl-C aborts
    Profile       `train.profile_steps=(a, b)`: a JAX profiler trace of steps a..b
    Clock         tokens/s and the step-time split between logged steps
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from pathlib import Path

import jax

log = logging.getLogger("experiments")


class Clock:
  """Tokens/s and the step-time split between logged steps (wall time, on fetched metrics).

  time/step_s: wall seconds per step; time/data_s: of which waiting for the batch
  (and the task's host-side `prepare`); time/sync_s: of which fetching metrics to
  the host (the device catching up). The rest is dispatch, logging, evaluation and
  checkpoints.
  """

  def __init__(self, step):
    self.step, self.time = step, time.perf_counter()
    self.data_s = self.sync_s = 0.0

  def rate(self, step, tokens_per_step):
    """(tokens/s, {time/...}) since the last call; restarts the interval."""
    now = time.perf_counter()
    steps = max(step - self.step, 1)
    wall = max(now - self.time, 1e-9)
    split = {"time/step_s": wall / steps, "time/data_s": self.data_s / steps,
             "time/sync_s": self.sync_s / steps}
    rate = (step - self.step) * tokens_per_step / wall
    self.step, self.time, self.data_s, self.sync_s = step, now, 0.0, 0.0
    return rate, split


class Profile:
  """`train.profile_steps=(a, b)`: a JAX profiler trace of steps a..b in <workdir>/profile
  (open it with TensorBoard's profile plugin or Perfetto)."""

  def __init__(self, steps, workdir: Path):
    steps = tuple(int(s) for s in (steps or ()))
    if steps and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
      raise ValueError(f"train.profile_steps={steps} must be (first, last) with "
                       "1 <= first <= last.")
    self.steps, self.directory, self.active = steps, workdir / "profile", False

  def before(self, step):
    if self.steps and step == self.steps[0] and not self.active:
      jax.profiler.start_trace(str(self.directory))
      self.active = True

  def after(self, step, metrics):
    if self.active and step >= self.steps[1]:
      jax.block_until_ready(metrics)
      self.stop()

  def stop(self):
    if self.active:
      jax.profiler.stop_trace()
      self.active = False
      log.info("profile of steps %d..%d written to %s", *self.steps, self.directory)


class StopOnSignal(contextlib.AbstractContextManager):
  """Turns the first SIGTERM/SIGINT into a stop request; a second Ctrl-C aborts."""

  def __init__(self):
    self.requested, self.signal, self._previous = False, None, {}

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested, self.signal = True, signal.Signals(signum).name

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False
