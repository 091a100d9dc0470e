"""The Lngram v2 paper's comparisons at small scale: every run, as an `lngram-exp` command.

    python -m experiments.reproduce list [--only=main,sink]     the commands, and which are done
    python -m experiments.reproduce run  [--only=main] [--max_runs=N]
    python -m experiments.reproduce analyze [--force] [--dry_run]

`run` trains the runs one after another in `runs/repro/<experiment>/<name>_s<seed>` (a
rerun resumes a cut run exactly and skips finished ones), so the queue can be stopped and
started at any time. `python -m experiments.report` turns the run directories into the
tables and plots of RESULTS.md. Every run is an ordinary training command: the seed sets
the parameters (`train.seed`) and the batch order (`data.seed`); data, steps, optimiser and
schedule are those of the config files, the same for every arm.

`analyze` runs `lngram-exp analyze` (the paper's §3 and App. B/C analyses, written into
`<run>/analysis/`, the log into `<run>/analysis/analyze.log`) on the best finished Lngram
v2 run of `main` (lowest final validation bits/byte among the lngram_r16 / lngram_r64
seeds: all six analyses) and on the insertion pair (`insertion/inserted_300_s0` and
`main/lngram_r16_s0`: stability and injection) at each run's final step, skipping runs
not finished yet and analyses already written from that step (`--force` redoes them;
`--dry_run` only prints the commands).

Experiments:
  main       baseline, Lngram v2 r16 and r64, Lngram v1, PKM, Engram, the sparse FFN
             matched to r16; three seeds (Tables 2 and 4)
  surrogate  exact, one-bit, ste, none; two seeds for one-bit and ste (App. A.5)
  sink       with and without the sink, three seeds (§4.2)
  routes     equal tables, more routes vs wider entries; KV heads 1 / 2 / 4 (Table 3)
  insertion  Lngram v2 inserted at step 300 into the baseline vs from step 0 (App. B)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from experiments.trainer.writers import read_metrics

ROOT = Path("runs/repro")
CONFIGS = "experiments/configs"


@dataclasses.dataclass(frozen=True)
class Run:
  experiment: str
  name: str
  config: str                  # file[:arg] under experiments/configs
  seed: int = 0
  overrides: tuple[str, ...] = ()
  after: str | None = None     # a run (experiment/name_sS) that must finish first
  same_as: str | None = None   # a run of another experiment with the same config and seed:
                               # this one reads that run's directory instead of training

  @property
  def workdir(self) -> Path:
    return ROOT / (self.same_as or self.key)

  @property
  def key(self) -> str:
    return f"{self.experiment}/{self.name}_s{self.seed}"

  def command(self) -> list[str]:
    return ["lngram-exp", "train", f"--config={CONFIGS}/{self.config}",
            f"--workdir={self.workdir}", f"--config.train.seed={self.seed}",
            f"--config.data.seed={self.seed}", "--config.train.progress=False",
            *self.overrides]


def _seeds(experiment, name, config, seeds, *overrides, same_as=None):
  """One run per seed; `same_as="main/lngram_r16"` shares that arm's runs of equal seed."""
  return [Run(experiment, name, config, s, tuple(overrides),
              same_as=f"{same_as}_s{s}" if same_as else None) for s in seeds]


def plan() -> list[Run]:
  runs = []
  for name, config in (("baseline", "lm_baseline.py"), ("lngram_r16", "lm_lngram.py:r16"),
                       ("lngram_r64", "lm_lngram.py:r64"), ("lngram_v1", "lm_lngram_v1.py"),
                       ("pkm", "lm_pkm.py"), ("engram", "lm_engram.py"),
                       ("sparse_ffn", "lm_sparse_ffn.py:matched-to=r16")):
    runs += _seeds("main", name, config, (0, 1, 2))
  # Runs whose config equals a main arm's (the default Lngram is r16, one-bit, KV 2, with
  # the sink) read that arm's directories: the same command would train the same model.
  r16, r64 = "main/lngram_r16", "main/lngram_r64"
  runs += _seeds("surrogate", "onebit", "lm_lngram.py:onebit", (0, 1), same_as=r16)
  for surrogate, seeds in (("ste", (0, 1)), ("exact", (0,)), ("none", (0,))):
    runs += _seeds("surrogate", surrogate, f"lm_lngram.py:{surrogate}", seeds)
  runs += _seeds("sink", "sink", "lm_lngram.py", (0, 1, 2), same_as=r16)
  runs += _seeds("sink", "nosink", "lm_lngram.py:nosink", (0, 1, 2))
  # Equal tables at d = 128: r64 with 32-wide entries vs r16 with 128-wide ones, 8.91M
  # table parameters per layer each (totals 8.99M vs 9.18M; active 79k vs 275k), the
  # paper's r64/m4/KV8 vs r23/m4/KV8/mem256 contrast scaled down.
  runs += _seeds("routes", "r64_mem32", "lm_lngram.py:r64", (0,), same_as=r64)
  runs += _seeds("routes", "r16_mem128", "lm_lngram.py:r16,mem128", (0,))
  for kv in (1, 2, 4):
    runs += _seeds("routes", f"r16_kv{kv}", f"lm_lngram.py:r16,kv{kv}", (0,),
                   same_as=r16 if kv == 2 else None)
  # Insertion: the baseline trained 300 steps, then Lngram for the remaining 300 from
  # its checkpoint, against Lngram from step 0 for 600 (the main runs).
  base300 = Run("insertion", "baseline_300", "lm_baseline.py", 0,
                ("--config.train.steps=300", "--config.train.ckpt_every=100",
                 "--config.train.eval_every=100"))
  runs.append(base300)
  runs.append(Run("insertion", "inserted_300", "lm_lngram.py", 0,
                  (f"--config.init_from={base300.workdir}", "--config.train.steps=300",
                   "--config.train.ckpt_every=100", "--config.train.eval_every=100"),
                  after=base300.key))
  runs += _seeds("insertion", "from_step_0", "lm_lngram.py", (0,), same_as=r16)
  return runs


