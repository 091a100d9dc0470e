"""The training queue: the order runs train in, which count as done, and `run_queue`,
which prepares the token data and trains the runs one after another (a fixed shard of
them, or with claims shared by several processes), recording each."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from experiments.tools.reproduce import claims
from experiments.tools.reproduce.analyses import analysed, analyze, wanted_analyses
from experiments.tools.reproduce.design import (
  DESIGN,
  EXPERIMENTS,
  SMOKE_TOKEN_VAL_FRACTION,
  STAMP,
  TOKEN_VAL_FRACTION,
  TRAINED_LAST,
  Run,
  plan,
  preps,
  records_root,
  run_dir,
  stamp,
  token_root,
)
from experiments.tools.reproduce.state import (
  cpu_signature,
  cpus_seen,
  diverged,
  finished,
  prepared_val_fraction,
  recorded,
  refresh_record,
  stale,
  xla_flags_seen,
)
from experiments.tools.reproduce.timing import past_deadline, speed_factor


def select(runs, only: str | None):
  if not only:
    return runs
  wanted = set(only.split(","))
  unknown = wanted - {r.experiment for r in runs}
  if unknown:
    raise SystemExit(f"error: unknown settings {sorted(unknown)}; use {', '.join(EXPERIMENTS)}")
  return [r for r in runs if r.experiment in wanted]


def training_order(runs: list[Run], by_key: dict[str, Run]) -> list[Run]:
  """The runs to train for `runs`, seed 0 of every arm first, then seed 1, ..., so that a
  cut queue leaves every arm with some result and the first pairs complete early; the
  longest experiments (TRAINED_LAST) after the rest; a run that starts from another
  (insertion, Stage I) right after it, so that its checkpoint is used on the machine
  that trains it: run directories do not outlive the machine, and a recorded run whose
  checkpoint is needed again (`queue_done`) would otherwise be rebuilt at the queue's head
  and wait, unused, behind the rest of its seed."""
  ranked = sorted(runs, key=lambda r: (r.experiment in TRAINED_LAST, r.seed,
                                       r.after is not None))
  keys = {r.key for r in ranked}
  starts_from: dict[str, list[Run]] = {}
  for run in ranked:
    if run.after in keys:
      starts_from.setdefault(run.after, []).append(run)
  order, seen = [], set()

  def emit(run: Run) -> None:
    target = by_key[run.same_as] if run.same_as else run
    if target.key not in seen:
      seen.add(target.key)
      order.append(target)
    for child in starts_from.get(run.key, ()):
      emit(child)

  for run in ranked:
    if run.after not in keys:
      emit(run)
  return order


def parse_shard(spec: str | None) -> tuple[int, int]:
  if not spec:
    return 0, 1
  try:
    i, k = (int(x) for x in spec.split("/"))
  except ValueError:
    raise SystemExit(f"error: --shard={spec!r} must be I/K with 0 <= I < K") from None
  if not 0 <= i < k:
    raise SystemExit(f"error: --shard={spec!r} must be I/K with 0 <= I < K")
  return i, k


def _call(command, log_path: Path, cache_dir: Path | None = None) -> int:
  log_path.parent.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ)
  if cache_dir is not None:
    # Every seed of an arm compiles the same programs: a persistent cache compiles them once.
    # The cached executable is the one XLA would build, so results are unchanged.
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir.absolute()))
  with open(log_path, "a") as log:
    return subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _prepare(root: Path, smoke: bool) -> int:
  """The token setting's preparation steps not yet done; under a lock, so that processes
  started together prepare once (the others wait, then find the markers)."""
  token_root(root).mkdir(parents=True, exist_ok=True)
  with open(token_root(root) / ".prepare.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    split = prepared_val_fraction(root)
    wanted = SMOKE_TOKEN_VAL_FRACTION if smoke else TOKEN_VAL_FRACTION
    if split is not None and split != wanted:
      print(f"error: the token data under {token_root(root)} holds a validation split of "
            f"{split:g} (this design: {wanted:g}); move its tok/ and data/ away to prepare "
            "them again", flush=True)
      return 2
    for prep in preps(root, smoke):
      if Path(prep.marker).exists():
        continue
      print(f"prepare {prep.key}: {' '.join(prep.command)}", flush=True)
      code = _call([sys.executable, *prep.command[1:]],
                   token_root(root) / f"{prep.key.split('/')[1]}.log")
      if code != 0:
        print(f"prepare {prep.key} exited {code}; see its log", flush=True)
        return code
  return 0


def _train(run: Run, root: Path, smoke: bool) -> int:
  workdir = run_dir(run, root)
  workdir.mkdir(parents=True, exist_ok=True)
  flags = sorted({*xla_flags_seen(workdir), os.environ.get("XLA_FLAGS", "")})
  cpus = sorted({*cpus_seen(workdir), cpu_signature()})
  (workdir / STAMP).write_text(json.dumps(stamp(run, smoke) | {"xla_flags": flags,
                                                               "cpus": cpus}) + "\n")
  command = run.command(root, smoke)
  print(f"run {run.key}: {' '.join(command)}", flush=True)
  code = _call([sys.executable, "-m", "experiments", *command[1:]],
               workdir.parent / f"{workdir.name}.log", cache_dir=root / ".xla_cache")
  if code != 0:
    print(f"run {run.key} exited {code}; see its log", flush=True)
  return code


def queue_done(order: list[Run], by_key: dict[str, Run], root: Path,
               then_analyze: bool = False) -> set[str]:
  """The keys the queue counts as done: finished under `root`, or recorded, except a
  recorded run whose checkpoint is needed here: a run of `order` that trains starts from
  it (also one that trains again itself, so the chain is followed: a recorded insertion
  trained again for its analyses needs its recorded baseline's checkpoint), or (with
  `then_analyze`) its record lacks analyses it is given. Such a run trains again (a
  record mirrors its run's latest output)."""
  here = {key for key, run in by_key.items() if finished(run, root)}
  kept = {key for key, run in by_key.items() if key not in here and recorded(run, root)}
  trains = [run.key for run in order if run.key not in here | kept]
  if then_analyze:
    trains += [run.key for run in order if run.key in kept and lacks_analyses(run, root)]
  need = {key for key in trains if key in kept}
  while trains:
    after = by_key[trains.pop()].after
    if after in kept and after not in need:
      need.add(after)
      trains.append(after)
  return here | (kept - need)


def lacks_analyses(run: Run, root: Path) -> bool:
  """The run's record lacks analyses the design gives it (`run --analyze` trains it
  again for them)."""
  return recorded(run, root) and not all(analysed(run, n, root)
                                         for n in wanted_analyses(run)[0])


def _blocked_line(run: Run, root: Path, done: set[str], by_key: dict[str, Run],
                  then_analyze: bool = False) -> str | None:
  """Why `run` cannot start now, as the queue's skip line: its directory is an older
  design's, the run it starts from is not done, or that run was trained again and
  differs from its record; None when nothing blocks it. A recorded run trained again
  only for the analyses its record lacks (`then_analyze`) may start from a base that
  differs from its record: it is then a twin, whose analyses its record takes and names
  as a twin's (records.add_twin_analyses), while the record keeps its numbers."""
  if stale(run, root):
    return (f"skip {run.key}: {run_dir(run, root)} is stale (no {STAMP} of design {DESIGN}: "
            "an older design's run); move it away to train this run")
  if run.after is not None and run.after not in done:
    return f"skip {run.key}: waits for {run.after}"
  differs = run.after is not None and diverged(by_key[run.after], root)
  if differs and then_analyze and lacks_analyses(run, root):
    return None
  if differs:
    return (f"skip {run.key}: {run.after} {differs} Its recorded arms started from the "
            "record's checkpoint, so this one would not pair with them.")
  return None


def run_queue(runs: list[Run], root: Path, *, smoke: bool = False,
              max_runs: int | None = None, shard: tuple[int, int] = (0, 1),
              claim: bool = False, poll_s: float = 60.0, then_analyze: bool = False,
              until: float | None = None) -> int:
  """Trains the unfinished `runs` in `training_order`: with `claim`, each takes the first
  run no live process has claimed (`experiments/tools/reproduce/claims.py`), waiting while a run it needs
  is trained elsewhere; else every K-th run from the I-th of `shard`. With `then_analyze`,
  each trained run then gets the analyses `analyze` would give it. With `until` (seconds
  since the epoch), a run expected to end after it (with its analyses, if it is given
  them) is not started (`past_deadline`)."""
  by_key = {r.key: r for r in plan()}
  if any(r.experiment == "tokens" for r in runs):
    code = _prepare(root, smoke)
    if code != 0:
      return code
  if claim:
    return _claiming_queue(runs, root, by_key, smoke, max_runs, poll_s, then_analyze, until)
  order = training_order(runs, by_key)
  done = queue_done(order, by_key, root, then_analyze)
  started = 0
  factor = speed_factor(root) if until is not None else None
  i, k = shard
  for n, run in enumerate(order):
    if n % k != i or run.key in done:
      continue
    blocked = _blocked_line(run, root, done, by_key, then_analyze)
    if blocked:
      print(blocked, flush=True)
      continue
    if max_runs is not None and started >= max_runs:
      break
    late = past_deadline(run, root, until, factor, then_analyze)
    if late:
      print(late, flush=True)
      continue
    started += 1
    code = _train(run, root, smoke)
    if code != 0:
      return code
    refresh_record(run, root)
    done.add(run.key)
    if then_analyze:
      analyze(root=root, keys={run.key})
  return 0


def _claiming_queue(runs, root: Path, by_key, smoke: bool, max_runs, poll_s: float,
                    then_analyze: bool, until: float | None = None) -> int:
  """The claim-based queue: rescans the order after every run (so seed-major priority
  holds across processes) and ends when nothing is left it could train."""
  order = training_order(runs, by_key)
  started, said = 0, set()
  trained = set()   # exited 0 here: never started twice by this process, counted as done

  def say(key, line):
    if (key, line) not in said:
      said.add((key, line))
      print(line, flush=True)

  while True:
    done = trained | queue_done(order, by_key, root, then_analyze)
    factor = speed_factor(root) if until is not None else None   # once a scan
    waiting, took = [], False
    for run in order:
      if run.key in done:
        continue
      if (run.after is not None and run.after not in done and not stale(run, root)
          and claims.holder(run_dir(by_key[run.after], root)) is not None):
        waiting.append(run.key)   # another process trains what it starts from
        continue
      blocked = _blocked_line(run, root, done, by_key, then_analyze)
      if blocked:
        say(run.key, blocked)
        continue
      if max_runs is not None and started >= max_runs:
        return 0
      late = past_deadline(run, root, until, factor, then_analyze)
      if late:
        say(run.key, late)
        continue
      with claims.claim(run_dir(run, root)) as mine:
        if not mine or finished(run, root):   # another process has it, or just finished it
          continue
        started += 1
        code = _train(run, root, smoke)
        if code != 0:
          return code
        refresh_record(run, root)
        trained.add(run.key)
      if then_analyze:   # a failed analysis is reported and left for `analyze`
        analyze(root=root, keys={run.key})
      took = True
      break
    if took:
      continue
    if not waiting:
      return 0
    say(tuple(waiting), f"wait: {', '.join(waiting)} start from runs another process trains")
    time.sleep(poll_s)


def record_all(runs: list[Run], root: Path) -> int:
  """Writes or refreshes the record of every run of `runs` finished under `root`."""
  for run in runs:
    if finished(run, root):
      refresh_record(run, root)
  kept = sum(recorded(run, root) for run in runs)
  print(f"{kept} of {len(runs)} runs recorded under {records_root(root)}", flush=True)
  return 0
