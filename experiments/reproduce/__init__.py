"""Moved: the reproduction queue is `python -m experiments.tools.reproduce` (DESIGN.md §6)."""
