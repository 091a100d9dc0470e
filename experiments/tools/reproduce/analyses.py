"""The analyses the design gives its runs (`wanted_analyses`): which are written from
a run's final checkpoint, the `lngram-exp analyze` commands, and `analyze`, which runs
them and times them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from experiments.tools.reproduce.design import (
  CONTROL_SEEDS,
  VLM,
  YOUNG_INSERTED,
  Run,
  plan,
  records_root,
  run_dir,
  steps,
)
from experiments.tools.reproduce.state import finished, recorded, refresh_record, stamped_steps

# The analyses of `lngram-exp analyze` on an LM run (experiments.analysis.run.LM_ANALYSES).
ANALYSES = ("utilisation", "id_knn", "associations", "distributed", "stability", "injection")
RECORD_ANALYSES = ANALYSES[:4]
ID_ARMS = ("lngram_r16", "lngram_r64", "lngram_r16_frozen")   # every finished seed
ID_SETTING = "bytes"          # the setting given the ID analyses (analyze reads token runs too)
MAX_POSITIONS = 20000         # enough positions for the stratum x byte permutation cells
INSERTION_PAIR = ("bytes/inserted_low_s0", "bytes/lngram_r16_s0")   # inserted, from step 0
INSERTION_ANALYSES = ("stability", "injection")   # App. B.2 and B.3
# The LR-matched B.2 control (design.FAMILIES["controls_v3"]): stability of every seed's
# insertion into the mature (step 600) and the young (step 200) backbone, both at 0.05x.
B2_CONTROL_RUNS = tuple(f"bytes/{arm}_s{seed}" for arm in ("inserted_low", YOUNG_INSERTED)
                        for seed in CONTROL_SEEDS)
# The inserted run keeps its own steps 100, 200, 300 (model steps 700 ... 900); stability
# over own 100 -> 300 is a 200-step interval like the from-scratch run's last (400 -> 600).
STABILITY_STEPS = {key: (100, 300) for key in ("bytes/inserted_low_s0", *B2_CONTROL_RUNS)}


# PVM's premise on every finished stage-0 base of the rerun: the backbone's visual attention
# mass against the generated position, over the design's whole answer length.
VLM_ANALYSES = ("attention",)
VLM_ATTENTION_SCENES = 64
VLM_MAX_NEW_TOKENS = 900      # vlm_long_base.MAX_NEW_TOKENS


def vlm_final_step(run: Run, root: Path | None = None) -> int | None:
  """The last training step of a finished VLM run (its metrics.json history), else None."""
  try:
    steps_ = json.loads((run_dir(run, root) / "metrics.json").read_text())["history"]["steps"]
    return int(steps_[-1])
  except (OSError, ValueError, KeyError, IndexError, TypeError):
    return None


def vlm_analysis_written(run: Run, root: Path | None = None) -> bool:
  """attention_decay.json (the VLM analyses write into the run directory itself) exists
  and was computed from the run's final checkpoint."""
  try:
    result = json.loads((run_dir(run, root) / "attention_decay.json").read_text())
  except (OSError, ValueError):
    return False
  step = (result.get("source") or {}).get("step") if isinstance(result, dict) else None
  return step is not None and step == vlm_final_step(run, root)


def analysis_path(run: Run, name: str, root: Path | None = None) -> Path:
  return run_dir(run, root) / "analysis" / f"{name}.json"


def _record_protocol() -> int:
  from experiments.analysis.run import RECORD_PROTOCOL
  return RECORD_PROTOCOL


def analysis_written(run: Run, name: str, root: Path | None = None) -> bool:
  """The analysis JSON exists, was computed from the run's final checkpoint (its `source`
  step; a file without `source` counts) and, for a record analysis, under the current
  record protocol (absent: version 1)."""
  try:
    result = json.loads(analysis_path(run, name, root).read_text())
  except (OSError, ValueError):
    return False
  if not isinstance(result, dict):
    return False
  source = result.get("source")
  if source is not None and source.get("step") != stamped_steps(run, root):
    return False
  if name in RECORD_ANALYSES:
    version = (result.get("protocol") or {}).get("version", 1)
    return version >= _record_protocol()
  return True


def wanted_analyses(run: Run) -> tuple[list[str], list[str]]:
  """(analyses, why) the design gives `run`: the record analyses on every seed of the ID
  arms, the insertion pair's, the VLM bases' attention; ([], []) for the others."""
  names, reasons = [], []
  if run.experiment == ID_SETTING and run.name in ID_ARMS:
    names += RECORD_ANALYSES
    reasons.append(f"every seed of {run.name}")
  for key, role in zip(INSERTION_PAIR, ("inserted", "Lngram from step 0"), strict=True):
    if run.key == key:
      names += [n for n in INSERTION_ANALYSES if n not in names]
      reasons.append(f"insertion pair, {role}")
  if run.key in B2_CONTROL_RUNS:
    names += [n for n in ("stability",) if n not in names]
    reasons.append("the LR-matched B.2 control")
  if run.experiment == VLM and run.name == "base":
    names += VLM_ANALYSES
    reasons.append("PVM's premise: the base's visual attention vs t")
  order = ANALYSES + VLM_ANALYSES
  return sorted(names, key=order.index), reasons


