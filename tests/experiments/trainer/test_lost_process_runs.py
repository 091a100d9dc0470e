"""A two-process `lngram-exp train` (jax.distributed on localhost, gloo) that loses a
process, and its restart.

Processes are killed (SIGKILL, by tests/experiments/trainer/kill_at.py) before the first
save, as a save begins (while the other process writes its half) and between saves, process
1 or process 0 (the coordinator: the runtime aborts the survivor at once, and the CLI's
parent process, experiments/cli/supervise.py, prints the line instead). Each time the
survivor ends within the watch's timeout with one line naming the lost process and the
step the rerun resumes from, exit EXIT_LOST, no runtime abort; a half-written step is
never committed; the last run resumes from the newest committed step and retrains bit for
bit (every loss the runs logged is equal).
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


SAVE = "experiments.trainer.checkpoint:Checkpointer.save"   # called as a save begins
STEP = "experiments.trainer.loop:_Steps._take"                # called before each step


def _run_pair(tmp_path, tag, env, workdir, victim_id=None, kill_at=(SAVE, 2)):
  """Both processes of one run on a fresh port; `victim_id` is SIGKILLed at the
  `kill_at[1]`-th call of `kill_at[0]` (before it runs). (statuses, logs, seconds from
  the victim's death to the survivor's end)."""
  args = _command(workdir, _free_address())
  logs = [tmp_path / f"{tag}{i}.log" for i in range(2)]
  kill = [str(KILL_AT), kill_at[0], str(kill_at[1])]
  procs = [_start([*(kill if i == victim_id else ["-m", "experiments"]), *args,
                   f"--process_id={i}"], env, logs[i]) for i in range(2)]
  try:
    if victim_id is None:
      texts = [_wait(p, log, 240) for p, log in zip(procs, logs, strict=True)]
      return [p.returncode for p in procs], texts, None
    victim_log = _wait(procs[victim_id], logs[victim_id], 240)
    died = time.monotonic()
    survivor_log = _wait(procs[1 - victim_id], logs[1 - victim_id], TIMEOUT_S + 60)
    took = time.monotonic() - died
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  texts = {victim_id: victim_log, 1 - victim_id: survivor_log}
  return [p.returncode for p in procs], [texts[0], texts[1]], took


def _check_survivor(status, log, took, *, lost: int, resume: str):
  """The survivor ended in bounded time with EXIT_LOST and one line naming the lost
  process and where the rerun resumes; no runtime abort, no traceback."""
  assert status == EXIT_LOST, log[-3000:]
  assert took < TIMEOUT_S + 30, (took, log[-2000:])
  lines = log.strip().splitlines()
  assert lines[-1].startswith(f"error: process {lost} of 2") and resume in lines[-1], lines
  assert sum(line.startswith("error:") for line in lines) == 1, lines
  assert "Check failure" not in log and "Traceback" not in log, log[-3000:]


@pytest.mark.slow
def test_a_lost_process_ends_the_other_and_the_rerun_resumes_bit_for_bit(tmp_path, child_env):
  """One workdir, four runs of both processes (checkpoints at steps 4 and 8 of 10):
  process 1 lost before the first save (nothing committed: the rerun starts again);
  process 1 lost as the step-8 save begins (step 8 never committed half); process 0, the
  coordinator, lost between the saves of the resumed run (the runtime aborts the
  survivor at once: the CLI's parent turns it into the same line); the fourth run
  finishes. Every loss any run logged equals the finished run's."""
  env, workdir = child_env(1), tmp_path / "run"
  statuses, logs, took = _run_pair(tmp_path, "a", env, workdir, victim_id=1,
                                   kill_at=(STEP, 2))
  assert statuses[1] == -9 and "[kill_at] SIGKILL at call 2" in logs[1], logs[1]
  assert committed_steps(workdir) == []
  _check_survivor(statuses[0], logs[0], took, lost=1, resume="starts the run again")
  logged = _losses(workdir)

  statuses, logs, took = _run_pair(tmp_path, "b", env, workdir, victim_id=1)
  assert statuses[1] == -9 and "[kill_at] SIGKILL at call 2" in logs[1], logs[1]
  committed = committed_steps(workdir)
  assert 8 not in committed and committed in ([], [4]), committed   # step 8: never half
  resume = "resumes from step 4" if committed else "starts the run again"
  _check_survivor(statuses[0], logs[0], took, lost=1, resume=resume)
  first = _losses(workdir)
  assert set(first) >= set(range(1, 9)), first

  statuses, logs, took = _run_pair(tmp_path, "c", env, workdir, victim_id=0,
                                   kill_at=(STEP, 2))
  assert statuses[0] == -9, logs[0]
  assert committed_steps(workdir) == committed
  _check_survivor(statuses[1], logs[1], took, lost=0, resume=resume)
  assert "(the coordinator) was lost" in logs[1]

  statuses, logs, _ = _run_pair(tmp_path, "d", env, workdir)
  assert statuses == [0, 0], "\n".join(log[-2000:] for log in logs)
  last = _losses(workdir)
  assert sorted(last) == list(range(1, 11))
  assert {s: last[s] for s in first} == first   # bit for bit, the retrained steps too
  assert {s: last[s] for s in logged} == logged