def run_dir(run: Run, root: Path | None = None) -> Path:
  """The directory the run reads (its own or the one it shares) under `root` (default
  ROOT, read at call time)."""
  return Path(ROOT if root is None else root) / run.workdir.relative_to(ROOT)


def final_eval(rows: list[dict], steps: int) -> float | None:
  """Validation bits per byte of the metrics row at step `steps`, if the run got there."""
  for row in rows:
    if row.get("step") == steps and "eval/bits_per_byte" in row:
      return float(row["eval/bits_per_byte"])
  return None


def final_bits_per_byte(run: Run, root: Path | None = None) -> float | None:
  """Validation bits per byte of the run's final evaluation; None until it is written."""
  return final_eval(read_metrics(run_dir(run, root)), steps(run))


def step_offset(run: Run, by_key: dict[str, Run] | None = None) -> int:
  """Where a run's own step 0 lies on its model's training clock: the steps of the run
  whose checkpoint it starts from (`init_from`, the insertion), else 0."""
  if run.after is None or not any(o.startswith("--config.init_from=") for o in run.overrides):
    return 0
  by_key = by_key or {r.key: r for r in plan()}
  return steps(by_key[run.after])


def finished(run: Run, root: Path | None = None) -> bool:
  """A summary row of the run's final evaluation exists (the loop writes it last)."""
  return final_bits_per_byte(run, root) is not None


def steps(run: Run) -> int:
  """The training steps of a run: its `--config.train.steps=` override, else the configs' 600."""
  for o in run.overrides:
    if o.startswith("--config.train.steps="):
      return int(o.split("=", 1)[1])
  return 600


# The analyses of `lngram-exp analyze` on an LM run (experiments.analysis.run.LM_ANALYSES).
ANALYSES = ("utilisation", "id_knn", "associations", "distributed", "stability", "injection")
BEST_ARMS = ("lngram_r16", "lngram_r64")          # of `main`: the Lngram v2 arms
INSERTION_PAIR = ("insertion/inserted_300_s0", "main/lngram_r16_s0")   # inserted, from step 0
INSERTION_ANALYSES = ("stability", "injection")   # App. B.2 and B.3
# The inserted run keeps its own steps 100, 200, 300 (backbone steps 400, 500, 600); its
# stability is measured over own 100 -> 300 = backbone 400 -> 600, the same 200-step
# interval as the from-scratch run's last one (400 -> 600).
STABILITY_STEPS = {"insertion/inserted_300_s0": (100, 300)}


def best_lngram_run(root: Path | None = None,
                    runs: list[Run] | None = None) -> tuple[Run, float] | None:
  """(run, final bits/byte) of the finished Lngram v2 run of `main` with the lowest final
  validation bits per byte, or None while none has finished."""
  scored = [(final_bits_per_byte(r, root), r) for r in (runs or plan())
            if r.experiment == "main" and r.name in BEST_ARMS]
  scored = [(v, r) for v, r in scored if v is not None]
  if not scored:
    return None
  value, run = min(scored, key=lambda vr: (vr[0], vr[1].key))
  return run, value


def analysis_path(run: Run, name: str, root: Path | None = None) -> Path:
  return run_dir(run, root) / "analysis" / f"{name}.json"


def analysis_written(run: Run, name: str, root: Path | None = None) -> bool:
  """The analysis JSON exists and was computed from the run's final checkpoint (its
  `source` step; a file without `source`, from before results recorded it, counts)."""
  try:
    result = json.loads(analysis_path(run, name, root).read_text())
  except (OSError, ValueError):
    return False
  source = result.get("source") if isinstance(result, dict) else None
  return source is None or source.get("step") == steps(run)