def analysed(run: Run, name: str, root: Path | None = None) -> bool:
  """The analysis is written from the run's final step, here or in its record."""
  def written(where):
    if run.experiment == VLM:
      return vlm_analysis_written(run, where)
    return analysis_written(run, name, where)
  return written(root) or written(records_root(root))


def analysis_jobs(root: Path | None = None, force: bool = False):
  """What `analyze` does: [(run, analyses to run, why)] and [(key, reason skipped)]. An
  analysis needs the run's checkpoint, so a run recorded but not finished under `root`
  (trained on another machine) is skipped; one whose record holds its analyses is done."""
  jobs, skipped = [], []
  for run in plan():
    names, reasons = wanted_analyses(run)
    if not names:
      continue
    if not finished(run, root):
      if recorded(run, root) and all(analysed(run, n, root) for n in names):
        skipped.append((run.key, "recorded with its analyses"))
      elif recorded(run, root):
        skipped.append((run.key, "recorded without its analyses and not finished here "
                                 "(`run --analyze` trains it again to analyse it)"))
      else:
        skipped.append((run.key, "not finished"))
      continue
    todo = [n for n in names if force or not analysed(run, n, root)]
    done = [n for n in names if n not in todo]
    if done:
      them = "them" if len(done) > 1 else "it"
      skipped.append((run.key, f"already written: {','.join(done)} (--force redoes {them})"))
    if todo:
      jobs.append((run, tuple(todo), "; ".join(reasons)))
  return jobs, skipped


def analyze_command(run: Run, names, root: Path | None = None) -> list[str]:
  if run.experiment == VLM:
    return ["lngram-exp", "analyze", f"--workdir={run_dir(run, root)}",
            f"--which={','.join(names)}", f"--n={VLM_ATTENTION_SCENES}",
            f"--max_new_tokens={VLM_MAX_NEW_TOKENS}"]
  command = ["lngram-exp", "analyze", f"--workdir={run_dir(run, root)}",
             f"--which={','.join(names)}", f"--step={stamped_steps(run, root)}"]
  if any(n in RECORD_ANALYSES for n in names):
    command.append(f"--max_positions={MAX_POSITIONS}")
  if ("stability" in names and run.key in STABILITY_STEPS
      and stamped_steps(run, root) == steps(run)):   # not a smoke run's few steps
    command.append(f"--stability_steps={','.join(map(str, STABILITY_STEPS[run.key]))}")
  return command


# {"name,name": seconds} in the run directory: this machine's timing, not part of a record.
ANALYSIS_SECONDS = "analyze_seconds.json"


def analysis_seconds(run: Run, root: Path) -> dict[str, float]:
  """The analyses timed on `run` under `root` by `analyze`: {"name,name": seconds}."""
  try:
    timed = json.loads((run_dir(run, root) / ANALYSIS_SECONDS).read_text())
    return {str(k): float(v) for k, v in timed.items()} if isinstance(timed, dict) else {}
  except (OSError, ValueError, TypeError):
    return {}


def analyze(force: bool = False, dry_run: bool = False, root: Path | None = None,
            keys: set[str] | None = None) -> int:
  """Runs `lngram-exp analyze` for every job of `analysis_jobs` (only those of the runs
  `keys` when given), one after another; the output of each goes to
  `<run>/analysis/analyze.log`. Returns the first failing exit code."""
  jobs, skipped = analysis_jobs(root, force)
  if keys is not None:
    jobs = [job for job in jobs if job[0].key in keys]
    skipped = []
  for key, why in skipped:
    print(f"skip {key}: {why}", flush=True)
  status_ = 0
  for run, names, why in jobs:
    command = analyze_command(run, names, root)
    print(f"analyze {run.key} ({why}): {' '.join(command)}", flush=True)
    if dry_run:
      continue
    out = run_dir(run, root) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with open(out / "analyze.log", "a") as log:
      code = subprocess.call([sys.executable, "-m", "experiments", *command[1:]],
                             stdout=log, stderr=subprocess.STDOUT)
    if code == 0:   # the deadline check's estimate of the next run's analyses
      timed = analysis_seconds(run, root) | {",".join(names): time.monotonic() - began}
      (run_dir(run, root) / ANALYSIS_SECONDS).write_text(json.dumps(timed) + "\n")
    if code != 0:
      print(f"analyze {run.key} exited {code}; see {out / 'analyze.log'}", flush=True)
      status_ = status_ or code
    refresh_record(run, root)   # the record gets what was written (a failed analysis: nothing new)
  return status_
