"""The parent of a multi-process `train` (experiments/cli/supervise.py): which command
lines it runs, and what it shows of a child the runtime aborted. The processes
themselves: tests/experiments/trainer/test_lost_process_runs.py."""

from __future__ import annotations

import signal
import subprocess
import sys

from experiments.cli import supervise
from experiments.trainer.lost_process import EXIT_LOST

# A survivor's stderr when the coordinator was killed (jax 0.10.2 on CPU, shortened).
ABORTED = [
    "12:00:01 process 1 of 2: 1 of 2 devices\n",
    "E1207 23:56:57.690376   29443 coordination_service_agent.cc:289] Polled an error "
    "from coordination service (this can be an error from this or another task).\n",
    "F1207 23:56:57.690521   29443 client.h:80] Terminating process because the JAX "
    "distributed service detected fatal errors. This most likely indicates that another "
    "task died; see the other task logs for more details. absl::Status: UNAVAILABLE: "
    "Failed to send RPC to coordination service. Either the leader task was "
    "preempted/died/restarted unexpectedly or this task is experiencing network issues.\n",
    "*** Check failure stack trace: ***\n",
    "    @     0x7f3e13c40634  absl::log_internal::LogMessage::SendToLog()\n",
]


def test_only_a_multi_process_train_gets_a_parent():
  train = ["lngram-exp", "train", "--config=c.py", "--workdir=w"]
  assert supervise.needed([*train, "--coordinator=h:1", "--num_processes=2"], environ={})
  assert supervise.needed(train, environ={"JAX_COORDINATOR_ADDRESS": "h:1"})
  assert not supervise.needed(train, environ={})
  assert not supervise.needed(["lngram-exp", "eval", "--coordinator=h:1"], environ={})
  assert not supervise.needed([*train, "--coordinator=h:1", "--help"], environ={})
  assert not supervise.needed([*train, "--coordinator=h:1"],
                              environ={supervise.SUPERVISED_ENV: "1"})


def test_the_abort_is_held_back_and_the_lines_before_it_pass():
  lines = supervise.AbortFilter()
  shown = [out for line in ABORTED for out in lines.feed(line)]
  assert shown == ABORTED[:1]   # the runtime's error line, the fatal line, the trace: kept off
  assert lines.fatal == ABORTED[2] and lines.coordinator_lost
  assert lines.flush() == []


def test_runtime_error_lines_without_an_abort_are_shown():
  lines = supervise.AbortFilter()
  assert lines.feed(ABORTED[1]) == []
  assert lines.feed("step 3\n") == [ABORTED[1], "step 3\n"]
  assert lines.feed(ABORTED[1]) == [] and lines.flush() == [ABORTED[1]]
  assert lines.fatal is None and not lines.coordinator_lost


def test_the_line_names_the_coordinator_and_the_resume(tmp_path):
  (tmp_path / "checkpoints" / "4").mkdir(parents=True)
  argv = ["lngram-exp", "train", f"--workdir={tmp_path}", "--coordinator=h0:1234",
          "--num_processes=2", "--process_id=1"]
  line = supervise.abort_line(argv, coordinator_lost=True)
  assert line.startswith("error: process 0 of 2 (the coordinator) was lost (its "
                         "coordination service at h0:1234 stopped answering); process 1 stops")
  assert "resumes from step 4" in line and "\n" not in line
  other = supervise.abort_line(argv, coordinator_lost=False)
  assert other.startswith("error: the coordination service stopped this process")


def test_a_child_aborted_by_the_runtime_ends_in_one_line(tmp_path, monkeypatch, capfd):
  """run_supervised on a stand-in child that prints the runtime's abort and dies of
  SIGABRT: the parent shows the lines before it, then the one line, and exits EXIT_LOST;
  a child that ends otherwise keeps its status."""
  script = tmp_path / "child.py"
  script.write_text("import os, signal, sys\n"
                    f"sys.stderr.writelines({ABORTED!r}); sys.stderr.flush()\n"
                    "os.kill(os.getpid(), signal.SIGABRT)\n")
  real = subprocess.Popen
  monkeypatch.setattr(supervise.subprocess, "Popen",
                      lambda cmd, **kw: real([sys.executable, str(script)], **kw))
  argv = ["lngram-exp", "train", f"--workdir={tmp_path}", "--coordinator=h0:1",
          "--num_processes=2", "--process_id=1"]
  assert supervise.run_supervised(argv) == EXIT_LOST
  err = capfd.readouterr().err
  assert err.startswith(ABORTED[0]) and "Check failure" not in err and "E1207" not in err
  assert err.strip().splitlines()[-1].startswith("error: process 0 of 2 (the coordinator)")

  script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
  assert supervise.run_supervised(argv) == 128 + signal.SIGTERM
  script.write_text("import sys\nprint('error: a config mistake', file=sys.stderr)\n"
                    "sys.exit(2)\n")
  assert supervise.run_supervised(argv) == 2
  assert capfd.readouterr().err == "error: a config mistake\n"
