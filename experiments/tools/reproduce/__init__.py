"""The Lngram v2 paper's comparisons at small scale, paired by seed, in two settings.

    python -m experiments.tools.reproduce list [--only=bytes,tokens,vlm_long] [--smoke] [--root=DIR]
    python -m experiments.tools.reproduce run  [--only=bytes] [--max_runs=N] [--claim | --shard=I/K]
                                         [--analyze] [--until=+MINUTES|ISO] [--smoke]
    python -m experiments.tools.reproduce analyze [--force] [--dry_run]
    python -m experiments.tools.reproduce record [--only=...] [--root=DIR]
    python -m experiments.tools.reproduce declared [--root=DIR]

`run` first prepares what a setting needs (the token data: a copy of the corpus, a
4,096-id BPE trained on its training split, `lngram-exp prepare-data`), then trains
the runs one after another in `runs/repro/<setting>/<arm>_s<seed>` (a rerun resumes a
cut run exactly and skips finished ones). For several processes side by side, `--claim`
makes each take the next run no other live process has claimed (a `<run>.claim` file,
experiments/tools/reproduce/claims.py), waiting while a run it starts from trains elsewhere; `--shard=I/K`
instead takes every K-th run from the I-th (a fixed split, e.g. over machines without a
shared file system; a shard skips a run whose start is another shard's and not done).
Every run is an ordinary `lngram-exp train` of `experiments/configs/repro_lm.py:<setting>,
<arm>`; the seed sets the parameters and the batch order, and since memory branches draw
their init after the backbone, the runs of one seed share the backbone's init and data:
arms are compared paired by seed (experiments/analysis/stats/, `python -m experiments.tools.report`).

Every run that finishes (and every analysis written) is RECORDED: the few files its
numbers come from (stamp, metrics, per-document evaluation, analyses, provenance;
experiments/tools/reproduce/records.py) are copied to
`experiments/results/records/<setting>/<arm>_s<seed>`, which is committed, while the run
directory (checkpoints, TensorBoard) is not. The report reads the records, and the queue
counts a recorded run as done (`list` marks one without its checkpoint here), so results
outlive the machine that trained them; a recorded run trains again only where its
checkpoint is needed here (a run starting from it is not done, or with `--analyze` its
record lacks analyses). Trained again, it must log its record's numbers bit for bit
(training is deterministic on one CPU type under the same XLA flags): one that differs
keeps its record, starts no run from its checkpoint (those recorded from the old one
would not pair with them) and is flagged DIFFERS by `list`; `list` also says how many
logged steps agreed so far. The one exception is a twin: a recorded run that trains again
with `--analyze` only for the analyses its record lacks may start from a base that
differs; its record keeps its numbers and takes those analyses, named in `twin.json` with
why and the base's first 200 steps (the young baseline is checked against them). The runs that start from another (insertion, Stage I) train
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

The v3 controls (`control_plan`; the family `controls_v3` of `FAMILIES`, declared before
any of them trained), 3 seeds each: on bytes, v1 with its tables zeroed and frozen
(`lngram_v1_zerotable`: its dense path alone) and v1 with v2 r16's router and readout
parameters (`lngram_v1_r16`); Engram on tokens already holds v2 r16's table parameters
(within 0.15%: its lead is at matched table memory); and App. B.2 at an equal learning rate: the baseline's first 200
steps again (`baseline_young`, its 600-step schedule) and Lngram inserted into it at
0.05x the backbone LR (`inserted_young_low`, the same batches as `inserted_low`), whose
address stability (`analyze`, as every seed of `inserted_low`) is compared with the
mature insertion's. Their byte runs evaluate on the validation set deduplicated against
training (`data.dedup_validation`: the 7 `encodings/*` files with twins among the
training files left out, 27.9% of the scored bytes); the runs recorded before keep the
set they declared, and `declared` re-scores them on the deduplicated one from their
per-document losses. A family's runs stamp its digest (repro.json `declared`);
`declared` prints each family's claims from the records (paired t, Holm over the
family, verdicts once every claim has its seeds), and the scale check's
(experiments/tools/bench/scale_check.py, family `scale_check`, records under
`experiments/results/records/scale_check/`).

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
priced for the 12 of `vlm_long`, which take ~32 by their records; the 2-core machine of
that day trained ~1.6x faster); the `gpu` config arg runs the same comparison bigger on an
accelerator.
On 2 cores, two processes pinned to a core each with single-threaded XLA
(`XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" taskset
-c I python -m experiments.tools.reproduce run --claim`, I = 0, 1) train ~12% more steps per
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

The package's modules, each used by the ones after it: `design` (the settings, arms and
runs: `plan`, `Run`, `run_dir`; the declared families `FAMILIES`), `state` (what a run
directory says: stale, finished, recorded), `analyses` (the analyses each run is given and
`analyze`), `timing` (the expected times and the `--until` deadline), `queue`
(`run_queue`), `declared` (the declared families' claims from the records) and `cli`
(`main`, `list`). Their public names are re-exported here.
"""

from __future__ import annotations

