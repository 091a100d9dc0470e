"""Runs `lngram-exp` (as `python -m experiments`) in a subprocess, for the CLI tests."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, timeout=300, cwd=ROOT):
  """The finished process (stdout/stderr as text) of `python -m experiments *args`."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
  return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def refusal(*args, timeout=300) -> str:
  """The one stderr line of a `lngram-exp *args` that must be refused (exit status 2)."""
  done = run_cli(*args, timeout=timeout)
  error = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(error) == 1, (done.returncode, done.stderr)
  return error[0]
