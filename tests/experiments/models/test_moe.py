"""The MoE FFN's suite (moe_suite.py), run in a fresh pytest process.

Late in a long-lived test worker, XLA:CPU (jax 0.10.2) crashed on this suite's MoE
programs three CI runs in a row, in a different test each time: a segfault compiling the
scanned-MoE cached decode, the same loading it from the persistent cache, an abort
loading the MoE train step. The suite passes in a fresh process, so it runs in one; its
own failures are printed here.
"""

import os
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).with_name("moe_suite.py")


def test_the_moe_suite_passes_in_a_fresh_process():
  done = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       str(SUITE)], cwd=Path(__file__).parents[3], env=dict(os.environ),
      capture_output=True, text=True, timeout=1200)
  assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
  assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
