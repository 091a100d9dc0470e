"""The Lngram v2 paper's comparisons at small scale, paired by seed, in two settings.

    python -m experiments.reproduce list [--only=bytes,tokens,vlm_long] [--smoke] [--root=DIR]
    python -m experiments.reproduce run  [--only=bytes] [--max_runs=N] [--claim | --shard=I/K]
                                         [--analyze] [--until=+MINUTES|ISO] [--smoke]
    python -m experiments.reproduce analyze [--force] [--dry_run]
    python -m experiments.reproduce record [--only=...] [--root=DIR]

`run` first prepares what a setting needs (the token data: a copy of the corpus, a
4,096-id BPE trained on its training split, `lngram-exp prepare-data`), then trains
the runs one after another in `runs/repro/<setting>/<arm>_s<seed>` (a rerun resumes a
cut run exactly and skips finished ones). For several processes side by side, `--claim`
makes each take the next run no other live process has claimed (a `<run>.claim` file,
experiments/claims.py), waiting while a run it starts from trains elsewhere; `--shard=I/K`
instead takes every K-th run from the I-th (a fixed split, e.g. over machines without a
shared file system; a shard skips a run whose start is another shard's and not done).
Every run is an ordinary `lngram-exp train` of `experiments/configs/repro_lm.py:<setting>,
<arm>`; the seed sets the parameters and the batch order, and since memory branches draw
their init after the backbone, the runs of one seed share the backbone's init and data:
arms are compared paired by seed (experiments/stats.py, `python -m experiments.report`).

Every run that finishes (and every analysis written) is RECORDED: the few files its
numbers come from (stamp, metrics, per-document evaluation, analyses, provenance;
experiments/run_records.py) are copied to
`experiments/results/records/<setting>/<arm>_s<seed>`, which is committed, while the run
directory (checkpoints, TensorBoard) is not. The report reads the records, and the queue
counts a recorded run as done (`list` marks one without its checkpoint here), so results
outlive the machine that trained them; a recorded run trains again only where its
checkpoint is needed here (a run starting from it is not done, or with `--analyze` its
record lacks analyses). Trained again, it must log its record's numbers bit for bit
(training is deterministic on one CPU type under the same XLA flags): one that differs
keeps its record, starts no run from its checkpoint (those recorded from the old one
would not pair with them) and is flagged DIFFERS by `list`; `list` also says how many
logged steps agreed so far. The runs that start from another (insertion, Stage I) train
right after it, so that its checkpoint is used before the machine is gone. `record`
writes the records of finished runs that have none (a queue of an older version). A queue
under another `--root` keeps its records in `<root>/records`. `--until=+MINUTES` (or an
ISO date-time) starts no run that its arm's recorded training time says would end later
(with `--analyze`, counting the analyses it is then given), so a queue on a machine lent
for a fixed time leaves no half-trained run behind.

A run directory holds `repro.json` (this design's version, written before training):
a directory without it, or of another version, is STALE (runs of the older unpaired
design, whose memory arms had other backbone inits): it is listed as stale, never read
into the report and never resumed; move it away to train the run.

Settings (seeds: 5 for the baseline, Lngram v2 r16 and the strongest competitor,
Engram, chosen before these runs from the older byte-level results; 3 for the rest):
  bytes   every arm of repro_lm.py, plus insertion (App. B): from each final baseline,
          300 more steps with Lngram inserted, the backbone at 0.05x the LR and the
          memory at its own (`inserted_low`) or everything at the full LR
          (`inserted_full`), each against the baseline continued the same way
          without memory (`continued_low`, `continued_full`).
  tokens  baseline, dense_active, Lngram v2 r16 and r64, v1 (both contrasts), PKM,
          Engram (hashing token ids), the sparse FFN.

PVM's long-answer rerun (`vlm_long`, experiments/RESULTS.md "Rerun design"): per seed
0-2, stage 0 `vlm_long_base.py[:sN]` (`vlm_long/base_sN`), then Stage I
`vlm_long_sft.py[:mlp|:none][,sN]` (`vlm_long/sft_<pvm|mlp|none>_sN`) from that base's
checkpoint and on its rendered scenes. Its runs are the longest (sequences of ~1,000
bytes; the final evaluation decodes 512 scenes up to 900 tokens), so `list` marks it and
a queue without `--only` trains it after the Lngram runs. On one CPU core pinned beside
another run (VLM_PRIOR_STEP_S): 0.85 s/step over stage 0's 1,800 steps of 1-2 objects and
10.2 s/step over its 2,000 of every count, ~6.1 h a base; 3.5 s/step for Stage I (batch 8),
~35 min an arm. The recorded runs took longer (run_records.train_seconds): 6.8-7.0 h a base,
0.9-1.5 h an arm, so ~32 core-hours of steps for the 12, before their final evaluations. (The
estimate this replaced, ~7 core-hours from 10-step timings, priced the long phase at
~6 s/step and then summed it as if it took ~1 h.) A VLM run is done when its
`metrics.json` (written after its final evaluation) exists.

`--smoke` runs the same queue with every config's `smoke` arg (seconds per run) under
`--root` (default runs/repro_smoke): it checks the queue end to end.

Cost: `list` ends with the counts and the core-hours of training left, by the recorded
times of each arm scaled to this machine's speed (`expected_train_s`, `speed_factor`):
13-37 min of steps a 600-step byte run and 16-29 min a token run, on one core of a
2-core machine beside another run, plus ~35% for start-up, evaluations and checkpoints
(~33 core-hours for the 64 runs left on 2026-12-02 at those times, ~9 of them then
priced for the 12 of `vlm_long`, which take ~24; the 2-core machine of that day trained
~1.6x faster); the `gpu` config arg runs the same comparison bigger on an accelerator.
On 2 cores, two processes pinned to a core each with single-threaded XLA
(`XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" taskset
-c I python -m experiments.reproduce run --claim`, I = 0, 1) train ~12% more steps per
second than one queue on both cores (one Lngram v2 r16 run, 60 steps: 0.56 s/step alone
vs 0.99 s/step each side by side). The thread count can change float rounding, so a run
resumes bit-exactly only under the same flags it started with.

`analyze` runs `lngram-exp analyze` on every finished seed of Lngram v2 r16 and r64
and of the random-router control (bytes: the record analyses of §3 and App. C), and
on the insertion pair (`bytes/inserted_low_s0`, `bytes/lngram_r16_s0`: App. B's
stability and injection), and `attention` on every finished stage-0 base of `vlm_long`
(PVM's premise, 64 scenes up to 900 tokens), skipping analyses already written from the
final checkpoint under the current record protocol (`--force` redoes them); `run
--analyze` gives each run those analyses as soon as it has trained.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from experiments import claims, run_records
from experiments.trainer.writers import read_metrics

ROOT = Path("runs/repro")
RECORDS = Path("experiments/results/records")   # the finished runs' records, kept in git
SMOKE_ROOT = Path("runs/repro_smoke")
CONFIGS = "experiments/configs"
CONFIG = "repro_lm.py"
DESIGN = 2             # repro.json's version: 1 was the unpaired design before 2026-12
STAMP = "repro.json"
STEPS = 600            # repro_lm.py's training steps (base.py)
INSERT_STEPS = 300     # steps of the insertion runs after the baseline's 600
SETTINGS = ("bytes", "tokens")
VLM = "vlm_long"       # PVM's long-answer rerun: stage 0 bases, Stage I arms from them
VLM_SEEDS = (0, 1, 2)
VLM_ARMS = (("sft_pvm", ""), ("sft_mlp", "mlp"), ("sft_none", "none"))   # name, config arg
EXPERIMENTS = (*SETTINGS, VLM)
# Experiments trained after the rest (their runs are the longest): `list` prints the note.
# The times in its note are the recorded runs' (run_records.train_seconds: 6.8-7.0 h a base,
# 0.9-1.5 h a Stage I arm, on one core of a 2-core AMD EPYC); `list` estimates what is left.
TRAINED_LAST = {VLM: "trained after the Lngram runs: ~1,000-byte sequences, 512 validation "
                     "scenes decoded up to 900 tokens at the end of each run; ~7 h of steps "
                     "on one CPU core a stage-0 base, 1-1.5 h a Stage I arm, ~32 h the 12 "
                     "runs (`--only=vlm_long` runs them alone)"}
FIVE_SEEDS = ("baseline", "lngram_r16", "engram")
ARMS = {
    "bytes": ("baseline", "dense_active", "lngram_r16", "lngram_r64", "lngram_r16_mem128",
              "lngram_nosink", "lngram_ste", "lngram_r16_frozen", "lngram_v1",
              "lngram_v1_paper", "pkm", "engram", "sparse_ffn"),
    "tokens": ("baseline", "dense_active", "lngram_r16", "lngram_r64", "lngram_v1",
               "lngram_v1_paper", "pkm", "engram", "sparse_ffn"),
}
INSERTION_ARMS = ("continued_low", "inserted_low", "continued_full", "inserted_full")
TOKEN_VOCAB = 4096
# The token data's validation split by document hash: 51 of the 734 files, ~145k tokens
# (~490 KB of source) under repro_lm.TOKEN_VAL_DOC_CAP, the largest file 5.6%. (0.05 gave
# 31 files, of which difflib.py alone held 20% of the validation tokens.)
TOKEN_VAL_FRACTION = 0.08
SMOKE_TOKEN_VAL_FRACTION = 0.3   # the smoke corpus's 24 files must still hold validation


@dataclasses.dataclass(frozen=True)
class Run:
  experiment: str              # the setting: "bytes" or "tokens"
  name: str                    # the arm
  config: str                  # file:arg under experiments/configs
  seed: int = 0
  overrides: tuple[str, ...] = ()
  after: str | None = None     # a run (setting/name_sS) that must finish first
  same_as: str | None = None   # a run with the same config and seed whose directory
                               # this one reads instead of training (none in this design)
  steps: int = STEPS

  @property
  def setting(self) -> str:
    return self.experiment

  @property
  def workdir(self) -> Path:
    return ROOT / (self.same_as or self.key)

  @property
  def key(self) -> str:
    return f"{self.experiment}/{self.name}_s{self.seed}"

  def command(self, root: Path | None = None, smoke: bool = False) -> list[str]:
    root = Path(ROOT if root is None else root)
    config = self.config + (("," if ":" in self.config else ":") + "smoke" if smoke else "")
    extra = [f"--config.data.path={token_data(root)}"] if self.experiment == "tokens" else []
    overrides = [o.replace("{root}", str(root)) for o in self.overrides]
    if smoke:   # the smoke configs' 4 steps; the insertion continues for 4 more
      overrides = [o for o in overrides if not o.startswith(("--config.train.steps=",
                                                               "--config.train.ckpt_every=",
                                                               "--config.train.eval_every="))]
    return ["lngram-exp", "train", f"--config={CONFIGS}/{config}",
            f"--workdir={run_dir(self, root)}", f"--config.train.seed={self.seed}",
            f"--config.data.seed={self.data_seed}", "--config.train.progress=False",
            *extra, *overrides]

  @property
  def data_seed(self) -> int:
    # The continuation reads another stream than the one its baseline read (seed k + 1000),
    # the same for the four insertion arms of seed k: they stay paired.
    return self.seed + (1000 if self.name in INSERTION_ARMS else 0)


@dataclasses.dataclass(frozen=True)
class Prep:
  """A preparation step of a setting: its command and the file that marks it done."""

  key: str
  command: tuple[str, ...]
  marker: str


def token_root(root: Path) -> Path:
  return Path(root) / "tokens"


def token_data(root: Path) -> Path:
  return token_root(root) / "data"


def preps(root: Path | None = None, smoke: bool = False) -> list[Prep]:
  """The token setting's data: the byte corpus's files copied (so prepare-data reads the
  same files), a BPE trained on their training split, the shards."""
  root = Path(ROOT if root is None else root)
  t = token_root(root)
  vocab = 320 if smoke else TOKEN_VOCAB
  val = SMOKE_TOKEN_VAL_FRACTION if smoke else TOKEN_VAL_FRACTION
  py = "python"   # shown as is; `run` substitutes this interpreter
  corpus = [py, "-m", "experiments.reproduce", "export-corpus", f"--out={t / 'corpus'}"]
  if smoke:
    corpus.append("--max_files=24")
  return [
      Prep("tokens/corpus", tuple(corpus), str(t / "corpus" / ".done")),
      Prep("tokens/tokenizer", (py, "-m", "experiments", "train-tokenizer",
                                f"--input={t / 'corpus'}", f"--vocab_size={vocab}",
                                f"--val_fraction={val}", f"--out={t / 'tok'}"),
           str(t / "tok" / "tokenizer.json")),
      Prep("tokens/data", (py, "-m", "experiments", "prepare-data", f"--input={t / 'corpus'}",
                           f"--tokenizer={t / 'tok'}", f"--out={token_data(root)}",
                           f"--val_fraction={val}", "--workers=1"),
           str(token_data(root) / "manifest.json")),
  ]


def export_corpus(out: Path, max_files: int = 0) -> int:
  """Copies the embedded byte corpus's files (both splits, relative paths kept) to `out`:
  the token setting tokenizes exactly the bytes the byte setting reads."""
  from experiments.data.corpus import CorpusSpec, corpus_root, list_files

  spec = CorpusSpec()
  source = corpus_root(spec)
  files = list_files(spec)
  if max_files:
    files = files[:max_files]
  out = Path(out)
  for rel in files:
    target = out / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / rel, target)
  (out / ".done").write_text(f"{len(files)} files\n")
  print(f"done: {len(files)} files of the embedded corpus in {out}")
  return 0


def _seeds(setting: str, arm: str) -> tuple[int, ...]:
  return tuple(range(5 if arm in FIVE_SEEDS else 3))


def plan() -> list[Run]:
  runs = []
  for setting in SETTINGS:
    for arm in ARMS[setting]:
      runs += [Run(setting, arm, f"{CONFIG}:{setting},{arm}", s) for s in _seeds(setting, arm)]
  # Insertion from the final (mature) baselines: 300 more steps, a fresh schedule.
  for seed in range(3):
    base = f"bytes/baseline_s{seed}"
    start = (f"--config.init_from={{root}}/{base}", f"--config.train.steps={INSERT_STEPS}",
             "--config.train.ckpt_every=100", "--config.train.eval_every=100")
    for name, arm in (("continued_low", "baseline,insert_low"),
                      ("inserted_low", "lngram_r16,insert_low"),
                      ("continued_full", "baseline"), ("inserted_full", "lngram_r16")):
      runs.append(Run("bytes", name, f"{CONFIG}:bytes,{arm}", seed, start,
                      after=base, steps=INSERT_STEPS))
  return runs + vlm_plan()


def vlm_plan() -> list[Run]:
  """PVM's long-answer rerun: one stage-0 base per seed, then each Stage I arm from it."""
  runs = [Run(VLM, "base", "vlm_long_base.py" + (f":s{s}" if s else ""), s,
              steps=sum(VLM_PHASE_STEPS["base"])) for s in VLM_SEEDS]
  for seed in VLM_SEEDS:
    base = f"{VLM}/base_s{seed}"
    start = (f"--config.vlm.stage.init_from={{root}}/{base}",
             f"--config.vlm.scenes.data_dir={{root}}/{base}/data")
    for name, arg in VLM_ARMS:
      args = ",".join(filter(None, (arg, f"s{seed}" if seed else "")))
      runs.append(Run(VLM, name, "vlm_long_sft.py" + (f":{args}" if args else ""), seed,
                      start, after=base, steps=sum(VLM_PHASE_STEPS["sft"])))
  return runs


