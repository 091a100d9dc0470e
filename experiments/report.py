"""Moved: the report is `python -m experiments.tools.report` (DESIGN.md §6)."""

if __name__ == "__main__":
  raise SystemExit("experiments.report moved: run `python -m experiments.tools.report` "
                   "with the same flags")
