"""Moved: the benchmarks are `python -m experiments.tools.bench.<name>` (DESIGN.md §6).

`python -m experiments.bench.<name>` imports this package first, while `sys.argv[0]` is
still "-m"; it then stops in one line naming the new command instead of "No module named".
"""

import sys

if sys.argv[:1] == ["-m"]:
  raise SystemExit("experiments.bench moved: run `python -m experiments.tools.bench.<name>` "
                   "with the same arguments")
