"""`python -m experiments.tools.reproduce list | run | analyze | record | declared |
export-corpus` (the package docstring, experiments/tools/reproduce/__init__.py, describes
them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.tools.reproduce import records as run_records
from experiments.tools.reproduce.analyses import analyze
from experiments.tools.reproduce.design import (
  ROOT,
  SMOKE_ROOT,
  TRAINED_LAST,
  Run,
  export_corpus,
  plan,
  preps,
  records_root,
  run_dir,
)
from experiments.tools.reproduce.queue import (
  parse_shard,
  queue_done,
  record_all,
  run_queue,
  select,
  training_order,
)
from experiments.tools.reproduce.state import difference_line, finished, recorded, status
from experiments.tools.reproduce.timing import (
  DEADLINE_MARGIN,
  expected_analysis_s,
  expected_train_s,
  parse_until,
  speed_factor,
)


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m experiments.tools.reproduce",
      description="The Lngram v2 paper's comparisons at small scale, paired by seed, in two "
                  "settings, and PVM's long-answer rerun (`pydoc experiments.tools.reproduce`).")
  parser.add_argument("action",
                      choices=("list", "run", "analyze", "record", "declared",
                               "export-corpus"))
  parser.add_argument("--only", default=None, help="comma-separated settings")
  parser.add_argument("--max_runs", type=int, default=None, help="stop after this many runs")
  parser.add_argument("--until", default=None,
                      help="run: +MINUTES or an ISO date-time; no run is started that its "
                           "arm's recorded training time (and with --analyze, its analyses) "
                           "says would end after it")
  parser.add_argument("--shard", default=None, help="run: I/K, every K-th run from the I-th")
  parser.add_argument("--claim", action="store_true",
                      help="run: take the next run no other process has claimed (several "
                           "processes on one machine share the queue)")
  parser.add_argument("--smoke", action="store_true", help="the smoke sizes, under --root")
  parser.add_argument("--root", default=None, help="default runs/repro (smoke: runs/repro_smoke)")
  parser.add_argument("--analyze", action="store_true",
                      help="run: after each run, the analyses `analyze` would give it")
  parser.add_argument("--force", action="store_true", help="analyze: redo written analyses")
  parser.add_argument("--dry_run", action="store_true", help="analyze: print, do not run")
  parser.add_argument("--out", default=None, help="export-corpus: the folder")
  parser.add_argument("--max_files", type=int, default=0, help="export-corpus: only the first")
  ns = parser.parse_args(argv)
  if ns.action == "export-corpus":
    if not ns.out:
      raise SystemExit("error: export-corpus needs --out")
    return export_corpus(Path(ns.out), ns.max_files)
  if ns.action == "analyze":
    return analyze(force=ns.force, dry_run=ns.dry_run)
  if ns.action == "declared":   # the records' root: the report's
    from experiments.tools.reproduce import declared
    return declared.main(Path(ns.root) if ns.root else None)
  root = Path(ns.root) if ns.root else (SMOKE_ROOT if ns.smoke else ROOT)
  runs = select(plan(), ns.only)
  if ns.action == "record":
    return record_all(runs, root)
  if ns.action == "list":
    return list_queue(runs, root, ns.smoke)
  if ns.claim and ns.shard:
    raise SystemExit("error: --claim and --shard split the queue two ways; use one")
  return run_queue(runs, root, smoke=ns.smoke, max_runs=ns.max_runs,
                   shard=parse_shard(ns.shard), claim=ns.claim, then_analyze=ns.analyze,
                   until=parse_until(ns.until))


def list_queue(runs: list[Run], root: Path, smoke: bool = False) -> int:
  """`list`: the preparations, then a line per run (done / part / todo / stale and its
  command; a recorded run without its checkpoint here says so, and why the queue trains
  it again if it does), then a summary: the counts and the training left by the
  recorded times at this machine's speed (`expected_train_s`, one core a run), and the
  analyses left (`expected_analysis_s`)."""
  if any(r.experiment == "tokens" for r in runs):
    for prep in preps(root, smoke):
      print(("done  " if Path(prep.marker).exists() else "todo  ") + " ".join(prep.command))
  for experiment in dict.fromkeys(r.experiment for r in runs):
    if experiment in TRAINED_LAST:
      print(f"note  {experiment}: {TRAINED_LAST[experiment]}")
  by_key = {r.key: r for r in plan()}
  order = training_order(runs, by_key)
  done = queue_done(order, by_key, root)
  starts_from = {}
  for run in order:
    if run.after is not None and run.key not in done:
      starts_from.setdefault(run.after, []).append(run.key)
  counts: dict[str, int] = {}
  left_s, analyses_s, unknown, again = 0.0, 0.0, [], []
  factor = speed_factor(root)
  for run in runs:
    state = status(run, root)
    counts[state] = counts.get(state, 0) + 1
    note = ""
    if state == "done" and not finished(run, root):
      note = "   # recorded; no checkpoint here"
      if run.key not in done:
        again.append(run)
        users = starts_from.get(run.key)
        note += ("; trained again first: " + ", ".join(users) + " start from it" if users
                 else "; trained again first")
    if state == "done" and recorded(run, root):   # trained again here: still its record?
      compared, first = run_records.first_difference(run_dir(run, root),
                                                     run_dir(run, records_root(root)))
      differs = difference_line(compared, first)
      if differs:
        note += ("; " if note else "   # ") + f"DIFFERS: {differs}"
      elif compared and not finished(run, root):
        note += f"; equal to its record over the {compared} steps logged here"
    expected = None
    if state in ("part", "todo") or run in again:
      expected = expected_train_s(run, root, factor)
      if expected is None:
        unknown.append(run.key)
      else:
        left_s += expected
        note += ("; " if note else "   # ") + f"~{expected / 60:.0f} min"
    print(f"{state:6s}" + " ".join(run.command(root, smoke)) + note)
    if state != "stale":
      analyses_s += expected_analysis_s(run, root, factor)
  summary = ", ".join(f"{counts[s]} {s}" for s in ("done", "part", "todo", "stale")
                      if counts.get(s))
  line = f"queue: {summary} of {len(runs)} runs"
  if again:
    line += f" ({len(again)} done to train again for the runs that start from them)"
  line += (f"; ~{left_s / 3600:.1f} core-hours of training left by the recorded times "
           f"(x{factor:.2f} for this machine's speed, x{DEADLINE_MARGIN} for "
           "start-up, evaluation and checkpoints; one core a run)")
  if unknown:
    line += f", not counting {len(unknown)} runs with no recorded time to go by"
  if analyses_s:
    line += f"; ~{analyses_s / 3600:.1f} more for the analyses `run --analyze` gives them"
  print(line)
  return 0
