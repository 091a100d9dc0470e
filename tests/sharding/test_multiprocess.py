"""Two processes on localhost with jax.distributed (gloo CPU collectives), 4 host
devices each, one 8-device mesh: a sharded forward + backward equals the
unsharded layer computed in this process."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sharding_cases import assert_close

from experiments.bench.multihost import reference_step

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _child_env() -> dict[str, str]:
  env = dict(os.environ)
  # The suite's other XLA flags stay (tests/conftest.py): compiled with other codegen
  # flags, the children would round differently from this process's reference.
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
  env["XLA_FLAGS"] = " ".join([*flags, "--xla_force_host_platform_device_count=4"])
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  return env


@pytest.mark.slow  # two subprocesses, each importing jax and compiling the layer
def test_two_processes_equal_one(tmp_path):
  out = tmp_path / "sharded.npz"
  address = f"127.0.0.1:{_free_port()}"
  procs = []
  for process_id in range(2):
    cmd = [sys.executable, "-m", "experiments.bench.multihost", "--coordinator", address,
           "--num-processes", "2", "--process-id", str(process_id), "--mode", "route_parallel",
           "--data", "1", "--seq", "2", "--timeout", "120", "--out", str(out)]
    log = open(tmp_path / f"process{process_id}.log", "w")  # closed in `finally`
    procs.append((subprocess.Popen(cmd, cwd=ROOT, env=_child_env(), stdout=log,
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
