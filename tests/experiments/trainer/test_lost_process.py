"""The lost-process watch's judge (experiments/trainer/lost_process.py), on a fake
key-value store and clock: who is called lost, when, and who never is. The runs
of real processes killed at several points: test_lost_process_runs.py."""

from __future__ import annotations

import pytest

from experiments.trainer import lost_process
from experiments.trainer.lost_process import EXIT_LOST, LostProcessWatch


class Store:
  """The coordination service's key-value store; `down`: process 0 is gone."""

  def __init__(self):
    self.values, self.down = {}, False

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.down:
      raise RuntimeError("UNAVAILABLE: failed to connect")
    self.values[key] = value

  def key_value_try_get(self, key):
    if self.down:
      raise RuntimeError("UNAVAILABLE: failed to connect")
    return self.values[key]


class Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def _watches(n=3, timeout_s=12.0, workdir="run"):
  store, clock = Store(), Clock()
  watches = [LostProcessWatch(timeout_s=timeout_s, workdir=workdir, command="lngram-exp train",
                              client=store, process_id=i, num_processes=n, clock=clock)
             for i in range(n)]
  return store, clock, watches


def _tick(clock, watches, seconds, alive):
  """`seconds` pass in beats of one second; the processes in `alive` beat."""
  for _ in range(int(seconds)):
    clock.now += 1.0
    for i in alive:
      try:
        watches[i].beat_once()
      except RuntimeError:
        pass


def test_a_silent_peer_is_lost_after_the_timeout_and_not_before():
  _, clock, w = _watches()
  _tick(clock, w, 5, alive=(0, 1, 2))
  _tick(clock, w, 12, alive=(0, 2))   # process 1 killed
  assert w[0].verdict() is None and w[2].verdict() is None   # 12 s: not yet
  _tick(clock, w, 2, alive=(0, 2))   # seen at the next beat: within one beat more
  assert w[0].verdict() == 1 and w[2].verdict() == 1


def test_firing_prints_one_line_and_ends_the_process_through_the_given_hook(capsys):
  """The watch never ends the process itself (library code): it calls the hook the CLI
  gives (`shutdown.end_process_now`) with EXIT_LOST, once, after the line."""
  ended = []
  store, clock = Store(), Clock()
  watch = LostProcessWatch(timeout_s=12.0, workdir="run", command="lngram-exp train",
                           client=store, process_id=0, num_processes=2, clock=clock,
                           end_process=ended.append)
  watch.fire(1)
  watch.fire(1)   # the judge and a settling error: one line, one end
  err = capsys.readouterr().err.strip().splitlines()
  assert ended == [EXIT_LOST] and len(err) == 1 and err[0].startswith("error: process 1 of 2")


def test_a_lost_coordinator_is_named_by_every_survivor():
  store, clock, w = _watches()
  _tick(clock, w, 5, alive=(0, 1, 2))
  store.down = True   # process 0 killed: the store is gone with it
  _tick(clock, w, 13, alive=(1, 2))
  assert w[1].verdict() == 0 and w[2].verdict() == 0
  assert "process 0 of 3 (the coordinator) was lost" in w[1].message(0)


def test_peers_that_end_in_order_or_stop_on_their_own_error_are_not_lost():
  _, clock, w = _watches()
  _tick(clock, w, 5, alive=(0, 1, 2))
  w[1].mark_exited()   # finished a little earlier
  w[2]._stopping = True
  w[2]._mark(lost_process._FAILED)   # stopping on an error of its own
  _tick(clock, w, 30, alive=(0,))
  w[0]._stopping = True   # stopping on the same error: waits, calls nobody lost
  assert w[0].verdict() is None


def test_a_peer_stopped_on_an_error_ends_a_process_that_still_runs():
  """A peer stopped on its own error while this one is stuck (a collective that hangs):
  after the timeout this one ends too, saying why."""
  _, clock, w = _watches(n=2)
  _tick(clock, w, 3, alive=(0, 1))
  w[1]._mark(lost_process._FAILED)
  _tick(clock, w, 14, alive=(0,))
  assert w[0].verdict() == 1 and "stopped on an error" in w[0].message(1)


def test_the_message_names_the_step_every_process_committed(tmp_path):
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  (tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp-12").mkdir()   # a save cut short
  _, _, w = _watches(n=2, workdir=tmp_path)
  line = w[0].message(1)
  assert line.startswith("error: process 1 of 2 was lost (no sign of life for 12 s)")
  assert "resumes from step 4" in line and "\n" not in line
  assert "starts the run again" in _watches(n=2, workdir=tmp_path / "none")[2][0].message(1)


def test_jax_timeouts_are_set_beyond_the_watch_s():
  timeouts = lost_process.runtime_timeouts(10)
  assert all(v > 10 for v in timeouts.values())
  import inspect

  import jax
  if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:
    assert timeouts["heartbeat_timeout_seconds"] > 10
  else:
    pytest.fail("this jax takes no heartbeat timeout: the watch alone bounds the wait")
