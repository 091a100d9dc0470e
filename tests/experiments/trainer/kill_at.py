"""`python kill_at.py MODULE:QUALNAME N lngram-exp-args...`: runs the CLI, and SIGKILLs this
process at the N-th call of that function (before it runs): a host lost at a known point,
for the multi-process tests."""

import importlib
import os
import signal
import sys


def main():
  where, n, *args = sys.argv[1:]
  module_name, qualname = where.split(":")
  owner = importlib.import_module(module_name)
  *path, name = qualname.split(".")
  for part in path:
    owner = getattr(owner, part)
  original, calls = getattr(owner, name), [0]

  def wrapped(*a, **k):
    calls[0] += 1
    if calls[0] == int(n):
      print(f"[kill_at] SIGKILL at call {n} of {where}", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    return original(*a, **k)

  setattr(owner, name, wrapped)
  # The CLI in this process, not in a supervised child (where the patch would not be).
  os.environ["LNGRAM_EXP_SUPERVISED"] = "1"
  from experiments.cli import main as cli_main
  sys.argv = ["lngram-exp", *args]
  cli_main()


if __name__ == "__main__":
  main()
