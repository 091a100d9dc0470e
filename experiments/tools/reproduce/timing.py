"""What the queue expects its runs and analyses to take (`expected_train_s`,
`expected_analysis_s`), scaled to this machine (`speed_factor`), and the `--until`
deadline check (`past_deadline`)."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from experiments.tools.reproduce import records as run_records
from experiments.tools.reproduce.analyses import (
  VLM_ANALYSES,
  analysed,
  analysis_seconds,
  wanted_analyses,
)
from experiments.tools.reproduce.design import (
  SETTINGS,
  TIMED_LIKE,
  VLM,
  VLM_PHASE_STEPS,
  Run,
  plan,
  records_root,
  run_dir,
  steps,
)
from experiments.tools.reproduce.state import recorded, stale
from experiments.trainer.writers import read_metrics

# What the median step time x steps leaves out: start-up and compilation, the three
# evaluations over 447 KB and the checkpoint writes. The byte baseline, seed 0, pinned to
# one core beside another run: 1,095 s from its stamp to its last metrics row against
# 834 s of steps (x1.31).
DEADLINE_MARGIN = 1.35


# Before any run of the rerun is recorded: seconds per step of each phase, one core pinned
# beside another run, single-threaded XLA (2-core AMD EPYC, 2026-12-03; stage 0 from its
# first 2,000 steps, Stage I from 16 steps). The answers of every count make a stage-0 step
# 12x dearer than one of 1-2 objects: ~6.1 h of steps a base, ~35 min a Stage I arm.
VLM_PRIOR_STEP_S = {"base": (0.85, 10.2), "sft": (3.5,)}


def vlm_stage(run: Run) -> str:
  """A VLM run's stage, the key of VLM_PHASE_STEPS: "base" (stage 0) or "sft" (Stage I)."""
  return "base" if run.name == "base" else "sft"


def vlm_prior_s(run: Run, done_steps: int = 0) -> float:
  """The seconds of steps VLM_PRIOR_STEP_S gives a VLM run from step `done_steps` on."""
  kind, left, start = vlm_stage(run), 0.0, 0
  for n, step_s in zip(VLM_PHASE_STEPS[kind], VLM_PRIOR_STEP_S[kind], strict=True):
    left += step_s * max(0, min(n, start + n - done_steps))
    start += n
  return left


