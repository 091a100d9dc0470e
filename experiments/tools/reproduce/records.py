"""Run records: the small files of a finished run that its results are read from, kept
where the repository keeps them.

A run directory holds checkpoints and TensorBoard logs and stays out of version control;
what a report reads from it is a few small files. `write_record(workdir, record_dir)`
copies those into `record_dir` (the same names, `analysis/` included) and adds
`provenance.json` (the corpus content hash, which the run directory keeps in a 100 KB
manifest, and the time the run spent, `train_seconds`). A record is then read exactly
like the run directory it came from, so a result outlives the machine that trained it.
Files a run does not write (an LM run has no `metrics.json`, only a VLM base an
`attention_decay.json`) are simply absent from its record.

Imports nothing from the experiment stack: `experiments.tools.reproduce` maps its runs to
record directories, `experiments.tools.report.collect` reads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# What the reproduction report reads from a run directory.
FILES = ("repro.json",            # the queue's stamp: design version, steps
         "metrics.jsonl",         # an LM run's metrics rows, its validation curve
         "eval_per_doc.json",     # the final evaluation per validation document
         "metrics.json",          # a VLM run's stage history and final evaluation
         "attention_decay.json")  # a VLM base's visual attention against position
ANALYSIS_GLOB = "analysis/*.json"  # `lngram-exp analyze` results of an LM run
PROVENANCE = "provenance.json"
# The analyses a kept record took from a retrain that differs from it (`add_twin_analyses`).
TWIN = "twin.json"
# The training numbers of a run compared bit for bit with another's (a twin's base in TWIN).
TRAINING_KEYS = ("train/loss", "train/grad_norm", "train/param_norm")
MANIFEST = "corpus_manifest.json"   # a byte run's corpus (experiments/data/corpus.py)
TOKEN_DATA = "token_data.json"      # a token run's shards and tokenizer (data/tokens/run.py)


def _metrics_rows(workdir: Path) -> list[dict]:
  rows = []
  try:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
  except OSError:
    return rows
  for line in lines:
    try:
      row = json.loads(line)
    except ValueError:   # a line cut by a kill
      continue
    if isinstance(row, dict) and "step" in row:
      rows.append(row)
  return rows


# The numbers of a metrics row that a run trained again must reproduce exactly (same
# config, seed, data, CPU and XLA flags: training is bit-deterministic), and its
# validation bits (BITS_KEYS). Timings differ.
REPRODUCED_KEYS = ("train/loss", "train/grad_norm", "train/param_norm", "eval/loss")
# The validation bits: per byte on byte data, per token on token data; a token run
# recorded before `eval/bits_per_token` existed holds its bits per token under
# `eval/bits_per_byte`, so a row's bits are whichever of the two it holds.
BITS_KEYS = ("eval/bits_per_token", "eval/bits_per_byte")


def _bits(row: dict) -> tuple[str, float] | None:
  """(name, value) of a metrics row's validation bits (BITS_KEYS), None without any."""
  return next(((key, row[key]) for key in BITS_KEYS if key in row), None)


def first_difference(workdir: Path, record_dir: Path) -> tuple[int, dict | None]:
  """How a run trained again compares with its record, over the steps both logged:
  (steps compared, None) when every REPRODUCED_KEYS value and the validation bits (under
  either name, BITS_KEYS) agree bit for bit, else
  (steps compared up to it, {"step", "key", "run", "record"}) at the first that differs.
  A step's rows merge; one logged twice (a resumed run repeats the steps after its last
  checkpoint) counts with its last values."""
  def by_step(rows):   # a step's train and evaluation rows merge; a repeat overrides
    merged: dict[int, dict] = {}
    for row in rows:
      merged.setdefault(row["step"], {}).update(row)
    return merged

  ours = by_step(_metrics_rows(Path(workdir)))
  theirs = by_step(_metrics_rows(Path(record_dir)))
  compared = 0
  for step in sorted(set(ours) & set(theirs)):
    for key in REPRODUCED_KEYS:
      if key in ours[step] and key in theirs[step] and ours[step][key] != theirs[step][key]:
        return compared, {"step": step, "key": key, "run": ours[step][key],
                          "record": theirs[step][key]}
    run_bits, record_bits = _bits(ours[step]), _bits(theirs[step])
    if run_bits and record_bits and run_bits[1] != record_bits[1]:
      return compared, {"step": step, "key": run_bits[0], "run": run_bits[1],
                        "record": record_bits[1]}
    compared += 1
  return compared, None