def run_dir(run: Run, root: Path | None = None) -> Path:
  """The directory the run reads (its own or the one it shares) under `root` (default
  ROOT, read at call time)."""
  return Path(ROOT if root is None else root) / run.workdir.relative_to(ROOT)


def records_root(root: Path | None = None) -> Path:
  """Where the queue keeps the records of the runs under `root`: RECORDS for ROOT (the
  repository's own), else `<root>/records` (a smoke or scratch queue's)."""
  root = Path(ROOT if root is None else root)
  return Path(RECORDS) if root.resolve() == Path(ROOT).resolve() else root / "records"


def recorded(run: Run, root: Path | None = None) -> bool:
  """The run's record (experiments/run_records.py) says it finished, under this design."""
  return finished(run, records_root(root))


def record(run: Run, root: Path | None = None) -> list[str]:
  """Writes (or refreshes) the record of a run finished under `root`; the names written.
  A record is kept, and says so, where the run trained again differs from it (`diverged`)."""
  if not finished(run, root):
    return []
  differs = diverged(run, root)
  if differs:
    print(f"record {run.key} kept: {differs}", flush=True)
    return []
  return run_records.write_record(run_dir(run, root), run_dir(run, records_root(root)))


def diverged(run: Run, root: Path | None = None) -> str | None:
  """Why a recorded run trained again under `root` is not its record, or None: the first
  logged number that differs (`run_records.first_difference`). Runs that started from
  the record's checkpoint would not share the new one, so neither the record nor the
  pairing may silently change; delete the record (and those runs') to accept the new run."""
  if not recorded(run, root):
    return None
  return _difference_line(*run_records.first_difference(run_dir(run, root),
                                                        run_dir(run, records_root(root))))