def analysis_jobs(root: Path | None = None, force: bool = False):
  """What `analyze` does: [(run, analyses to run, why)] and [(key, reason skipped)].

  The best Lngram v2 run gets every analysis, each run of the insertion pair stability
  and injection (one command per run directory); a run not finished is skipped, and so
  is an analysis already written from the final checkpoint (`analysis_written`) unless
  `force`."""
  runs = plan()
  by_key = {r.key: r for r in runs}
  wanted: dict[str, tuple[list[str], list[str]]] = {}   # key -> (analyses, reasons)
  skipped: list[tuple[str, str]] = []
  best = best_lngram_run(root, runs)
  if best is None:
    skipped.append(("main/" + "|".join(BEST_ARMS), "no Lngram v2 run of main has finished"))
  else:
    run, value = best
    wanted[run.key] = (list(ANALYSES), [f"best Lngram v2 run, {value:.4f} bits/byte"])
  for key, role in zip(INSERTION_PAIR, ("inserted at step 300", "Lngram from step 0"),
                       strict=True):
    if not finished(by_key[key], root):
      skipped.append((key, f"{role}: not finished"))
      continue
    names, reasons = wanted.setdefault(key, ([], []))
    names += [n for n in INSERTION_ANALYSES if n not in names]
    reasons.append(f"insertion pair, {role}")
  jobs = []
  for key, (names, reasons) in wanted.items():
    run = by_key[key]
    todo = [n for n in ANALYSES if n in names
            and (force or not analysis_written(run, n, root))]
    done = [n for n in ANALYSES if n in names and n not in todo]
    if done:
      skipped.append((key, f"already written: {','.join(done)} (--force redoes them)"))
    if todo:
      jobs.append((run, tuple(todo), "; ".join(reasons)))
  return jobs, skipped


def analyze_command(run: Run, names, root: Path | None = None) -> list[str]:
  command = ["lngram-exp", "analyze", f"--workdir={run_dir(run, root)}",
             f"--which={','.join(names)}", f"--step={steps(run)}"]
  if "stability" in names and run.key in STABILITY_STEPS:
    command.append(f"--stability_steps={','.join(map(str, STABILITY_STEPS[run.key]))}")
  return command


def select(runs, only: str | None):
  if not only:
    return runs
  wanted = set(only.split(","))
  unknown = wanted - {r.experiment for r in runs}
  if unknown:
    raise SystemExit(f"error: unknown experiments {sorted(unknown)}")
  return [r for r in runs if r.experiment in wanted]


def training_order(runs: list[Run], by_key: dict[str, Run]) -> list[Run]:
  """The runs to train for `runs`, seed 0 of every experiment first, then seed 1, then 2,
  so that a cut queue leaves every experiment with some result. A shared run is trained
  once, under its own name (also when only the experiment that shares it is selected)."""
  order, seen = [], set()
  for run in sorted(runs, key=lambda r: r.seed):
    target = by_key[run.same_as] if run.same_as else run
    if target.key not in seen:
      seen.add(target.key)
      order.append(target)
  return order


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("action", choices=("list", "run", "analyze"))
  parser.add_argument("--only", default=None, help="comma-separated experiments")
  parser.add_argument("--max_runs", type=int, default=None, help="stop after this many runs")
  parser.add_argument("--force", action="store_true", help="analyze: redo written analyses")
  parser.add_argument("--dry_run", action="store_true", help="analyze: print, do not run")
  ns = parser.parse_args(argv)
  if ns.action == "analyze":
    return analyze(force=ns.force, dry_run=ns.dry_run)
  runs = select(plan(), ns.only)
  if ns.action == "list":
    for run in runs:
      shared = f"   (= {run.same_as})" if run.same_as else ""
      print(("done  " if finished(run) else "todo  ") + " ".join(run.command()) + shared)
    return 0
  by_key = {r.key: r for r in plan()}
  done = {r.key for r in by_key.values() if finished(r)}
  started = 0
  for run in training_order(runs, by_key):
    if run.key in done:
      continue
    if run.after is not None and run.after not in done:
      print(f"skip {run.key}: waits for {run.after}", flush=True)
      continue
    if ns.max_runs is not None and started >= ns.max_runs:
      break
    started += 1
    run.workdir.parent.mkdir(parents=True, exist_ok=True)
    print(f"run {run.key}: {' '.join(run.command())}", flush=True)
    with open(run.workdir.parent / f"{run.workdir.name}.log", "a") as log:
      code = subprocess.call([sys.executable, "-m", "experiments", *run.command()[1:]],
                             stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
      print(f"run {run.key} exited {code}; see its log", flush=True)
      return code
    done.add(run.key)
  return 0


def analyze(force: bool = False, dry_run: bool = False, root: Path | None = None) -> int:
  """Runs `lngram-exp analyze` for every job of `analysis_jobs`, one after another; the
  output of each goes to `<run>/analysis/analyze.log`. Returns the first failing exit code."""
  jobs, skipped = analysis_jobs(root, force)
  for key, why in skipped:
    print(f"skip {key}: {why}", flush=True)
  status = 0
  for run, names, why in jobs:
    command = analyze_command(run, names, root)
    print(f"analyze {run.key} ({why}): {' '.join(command)}", flush=True)
    if dry_run:
      continue
    out = run_dir(run, root) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "analyze.log", "a") as log:
      code = subprocess.call([sys.executable, "-m", "experiments", *command[1:]],
                             stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
      print(f"analyze {run.key} exited {code}; see {out / 'analyze.log'}", flush=True)
      status = status or code
  return status


if __name__ == "__main__":
  sys.exit(main())