def train_seconds(workdir: Path) -> float | None:
  """The time a run takes, measured so that it describes the run, not the machine's day.

  An LM run: its steady step time, the median over the logged intervals of each
  interval's mean step time, times its last logged step. The median ignores what lands
  in a few intervals: compilation (the first), a pause (a queue stopped while tests run
  stops the clock of no interval: the whole pause lands in one), a resume (a step logged
  twice is one interval); evaluations and checkpoint writes are left out.

  A VLM run (it writes `metrics.json`): the same intervals integrated under a rolling
  median (`_rolling_steady_seconds`), since its curriculum's phases differ ~12x in step
  cost and one median would price every step at the slow phase's rate, plus its final
  decoding evaluation (`eval_seconds`). Its own `train_seconds` counts only the last
  segment of a resumed run, so it is the fallback when no step time is logged.

  None when nothing is logged."""
  workdir = Path(workdir)
  per_step = _step_times(workdir)
  try:
    done = json.loads((workdir / "metrics.json").read_text())
    steady = _rolling_steady_seconds(per_step) if per_step else float(done["train_seconds"])
    return steady + float(done.get("eval_seconds") or 0.0)
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    pass
  if not per_step:
    return None
  return _median(list(per_step.values())) * max(per_step)


ROLLING_INTERVALS = 5   # each side: a window of 11 logged intervals


def _rolling_steady_seconds(per_step: dict[int, float]) -> float:
  """Sum over the logged intervals of (steps in the interval) x (the median step time of
  the intervals within ROLLING_INTERVALS of it): follows a change of step cost between
  phases, ignores an interval that holds a compilation or a pause."""
  steps = sorted(per_step)
  times = [per_step[s] for s in steps]
  total, previous = 0.0, 0
  for i, step in enumerate(steps):
    window = times[max(0, i - ROLLING_INTERVALS): i + ROLLING_INTERVALS + 1]
    total += _median(window) * (step - previous)
    previous = step
  return total


def _step_times(workdir: Path) -> dict[int, float]:
  """{logged step: the mean step time of the interval it ends}, a step logged twice
  (a resume) once."""
  return {int(r["step"]): float(r["time/step_s"]) for r in _metrics_rows(Path(workdir))
          if "time/step_s" in r}


def _median(values: list[float]) -> float:
  times = sorted(values)
  middle = len(times) // 2
  return times[middle] if len(times) % 2 else 0.5 * (times[middle - 1] + times[middle])


def step_time(workdir: Path, min_intervals: int = 3) -> float | None:
  """A run's steady step time so far: the median over its logged intervals (as in
  `train_seconds`); None with fewer than `min_intervals` logged (the first holds
  compilation)."""
  per_step = _step_times(workdir)
  return _median(list(per_step.values())) if len(per_step) >= min_intervals else None


def _json_field(path: Path, *keys: str):
  try:
    value = json.loads(path.read_text())
    for key in keys:
      value = value[key]
    return value
  except (OSError, ValueError, KeyError, TypeError):
    return None


def run_provenance(workdir: Path) -> dict:
  """{"corpus", "tokenizer", "train_s"} of a run: its record's provenance.json, else from
  the run directory: the data's hash (a byte run's corpus content sha256, a token run's
  shards sha256; the token record's absolute data path is not kept), the tokenizer's
  sha256 (token runs) and `train_seconds`; None where unknown."""
  workdir = Path(workdir)
  kept = _json_field(workdir / PROVENANCE)
  if isinstance(kept, dict):
    return {key: kept.get(key) for key in ("corpus", "tokenizer", "train_s")}
  corpus = (_json_field(workdir / MANIFEST, "content_sha256")
            or _json_field(workdir / TOKEN_DATA, "shards_sha256"))
  return {"corpus": corpus, "tokenizer": _json_field(workdir / TOKEN_DATA, "tokenizer", "sha256"),
          "train_s": train_seconds(workdir)}