def _difference_line(compared: int, first: dict | None) -> str | None:
  if first is None:
    return None
  return (f"trained again, it differs from its record at step {first['step']} "
          f"({first['key']} {first['run']!r} vs {first['record']!r}; {compared} logged steps "
          f"agreed before it): another CPU or other XLA flags (stamp `cpus`, `xla_flags`)?")


SMOKE_STEPS = 4   # base.smoke's train.steps, which every smoke run (and continuation) trains


def stamp(run: Run, smoke: bool = False) -> dict:
  return {"design": DESIGN, "key": run.key, "config": run.config, "seed": run.seed,
          "steps": SMOKE_STEPS if smoke else steps(run)}


def stamped_steps(run: Run, root: Path | None = None) -> int:
  """The steps the run's stamp says it trains (a smoke queue's 4), else `steps(run)`."""
  try:
    return int(json.loads((run_dir(run, root) / STAMP).read_text()).get("steps", steps(run)))
  except (OSError, ValueError):
    return steps(run)


def stale(run: Run, root: Path | None = None) -> bool:
  """The directory exists with training output but not this design's stamp."""
  workdir = run_dir(run, root)
  if not (workdir / "metrics.jsonl").exists() and not (workdir / "checkpoints").exists():
    return False
  try:
    return json.loads((workdir / STAMP).read_text()).get("design") != DESIGN
  except (OSError, ValueError):
    return True


