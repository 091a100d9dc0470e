"""Claim files, and the claim-based queue of `experiments.tools.reproduce run --claim`."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.tools import reproduce
from experiments.tools.reproduce import claims


@pytest.fixture
def other_process():
  """A live process of this host that is not the test's (its pid holds claims)."""
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
  yield proc.pid
  proc.kill()
  proc.wait()


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def _hold(workdir, pid, host=None):
  path = claims.claim_path(workdir)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname()}))


def test_a_claim_is_exclusive_while_its_process_lives(tmp_path, other_process):
  run = tmp_path / "bytes" / "a_s0"
  assert claims.holder(run) is None and claims.try_claim(run)
  assert claims.holder(run)["pid"] == claims.os.getpid()
  assert not claims.try_claim(run)            # held (by this very process)
  claims.release(run)
  assert not claims.claim_path(run).exists()
  _hold(run, other_process)
  assert not claims.try_claim(run)
  claims.release(run)                         # another's claim is left alone
  assert claims.holder(run)["pid"] == other_process
  _hold(run, other_process, host="elsewhere")  # another host: cannot be checked, counts
  assert not claims.try_claim(run)


def test_dead_and_unreadable_claims_are_taken_over(tmp_path):
  run = tmp_path / "a_s0"
  _hold(run, _dead_pid())
  assert claims.holder(run) is None
  with claims.claim(run) as mine:
    assert mine and claims.holder(run)["pid"] == claims.os.getpid()
  assert not claims.claim_path(run).exists()   # released on the way out
  claims.claim_path(run).write_text("{")
  assert claims.try_claim(run)


def test_a_reused_pid_or_another_boot_does_not_hold_a_claim(tmp_path, other_process):
  run = tmp_path / "a_s0"
  me = claims._identity(other_process)
  claims.claim_path(run).write_text(json.dumps(me))
  assert claims.holder(run)["pid"] == other_process
  if me["start"] is None or me["boot"] is None:
    pytest.skip("no /proc here: only the pid is checked")
  # The same pid, started at another time: a later process that reuses the pid.
  claims.claim_path(run).write_text(json.dumps(dict(me, start=str(int(me["start"]) - 1))))
  assert claims.holder(run) is None
  claims.claim_path(run).write_text(json.dumps(dict(me, boot="another-boot")))
  assert claims.holder(run) is None and claims.try_claim(run)


def test_the_claiming_queue_skips_held_runs_and_waits_for_a_start(tmp_path, monkeypatch,
                                                                   other_process, capsys):
  by_key = {r.key: r for r in reproduce.plan()}
  base, inserted, pkm = (by_key[k] for k in ("bytes/baseline_s0", "bytes/inserted_low_s0",
                                            "bytes/pkm_s0"))
  _hold(reproduce.run_dir(base, tmp_path), other_process)   # another process trains it
  calls = []
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)

  def other_finishes(_):
    workdir = reproduce.run_dir(base, tmp_path)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / reproduce.STAMP).write_text(json.dumps({"design": reproduce.DESIGN}))
    (workdir / "metrics.jsonl").write_text(json.dumps(
        {"step": reproduce.STEPS, "eval/bits_per_byte": 2.0}) + "\n")
    claims.claim_path(workdir).unlink()

  monkeypatch.setattr(time, "sleep", other_finishes)
  assert reproduce.run_queue([base, inserted, pkm], tmp_path, claim=True, poll_s=0) == 0
  trained = [next(a for a in c if a.startswith("--workdir=")) for c in calls]
  # pkm first (the baseline is held), then the insertion once its baseline is done.
  assert trained == [f"--workdir={tmp_path}/bytes/pkm_s0",
                     f"--workdir={tmp_path}/bytes/inserted_low_s0"]
  assert "wait: bytes/inserted_low_s0 start from runs another process trains" in \
      capsys.readouterr().out
  assert not any(p.name.endswith(".claim") for p in (tmp_path / "bytes").iterdir())


def test_the_claiming_queue_stops_at_a_failure_and_frees_the_run(tmp_path, monkeypatch):
  pkm = next(r for r in reproduce.plan() if r.key == "bytes/pkm_s0")
  monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: 3)
  assert reproduce.run_queue([pkm], tmp_path, claim=True) == 3
  assert claims.holder(reproduce.run_dir(pkm, tmp_path)) is None
  with pytest.raises(SystemExit, match="--claim and --shard"):
    reproduce.main(["run", "--claim", "--shard=0/2", f"--root={tmp_path}"])


def test_run_analyze_gives_each_trained_run_its_analyses(tmp_path, monkeypatch):
  by_key = {r.key: r for r in reproduce.plan()}
  runs = [by_key["bytes/baseline_s0"], by_key["bytes/lngram_r16_s0"]]
  calls = []

  def call(cmd, **kw):   # a training "run" writes its final evaluation row
    calls.append(cmd[3:5])
    workdir = next((a.split("=", 1)[1] for a in cmd if a.startswith("--workdir=")), None)
    if cmd[3] == "train":
      (Path(workdir) / "metrics.jsonl").write_text(json.dumps(
          {"step": reproduce.STEPS, "eval/bits_per_byte": 2.0}) + "\n")
    return 0

  monkeypatch.setattr(subprocess, "call", call)
  assert reproduce.run_queue(runs, tmp_path, claim=True, then_analyze=True) == 0
  r16 = f"--workdir={tmp_path}/bytes/lngram_r16_s0"
  assert calls == [["train", f"--config=experiments/configs/{runs[0].config}"],
                   ["train", f"--config=experiments/configs/{runs[1].config}"],
                   ["analyze", r16]]
