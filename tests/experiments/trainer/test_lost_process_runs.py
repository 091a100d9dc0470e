"""A two-process `lngram-exp train` (jax.distributed on localhost, gloo) that loses a
process, and its restart.

Process 1 is killed (SIGKILL, by tests/experiments/trainer/kill_at.py) as the step-8
save begins, while process 0 writes its half: the survivor ends within the watch's
timeout with one line naming process 1 and the step the rerun resumes from, exit
EXIT_LOST, no runtime abort; the half-written step is never committed, and the
restart of both processes resumes from the newest committed step and retrains
bit for bit (every loss both runs logged is equal).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.trainer.lost_process import EXIT_LOST, committed_steps

ROOT = Path(__file__).resolve().parents[3]
KILL_AT = Path(__file__).with_name("kill_at.py")
TIMEOUT_S = 10


def _command(workdir, address, steps=10):
  return ["train", "--config=experiments/configs/lm_lngram.py:smoke", f"--workdir={workdir}",
          f"--config.train.steps={steps}", "--config.train.ckpt_every=4",
          "--config.train.eval_every=100", "--config.train.progress=False",
          "--config.mesh.data=2", f"--coordinator={address}", "--num_processes=2",
          f"--lost_process_timeout={TIMEOUT_S}"]


def _start(args, env, log: Path):
  """A child writing into the file `log` (a pipe left unread could stall it, and with it
  the other process, in a collective)."""
  with open(log, "w") as out:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT, text=True)


def _wait(process, log: Path, timeout: float) -> str:
  try:
    process.wait(timeout=timeout)
  finally:
    if process.poll() is None:
      process.kill()
  return log.read_text()


def _free_address() -> str:
  """Another free localhost port: the first coordinator's may still be held."""
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return f"127.0.0.1:{s.getsockname()[1]}"


def _losses(workdir) -> dict:
  rows = [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.mark.slow
def test_a_process_lost_during_a_save_ends_the_other_and_the_rerun_resumes(
    tmp_path, child_env, local_address):
  env = child_env(1)
  workdir = tmp_path / "run"
  args = _command(workdir, local_address)
  logs = [tmp_path / f"p{i}.log" for i in range(2)]
  survivor = _start(["-m", "experiments", *args, "--process_id=0"], env, logs[0])
  victim = _start([str(KILL_AT), "experiments.trainer.checkpoint:Checkpointer.save", "2",
                   *args, "--process_id=1"], env, logs[1])
  try:
    victim_log = _wait(victim, logs[1], 240)
    died = time.monotonic()
    survivor_log = _wait(survivor, logs[0], TIMEOUT_S + 60)
    ended = time.monotonic()
  finally:
    for p in (survivor, victim):
      if p.poll() is None:
        p.kill()
  assert victim.returncode == -9 and "[kill_at] SIGKILL at call 2" in victim_log, victim_log
  assert survivor.returncode == EXIT_LOST, survivor_log[-3000:]
  assert ended - died < TIMEOUT_S + 30, (ended - died, survivor_log[-2000:])
  lines = survivor_log.strip().splitlines()
  committed = committed_steps(workdir)
  assert 8 not in committed and committed in ([], [4]), committed   # step 8: never half
  resume = "resumes from step 4" if committed else "starts the run again"
  assert lines[-1].startswith("error: process 1 of 2 was lost") and resume in lines[-1], lines
  assert sum(line.startswith("error:") for line in lines) == 1, lines
  assert "Check failure" not in survivor_log and "Traceback" not in survivor_log
  before = _losses(workdir)
  assert set(before) >= set(range(1, 9)), before

  address = _free_address()
  logs = [tmp_path / f"rerun{i}.log" for i in range(2)]
  rerun = [_start(["-m", "experiments", *_command(workdir, address), f"--process_id={i}"],
                  env, logs[i]) for i in range(2)]
  try:
    logs = [_wait(p, log, 240) for p, log in zip(rerun, logs, strict=True)]
  finally:
    for p in rerun:
      if p.poll() is None:
        p.kill()
  assert [p.returncode for p in rerun] == [0, 0], "\n".join(log[-2000:] for log in logs)
  after = _losses(workdir)
  assert sorted(after) == list(range(1, 11))
  assert {s: after[s] for s in before} == before   # bit for bit, the retrained steps too