from experiments.tools.reproduce.analyses import (
  ANALYSES,
  ANALYSIS_SECONDS,
  B2_CONTROL_RUNS,
  ID_ARMS,
  ID_SETTING,
  INSERTION_ANALYSES,
  INSERTION_PAIR,
  MAX_POSITIONS,
  RECORD_ANALYSES,
  STABILITY_STEPS,
  VLM_ANALYSES,
  VLM_ATTENTION_SCENES,
  VLM_MAX_NEW_TOKENS,
  analysed,
  analysis_jobs,
  analysis_path,
  analysis_seconds,
  analysis_written,
  analyze,
  analyze_command,
  vlm_analysis_written,
  vlm_final_step,
  wanted_analyses,
)
from experiments.tools.reproduce.cli import (
  list_queue,
  main,
)
from experiments.tools.reproduce.declared import (
  SCALE_DIR,
  claim_values,
  controls_section,
  dedup_set,
  scale_records,
  scale_section,
  scale_values,
)
from experiments.tools.reproduce.design import (
  ARMS,
  CONFIG,
  CONFIGS,
  CONTINUATION_ARMS,
  CONTROL_ARMS,
  CONTROL_SEEDS,
  DECLARED,
  DESIGN,
  EXPERIMENTS,
  FAMILIES,
  FIVE_SEEDS,
  INSERT_STEPS,
  INSERTION_ARMS,
  MEASURES,
  RECORDS,
  ROOT,
  SETTINGS,
  SMOKE_ROOT,
  SMOKE_STEPS,
  SMOKE_TOKEN_VAL_FRACTION,
  STAMP,
  STEPS,
  TIMED_LIKE,
  TOKEN_VAL_FRACTION,
  TOKEN_VOCAB,
  TRAINED_LAST,
  VLM,
  VLM_ARMS,
  VLM_PHASE_STEPS,
  VLM_SEEDS,
  YOUNG_BASE,
  YOUNG_INSERTED,
  YOUNG_STEPS,
  Claim,
  Family,
  Prep,
  Run,
  control_plan,
  declaration_digest,
  export_corpus,
  family_runs,
  plan,
  preps,
  records_root,
  run_dir,
  stamp,
  step_offset,
  steps,
  token_data,
  token_root,
  vlm_plan,
)
from experiments.tools.reproduce.queue import (
  parse_shard,
  queue_done,
  record_all,
  run_queue,
  select,
  training_order,
)
from experiments.tools.reproduce.state import (
  cpu_signature,
  cpus_seen,
  difference_line,
  diverged,
  final_bits_per_byte,
  final_eval,
  finished,
  prepared_val_fraction,
  record,
  recorded,
  refresh_record,
  stale,
  stamped_steps,
  status,
  xla_flags_seen,
)
from experiments.tools.reproduce.timing import (
  ANALYSIS_PRIOR_S,
  DEADLINE_MARGIN,
  VLM_PRIOR_STEP_S,
  expected_analysis_s,
  expected_train_s,
  parse_until,
  past_deadline,
  speed_factor,
  vlm_prior_s,
  vlm_stage,
)

__all__ = [
    "ROOT",
    "RECORDS",
    "SMOKE_ROOT",
    "CONFIGS",
    "CONFIG",
    "DESIGN",
    "STAMP",
    "STEPS",
    "INSERT_STEPS",
    "SETTINGS",
    "VLM",
    "VLM_SEEDS",
    "VLM_ARMS",
    "EXPERIMENTS",
    "TRAINED_LAST",
    "FIVE_SEEDS",
    "ARMS",
    "INSERTION_ARMS",
    "TOKEN_VOCAB",
    "TOKEN_VAL_FRACTION",
    "SMOKE_TOKEN_VAL_FRACTION",
    "VLM_PHASE_STEPS",
    "CONTROL_ARMS",
    "CONTROL_SEEDS",
    "CONTINUATION_ARMS",
    "YOUNG_BASE",
    "YOUNG_INSERTED",
    "YOUNG_STEPS",
    "TIMED_LIKE",
    "MEASURES",
    "FAMILIES",
    "DECLARED",
    "Claim",
    "Family",
    "declaration_digest",
    "family_runs",
    "control_plan",
    "SCALE_DIR",
    "claim_values",
    "controls_section",
    "dedup_set",
    "scale_records",
    "scale_section",
    "scale_values",
    "B2_CONTROL_RUNS",
    "Run",
    "Prep",
    "token_root",
    "token_data",
    "preps",
    "export_corpus",
    "plan",
    "vlm_plan",
    "run_dir",
    "records_root",
    "SMOKE_STEPS",
    "stamp",
    "steps",
    "step_offset",
    "stamped_steps",
    "stale",
    "final_eval",
    "final_bits_per_byte",
    "finished",
    "recorded",
    "record",
    "diverged",
    "difference_line",
    "refresh_record",
    "status",
    "xla_flags_seen",
    "cpus_seen",
    "cpu_signature",
    "prepared_val_fraction",
    "ANALYSES",
    "RECORD_ANALYSES",
    "ID_ARMS",
    "ID_SETTING",
    "MAX_POSITIONS",
    "INSERTION_PAIR",
    "INSERTION_ANALYSES",
    "STABILITY_STEPS",
    "VLM_ANALYSES",
    "VLM_ATTENTION_SCENES",
    "VLM_MAX_NEW_TOKENS",
    "vlm_final_step",
    "vlm_analysis_written",
    "analysis_path",
    "analysis_written",
    "wanted_analyses",
    "analysed",
    "analysis_jobs",
    "analyze_command",
    "ANALYSIS_SECONDS",
    "analysis_seconds",
    "analyze",
    "DEADLINE_MARGIN",
    "VLM_PRIOR_STEP_S",
    "vlm_stage",
    "vlm_prior_s",
    "expected_train_s",
    "ANALYSIS_PRIOR_S",
    "expected_analysis_s",
    "speed_factor",
    "parse_until",
    "past_deadline",
    "select",
    "training_order",
    "parse_shard",
    "queue_done",
    "run_queue",
    "record_all",
    "main",
    "list_queue",
]