def record_files(workdir: Path) -> list[Path]:
  """The files of `workdir` a record keeps, relative to it, that exist."""
  workdir = Path(workdir)
  found = [Path(name) for name in FILES if (workdir / name).is_file()]
  found += sorted(p.relative_to(workdir) for p in workdir.glob(ANALYSIS_GLOB) if p.is_file())
  return found


def _write_atomic(path: Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_bytes(data)
  os.replace(tmp, path)


def write_record(workdir: Path, record_dir: Path) -> list[str]:
  """Copies `workdir`'s record files into `record_dir` (replacing older copies: a record
  mirrors its run's latest output) with its provenance; returns the names written.
  Each file is replaced whole, so a reader never sees half of one."""
  workdir, record_dir = Path(workdir), Path(record_dir)
  if workdir.resolve() == record_dir.resolve():
    raise ValueError(f"a record of {workdir} cannot be written into itself")
  names = record_files(workdir)
  if not names:
    raise FileNotFoundError(f"{workdir} holds none of the files a record keeps "
                            f"({', '.join(FILES)}, {ANALYSIS_GLOB})")
  written = []
  for name in names:
    data = (workdir / name).read_bytes()
    target = record_dir / name
    if not (target.is_file() and target.read_bytes() == data):
      _write_atomic(target, data)
      written.append(str(name))
  provenance = json.dumps(run_provenance(workdir), sort_keys=True) + "\n"
  if any((workdir / name).exists() for name in (MANIFEST, TOKEN_DATA, "metrics.json")):
    target = record_dir / PROVENANCE
    if not (target.is_file() and target.read_text() == provenance):
      _write_atomic(target, provenance.encode())
      written.append(PROVENANCE)
  return written


def add_twin_analyses(workdir: Path, record_dir: Path, why: str,
                      base_workdir: Path | None = None, base_steps: int = 0) -> list[str]:
  """A record kept against a retrain that differs from it (`why`: another CPU's float
  rounding, say) takes from the retrain the analyses it lacks: the retrain is a twin of
  the recorded run (same config, seed, initialisation and batches; its numbers part from
  the record's at rounding level and the trajectories then drift apart), so its analyses
  are another realisation of the same arm and seed, not the record's own, and TWIN says
  which they are, why, where they were computed and (with `base_workdir`, the run it
  started from) the base's training numbers up to `base_steps` (a run trained from the
  base's early state is then checked against the base the twin really started from) and
  its final validation bits. Analyses the record holds are never replaced; its own
  numbers stay. Returns the names written."""
  workdir, record_dir = Path(workdir), Path(record_dir)
  new = [p.relative_to(workdir) for p in sorted(workdir.glob(ANALYSIS_GLOB))
         if p.is_file() and not (record_dir / p.relative_to(workdir)).exists()]
  if not new:
    return []
  for name in new:
    _write_atomic(record_dir / name, (workdir / name).read_bytes())
  try:
    before = json.loads((record_dir / TWIN).read_text()).get("analyses", [])
  except (OSError, ValueError, AttributeError):
    before = []
  twin = {"analyses": sorted({*before, *map(str, new)}), "differs": why,
          "provenance": run_provenance(workdir)}
  if base_workdir is not None:
    base_rows = _metrics_rows(Path(base_workdir))
    twin["base_training"] = [
        {k: row[k] for k in ("step", *TRAINING_KEYS) if k in row}
        for row in base_rows
        if isinstance(row.get("step"), int) and row["step"] <= base_steps
        and any(k in row for k in TRAINING_KEYS)]
    # The retrained base's last validation bits: how far a rounding-level difference
    # carries by the end of training (the record's own base says where it ended).
    finals = [(row["step"], _bits(row)) for row in base_rows if _bits(row) is not None]
    if finals:
      step, (key, value) = finals[-1]
      twin["base_final"] = {"step": step, key: value}
  _write_atomic(record_dir / TWIN, (json.dumps(twin, indent=1, sort_keys=True) + "\n").encode())
  return [*map(str, new), TWIN]
