"""Moved: the tables are `python -m experiments.tools.report.tables` (DESIGN.md §6)."""

if __name__ == "__main__":
  raise SystemExit("experiments.tables moved: run `python -m experiments.tools.report.tables` "
                   "with the same arguments")