def final_eval(rows: list[dict], steps: int) -> float | None:
  """Validation bits per unit of the metrics row at step `steps`, if the run got there."""
  for row in rows:
    if row.get("step") == steps and "eval/bits_per_byte" in row:
      return float(row["eval/bits_per_byte"])
  return None


def final_bits_per_byte(run: Run, root: Path | None = None) -> float | None:
  """Validation bits per unit of the run's final evaluation; None until it is written
  (or when the directory is stale)."""
  if stale(run, root):
    return None
  return final_eval(read_metrics(run_dir(run, root)), stamped_steps(run, root))


def finished(run: Run, root: Path | None = None) -> bool:
  """The final evaluation's metrics row exists (the loop writes it last), not stale; a
  VLM run's `metrics.json` (its stage's final evaluation, written after training)."""
  if run.experiment == VLM:
    return not stale(run, root) and (run_dir(run, root) / "metrics.json").exists()
  return final_bits_per_byte(run, root) is not None


def steps(run: Run) -> int:
  return run.steps


def step_offset(run: Run, by_key: dict[str, Run] | None = None) -> int:
  """Where a run's own step 0 lies on its model's training clock: the steps of the run
  whose checkpoint it starts from (`init_from`, the insertion), else 0."""
  if run.after is None or not any(o.startswith("--config.init_from=") for o in run.overrides):
    return 0
  by_key = by_key or {r.key: r for r in plan()}
  return steps(by_key[run.after])


