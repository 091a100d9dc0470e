"""Markdown tables for experiments/RESULTS.md, generated from run directories.

    python -m experiments.tools.report.tables vlm-accuracy LABEL=RUN_DIR [LABEL=RUN_DIR ...]

`vlm-accuracy` reads each run's `accuracy_by_length.json` (written by every VLM
stage and by `lngram-exp analyze --which=accuracy`) and prints two tables: the
counting-answer accuracy and the item accuracy, overall and per length group.
Several run directories under one label (LABEL=RUN1,RUN2,...) are seeds of one
arm: the cell is then mean ± sample std, with the seed count in the label.
Tables are never typed by hand; this is where they come from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.tools.report.collect import mean_std

GROUPS = ("very_short", "short", "medium", "long")
_GROUP_TITLES = ("very short", "short", "medium", "long")


def read_accuracy(run_dir) -> dict:
  """The `accuracy_by_length.json` of one run directory."""
  path = Path(run_dir) / "accuracy_by_length.json"
  if not path.is_file():
    raise FileNotFoundError(f"{path} does not exist: has the run finished its evaluation?")
  return json.loads(path.read_text())


def accuracy_rows(arms: list[tuple[str, list[str]]], key: str) -> list[str]:
  """Markdown rows (header first) of `key` ("answer_acc" or "item_acc") per arm."""
  lines = ["| model | overall | " + " | ".join(_GROUP_TITLES) + " |",
           "| --- | --- | " + " | ".join("---" for _ in GROUPS) + " |"]
  for label, runs in arms:
    results = [read_accuracy(r) for r in runs]
    cells = [mean_std([res["overall"][key] for res in results], 3)]
    for group in GROUPS:
      values = [res["groups"][group][key] for res in results]
      cells.append("n/a" if any(v is None for v in values) else mean_std(values, 3))
    seeds = f", {len(runs)} seeds" if len(runs) > 1 else ""
    lines.append(f"| {label}{seeds} | " + " | ".join(cells) + " |")
  return lines


def parse_arms(specs: list[str]) -> list[tuple[str, list[str]]]:
  arms = []
  for spec in specs:
    label, sep, runs = spec.partition("=")
    if not sep or not label or not runs:
      raise SystemExit(f"error: {spec!r} is not LABEL=RUN_DIR[,RUN_DIR...]")
    arms.append((label, runs.split(",")))
  return arms


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="python -m experiments.tools.report.tables",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("table", choices=("vlm-accuracy",))
  parser.add_argument("arms", nargs="+", metavar="LABEL=RUN_DIR[,RUN_DIR...]")
  args = parser.parse_args(argv)
  arms = parse_arms(args.arms)
  print("Answer accuracy:\n")
  print("\n".join(accuracy_rows(arms, "answer_acc")))
  print("\nItem accuracy:\n")
  print("\n".join(accuracy_rows(arms, "item_acc")))


if __name__ == "__main__":
  main()