def expected_train_s(run: Run, root: Path, factor: float | None = None) -> float | None:
  """What training `run` from where its directory stands should take, x DEADLINE_MARGIN:
  a run with steps logged here, its own step time x the steps left; else the median
  time (run_records.train_seconds) of the recorded runs of its arm and setting, else (an
  arm of TIMED_LIKE) the median of the arm it is timed like, scaled by the steps, else the
  longest of its setting's (an arm not yet recorded may be the slowest; for the VLM rerun,
  of its stage's), else (a setting with nothing recorded yet) the longest of its arm in
  the other LM setting, else of any LM run, and for the VLM rerun its one-core timings
  (VLM_PRIOR_STEP_S); times this machine's `speed_factor` (`factor`, computed when
  None), times the share of its steps still to train (for the VLM rerun, the share of its
  prior time: its phases' steps differ 12x in cost). None when nothing applies."""
  rows = [r for r in read_metrics(run_dir(run, root)) if "step" in r]
  done_steps = min(max(int(rows[-1]["step"]) if rows else 0, 0), steps(run))
  if run.experiment in SETTINGS:
    own = run_records.step_time(run_dir(run, root))
    if own is not None:
      return own * (steps(run) - done_steps) * DEADLINE_MARGIN
  same_arm = _recorded_seconds(run, root, same_arm=True, same_setting=True)
  like = _like_seconds(run, root) if not same_arm else None
  if same_arm:
    typical = sorted(same_arm)[len(same_arm) // 2]
  elif like is not None:
    typical = like
  else:
    found = (_recorded_seconds(run, root, same_arm=False, same_setting=True)
             or _recorded_seconds(run, root, same_arm=True, same_setting=False)
             or _recorded_seconds(run, root, same_arm=False, same_setting=False))
    if found:
      typical = max(found)
    elif run.experiment == VLM:
      typical = vlm_prior_s(run)
    else:
      return None
  if run.experiment == VLM:
    left = vlm_prior_s(run, done_steps) / vlm_prior_s(run)
  else:
    left = 1.0 - done_steps / max(steps(run), 1)
  factor = speed_factor(root) if factor is None else factor
  return typical * factor * left * DEADLINE_MARGIN


# The analyses `run --analyze` gives a run after it trains, before any is timed here
# (ANALYSIS_SECONDS), in the records' time (x speed_factor): the four record analyses of a
# bytes r16 / r64 / frozen-router run took 3.8-5.5 min on a machine of factor 0.70 (from
# the runs' file times); PVM's attention analysis (64 scenes decoded up to 900 tokens) took
# 102 s on one pinned core of a machine of factor ~1.0 (2026-12-03), given 3 min.
ANALYSIS_PRIOR_S = {"record": 480.0, "vlm": 180.0}


def _analysis_kind(names) -> str:
  return "vlm" if any(n in VLM_ANALYSES for n in names) else "record"


def expected_analysis_s(run: Run, root: Path, factor: float | None = None) -> float:
  """What the analyses `run --analyze` gives `run` once trained should take: 0 when it is
  given none or has them all; else the median time of the same analyses on the runs timed
  under `root` (this machine), else of analyses of their kind (record or VLM), else
  ANALYSIS_PRIOR_S x this machine's `speed_factor`."""
  names = [n for n in wanted_analyses(run)[0] if not analysed(run, n, root)]
  if not names:
    return 0.0
  kind = _analysis_kind(names)
  timed = [(key, seconds) for other in plan()
           for key, seconds in analysis_seconds(other, root).items()]
  for alike in ([s for key, s in timed if key == ",".join(names)],
                [s for key, s in timed if _analysis_kind(key.split(",")) == kind]):
    if alike:
      return sorted(alike)[len(alike) // 2]
  factor = speed_factor(root) if factor is None else factor
  return ANALYSIS_PRIOR_S[kind] * factor


def _like_seconds(run: Run, root: Path) -> float | None:
  """A TIMED_LIKE arm's time before its own is recorded: the median recorded time of the
  arm it is timed like in its setting, x its steps / that arm's steps; None without one."""
  name = TIMED_LIKE.get(run.name)
  if name is None:
    return None
  like = next((r for r in plan() if r.experiment == run.experiment and r.name == name), None)
  if like is None:
    return None
  found = _recorded_seconds(like, root, same_arm=True, same_setting=True)
  if not found:
    return None
  return sorted(found)[len(found) // 2] * steps(run) / max(steps(like), 1)


def _recorded_seconds(run: Run, root: Path, *, same_arm: bool, same_setting: bool,
                      but: str | None = None) -> list[float]:
  """The recorded training times (`run_records.run_provenance`) of the runs of `run`'s
  arm and/or setting (an LM run: the LM settings only; a VLM run: its stage's), leaving
  out the run `but`."""
  found = []
  for other in plan():
    if other.key == but:
      continue
    if same_setting and other.experiment != run.experiment:
      continue
    if not same_setting and (other.experiment not in SETTINGS
                             or run.experiment not in SETTINGS):
      continue
    if same_arm and other.name != run.name:
      continue
    if run.experiment == VLM and vlm_stage(other) != vlm_stage(run):
      continue   # a base trains ~10x longer than a Stage I arm: not its time
    seconds = run_records.run_provenance(run_dir(other, records_root(root)))["train_s"]
    if seconds is not None and recorded(other, root):
      found.append(float(seconds))
  return found


def speed_factor(root: Path) -> float:
  """How fast this machine trains against the records: the median, over the LM runs with
  steps logged under `root` (finished or cut, this machine's runs) whose arm has other
  recorded seeds, of its step time x its steps / the median recorded time of those seeds;
  1.0 when no run gives a ratio. Records come from whatever machines trained them (the
  lent machines differ up to ~2x in step time), so the deadline check scales them to
  this one."""
  ratios = []
  for run in plan():
    if run.experiment not in SETTINGS or stale(run, root):
      continue
    own = run_records.step_time(run_dir(run, root))
    if own is None:
      continue
    others = _recorded_seconds(run, root, same_arm=True, same_setting=True, but=run.key)
    if others:
      ratios.append(own * steps(run) / sorted(others)[len(others) // 2])
  return sorted(ratios)[len(ratios) // 2] if ratios else 1.0


def parse_until(spec: str | None, now: float | None = None) -> float | None:
  """--until: "+MINUTES" from now or an ISO date-time (local time unless it names a zone),
  as seconds since the epoch."""
  if not spec:
    return None
  now = time.time() if now is None else now
  try:
    if spec.startswith("+"):
      return now + 60.0 * float(spec[1:])
    return datetime.datetime.fromisoformat(spec).timestamp()
  except ValueError:
    raise SystemExit(f"error: --until={spec!r} must be +MINUTES or an ISO date-time "
                     "(2026-12-02T00:05)") from None


def past_deadline(run: Run, root: Path, until: float | None,
                  factor: float | None = None, then_analyze: bool = False) -> str | None:
  """Why `run` is not started before the deadline `until` (it would end after it, with
  the analyses it is then given when `then_analyze`), or None; `factor`: this machine's
  `speed_factor`, computed when None."""
  if until is None:
    return None
  factor = speed_factor(root) if factor is None else factor
  expected = expected_train_s(run, root, factor)
  if expected is None:
    return None
  analyses = expected_analysis_s(run, root, factor) if then_analyze else 0.0
  if time.time() + expected + analyses <= until:
    return None
  also = f" and ~{analyses / 60:.0f} min of analyses" if analyses else ""
  return (f"skip {run.key}: would take ~{expected / 60:.0f} min{also} (its recorded or "
          f"measured time, x{factor:.2f} for this machine), past --until")