# The analyses of `lngram-exp analyze` on an LM run (experiments.analysis.run.LM_ANALYSES).
ANALYSES = ("utilisation", "id_knn", "associations", "distributed", "stability", "injection")
RECORD_ANALYSES = ANALYSES[:4]
ID_ARMS = ("lngram_r16", "lngram_r64", "lngram_r16_frozen")   # every finished seed
ID_SETTING = "bytes"          # `analyze` reads byte-level runs
MAX_POSITIONS = 20000         # enough positions for the stratum x byte permutation cells
INSERTION_PAIR = ("bytes/inserted_low_s0", "bytes/lngram_r16_s0")   # inserted, from step 0
INSERTION_ANALYSES = ("stability", "injection")   # App. B.2 and B.3
# The inserted run keeps its own steps 100, 200, 300 (model steps 700 ... 900); stability
# over own 100 -> 300 is a 200-step interval like the from-scratch run's last (400 -> 600).
STABILITY_STEPS = {"bytes/inserted_low_s0": (100, 300)}


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


def _shard(spec: str | None) -> tuple[int, int]:
  if not spec:
    return 0, 1
  try:
    i, k = (int(x) for x in spec.split("/"))
  except ValueError:
    raise SystemExit(f"error: --shard={spec!r} must be I/K with 0 <= I < K") from None
  if not 0 <= i < k:
    raise SystemExit(f"error: --shard={spec!r} must be I/K with 0 <= I < K")
  return i, k


