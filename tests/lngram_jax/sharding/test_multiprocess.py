"""Two processes on localhost with jax.distributed (gloo CPU collectives), 4 host
devices each, one 8-device mesh: a sharded forward + backward equals the
unsharded layer computed in this process."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sharding_cases import assert_close

from experiments.tools.bench.multihost import reference_step

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


@pytest.mark.slow  # two subprocesses, each importing jax and compiling the layer
def test_two_processes_equal_one(tmp_path, child_env, local_address):
  out = tmp_path / "sharded.npz"
  procs = []
  for process_id in range(2):
    cmd = [sys.executable, "-m", "experiments.tools.bench.multihost", "--coordinator", local_address,
           "--num-processes", "2", "--process-id", str(process_id), "--mode", "route_parallel",
           "--data", "1", "--seq", "2", "--timeout", "120", "--out", str(out)]
    log = open(tmp_path / f"process{process_id}.log", "w")  # closed in `finally`
    procs.append((subprocess.Popen(cmd, cwd=ROOT, env=child_env(4), stdout=log,
                                   stderr=subprocess.STDOUT), log))
  try:
    for proc, _ in procs:
      proc.wait(timeout=TIMEOUT_S)
  except subprocess.TimeoutExpired:
    pass
  finally:
    for proc, log in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
      log.close()
  logs = "\n".join((tmp_path / f"process{i}.log").read_text()[-3000:] for i in range(2))
  assert [proc.returncode for proc, _ in procs] == [0, 0], logs
  assert "4 local of 8 devices, mesh {'data': 1, 'seq': 2, 'table': 4}" in logs

  got = dict(np.load(out))
  want = reference_step()
  assert_close(got, want)
