"""The reproduction's design: its settings, arms, seeds and runs (`plan`), where each
run lives (`run_dir`) and what it trains (`Run.command`), and the token setting's data
preparation (`preps`)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

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


# PVM's rerun in phases of steps: stage 0 trains vlm_long_base.py's curriculum (1,800 steps
# of 1-2 objects, then 2,000 of every count), Stage I vlm_long_sft.py's 600 steps (a test
# checks both against the configs).
VLM_PHASE_STEPS = {"base": (1800, 2000), "sft": (600,)}


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


SMOKE_STEPS = 4   # base.smoke's train.steps, which every smoke run (and continuation) trains


def stamp(run: Run, smoke: bool = False) -> dict:
  return {"design": DESIGN, "key": run.key, "config": run.config, "seed": run.seed,
          "steps": SMOKE_STEPS if smoke else steps(run)}


def steps(run: Run) -> int:
  return run.steps


def step_offset(run: Run, by_key: dict[str, Run] | None = None) -> int:
  """Where a run's own step 0 lies on its model's training clock: the steps of the run
  whose checkpoint it starts from (`init_from`, the insertion), else 0."""
  if run.after is None or not any(o.startswith("--config.init_from=") for o in run.overrides):
    return 0
  by_key = by_key or {r.key: r for r in plan()}
  return steps(by_key[run.after])