def status(run: Run, root: Path) -> str:
  """done (finished here, or recorded: trained elsewhere), stale, part or todo."""
  if stale(run, root):
    return "stale"
  if finished(run, root) or recorded(run, root):
    return "done"
  return "part" if (run_dir(run, root) / "metrics.jsonl").exists() else "todo"


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


def prepared_val_fraction(root: Path) -> float | None:
  """The validation fraction the token data under `root` was prepared with (its
  manifest's split), or None where none is prepared."""
  try:
    manifest = json.loads((token_data(root) / "manifest.json").read_text())
    return float(manifest["split"]["val_fraction"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _stamped_list(workdir: Path, key: str) -> list[str]:
  try:
    values = json.loads((Path(workdir) / STAMP).read_text()).get(key, [])
  except (OSError, ValueError, AttributeError):
    return []
  return [str(v) for v in values] if isinstance(values, list) else []


def xla_flags_seen(workdir: Path) -> list[str]:
  """The XLA_FLAGS every attempt at the run trained under, from its stamp ([] if none
  recorded). Float rounding follows XLA's thread count, so runs trained (or resumed) under
  different flags are not bit-comparable; the report prints what the runs used."""
  return _stamped_list(workdir, "xla_flags")


def cpus_seen(workdir: Path) -> list[str]:
  """The CPUs (`cpu_signature`) every attempt at the run trained on ([] if none recorded):
  XLA's CPU kernels follow the vector ISA, so one config and seed can end differently on
  another machine (DESIGN: the byte baseline's seed 0 trained on two machines)."""
  return _stamped_list(workdir, "cpus")


def cpu_signature() -> str:
  """This machine's CPU as far as float rounding goes: its model name and the widest
  vector ISA XLA can use (avx512 / avx2 / the architecture otherwise)."""
  import platform

  model, flags = "", set()
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      key, _, value = line.partition(":")
      if key.strip() == "model name" and not model:
        model = value.strip()
      elif key.strip() in ("flags", "Features") and not flags:
        flags = set(value.split())
  except OSError:
    pass
  isa = next((name for name, flag in (("avx512", "avx512f"), ("avx2", "avx2"))
              if flag in flags), platform.machine())
  return f"{model or platform.processor() or platform.machine()} ({isa})"


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
  recorded run whose checkpoint is needed here: another run of `order` not done starts
  from it, or (with `then_analyze`) its record lacks analyses it is given. Such a run
  trains again (a record mirrors its run's latest output)."""
  here = {key for key, run in by_key.items() if finished(run, root)}
  kept = {key for key, run in by_key.items() if key not in here and recorded(run, root)}
  need = {run.after for run in order
          if run.after in kept and run.key not in here | kept}
  if then_analyze:
    need |= {run.key for run in order if run.key in kept
             and not all(analysed(run, n, root) for n in wanted_analyses(run)[0])}
  return here | (kept - need)


def _trained(run: Run, root: Path) -> None:
  """After a run trained: its record, written or refreshed."""
  written = record(run, root)
  if written:
    print(f"record {run.key}: {', '.join(written)} -> {run_dir(run, records_root(root))}",
          flush=True)


# What the median step time x steps leaves out: start-up and compilation, the three
# evaluations over 447 KB and the checkpoint writes. The byte baseline, seed 0, pinned to
# one core beside another run: 1,095 s from its stamp to its last metrics row against
# 834 s of steps (x1.31).
DEADLINE_MARGIN = 1.35


# PVM's rerun in phases of steps: stage 0 trains vlm_long_base.py's curriculum (1,800 steps
# of 1-2 objects, then 2,000 of every count), Stage I vlm_long_sft.py's 600 steps (a test
# checks both against the configs).
VLM_PHASE_STEPS = {"base": (1800, 2000), "sft": (600,)}
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
  time (run_records.train_seconds) of the recorded runs of its arm and setting, else the
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
  if same_arm:
    typical = sorted(same_arm)[len(same_arm) // 2]
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
# {"name,name": seconds} in the run directory: this machine's timing, not part of a record.
ANALYSIS_SECONDS = "analyze_seconds.json"


def _analysis_kind(names) -> str:
  return "vlm" if any(n in VLM_ANALYSES for n in names) else "record"


def analysis_seconds(run: Run, root: Path) -> dict[str, float]:
  """The analyses timed on `run` under `root` by `analyze`: {"name,name": seconds}."""
  try:
    timed = json.loads((run_dir(run, root) / ANALYSIS_SECONDS).read_text())
    return {str(k): float(v) for k, v in timed.items()} if isinstance(timed, dict) else {}
  except (OSError, ValueError, TypeError):
    return {}


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


def _stale_line(run: Run, root: Path) -> str:
  return (f"skip {run.key}: {run_dir(run, root)} is stale (no {STAMP} of design {DESIGN}: "
          "an older design's run); move it away to train this run")


def run_queue(runs: list[Run], root: Path, *, smoke: bool = False,
              max_runs: int | None = None, shard: tuple[int, int] = (0, 1),
              claim: bool = False, poll_s: float = 60.0, then_analyze: bool = False,
              until: float | None = None) -> int:
  """Trains the unfinished `runs` in `training_order`: with `claim`, each takes the first
  run no live process has claimed (`experiments/claims.py`), waiting while a run it needs
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
    if stale(run, root):
      print(_stale_line(run, root), flush=True)
      continue
    if run.after is not None and run.after not in done:
      print(f"skip {run.key}: waits for {run.after}", flush=True)
      continue
    differs = run.after is not None and diverged(by_key[run.after], root)
    if differs:
      print(_diverged_line(run, differs), flush=True)
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
    _trained(run, root)
    done.add(run.key)
    if then_analyze:
      analyze(root=root, keys={run.key})
  return 0


def _diverged_line(run: Run, differs: str) -> str:
  return (f"skip {run.key}: {run.after} {differs} Its recorded arms started from the "
          "record's checkpoint, so this one would not pair with them.")


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
      if stale(run, root):
        say(run.key, _stale_line(run, root))
        continue
      if run.after is not None and run.after not in done:
        if claims.holder(run_dir(by_key[run.after], root)) is not None:
          waiting.append(run.key)   # another process trains what it starts from
        else:
          say(run.key, f"skip {run.key}: waits for {run.after}")
        continue
      differs = run.after is not None and diverged(by_key[run.after], root)
      if differs:
        say(run.key, _diverged_line(run, differs))
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
        _trained(run, root)
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


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("action",
                      choices=("list", "run", "analyze", "record", "export-corpus"))
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
  root = Path(ns.root) if ns.root else (SMOKE_ROOT if ns.smoke else ROOT)
  runs = select(plan(), ns.only)
  if ns.action == "record":
    return record_all(runs, root)
  if ns.action == "list":
    return list_queue(runs, root, ns.smoke)
  if ns.claim and ns.shard:
    raise SystemExit("error: --claim and --shard split the queue two ways; use one")
  return run_queue(runs, root, smoke=ns.smoke, max_runs=ns.max_runs, shard=_shard(ns.shard),
                   claim=ns.claim, then_analyze=ns.analyze, until=parse_until(ns.until))


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
      differs = _difference_line(compared, first)
      if differs:
        note += ("; " if note else "   # ") + f"DIFFERS: {differs}"
      elif compared and not finished(run, root):
        note += f"; equal to its record over the {compared} steps logged here"
    print(f"{state:6s}" + " ".join(run.command(root, smoke)) + note)
    if state in ("part", "todo") or run in again:
      expected = expected_train_s(run, root, factor)
      if expected is None:
        unknown.append(run.key)
      else:
        left_s += expected
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


def record_all(runs: list[Run], root: Path) -> int:
  """Writes or refreshes the record of every run of `runs` finished under `root`."""
  for run in runs:
    if finished(run, root):
      _trained(run, root)
  kept = sum(recorded(run, root) for run in runs)
  print(f"{kept} of {len(runs)} runs recorded under {records_root(root)}", flush=True)
  return 0


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
    _trained(run, root)   # the record gets what was written (a failed analysis: nothing new)
  return status_


if __name__ == "__main__":
  sys.exit(main())
