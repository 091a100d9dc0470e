"""`lngram-exp analyze --workdir=runs/x [--step=N] [--which=...]`: the analyses of a run,
through its job's `analyze` hook (experiments/jobs/registry.py): the Lngram ID analyses
of an LM run (experiments/analysis/run.py); attention decay, accuracy by length, LogitLens
and grounding of a tiny-VLM run (experiments/analysis/vlm_run.py). Which flags apply
depends on the run's job."""

from __future__ import annotations

COMMANDS = {"analyze": "Lngram ID analyses of an LM run; attention, accuracy, LogitLens and "
                       "grounding analyses of a VLM run"}
FLAGS_OF = {"analyze": {"workdir", "which", "step"}}
REQUIRED_OF = {"analyze": ("workdir",)}
# The flags of each job's analyses, on top of FLAGS_OF["analyze"] (a job missing here has
# none: its `analyze` hook refuses).
ANALYZE_FLAGS_OF = {"lm": {"max_positions", "seed", "n_perm", "stability_steps", "dedup",
                           "max_file_share", "perm_strata", "n_rho_boot"},
                    "vlm": {"n", "max_new_tokens"}}
# (absl kind, name, default, lower bound, help); --workdir, --step, --seed and
# --max_new_tokens: experiments/cli/flags.py.
FLAGS = [
    ("integer", "n", 32, 1, "analyze (VLM runs): validation scenes."),
    ("list", "which", None, None, "analyze: which analyses (default all), e.g. "
     "utilisation,id_knn,stability (LM runs) or attention,accuracy,grounding (VLM runs)."),
    ("integer", "max_positions", 4000, 1, "analyze (LM runs): positions per split (bytes; "
     "tokens of a run on token data)."),
    ("list", "stability_steps", None, None, "analyze (LM runs): kept checkpoints to compare, "
     "e.g. 100,300."),
    ("integer", "n_perm", 500, 0, "analyze (LM runs): ID-KNN permutations."),
    ("bool", "dedup", True, None, "analyze (LM runs): remove near-duplicate files from both "
     "splits (experiments/data/dedup.py)."),
    ("float", "max_file_share", 0.05, None, "analyze (LM runs): most of a split's positions "
     "one file may give."),
    ("string", "perm_strata", "nuisance_byte", None, "analyze (LM runs): the permutation "
     "test's cells, nuisance or nuisance_byte (stratum x current byte, or token)."),
    ("integer", "n_rho_boot", 500, 0, "analyze (LM runs): bootstrap resamples of the rho CIs."),
]


def run(command: str, f, argv: list[str]) -> int:
  """The run's job decides which analyses, and so which flags, apply."""
  del command, argv
  from experiments.cli import preflight
  from experiments.cli.overrides import given_flags, refuse_flags
  from experiments.jobs.registry import job
  from experiments.jobs.restore import run_job_name
  preflight.check_workdir(f.workdir, train=False)
  kind = run_job_name(f.workdir)
  if kind not in ANALYZE_FLAGS_OF:   # no analysis reads its runs: the job's own refusal
    job(kind).analyze(f.workdir, None)
  refuse_flags(given_flags(f), f"analyze of an {kind.upper()} run",
               FLAGS_OF["analyze"] | ANALYZE_FLAGS_OF[kind],
               {f"analyze of {k.upper()} runs": v for k, v in ANALYZE_FLAGS_OF.items()})
  return analyze_command(f.workdir, kind, which=f.which, step=f.step,
                         **{name: getattr(f, name) for name in sorted(ANALYZE_FLAGS_OF[kind])})


def analyze_command(workdir, kind: str, *, which=None, step: int | None = None,
                    **options) -> int:
  """Runs the analyses of a run of job `kind` (its `analyze` hook, with `options`: the
  flags of ANALYZE_FLAGS_OF[kind]) and prints what they wrote."""
  import functools

  from experiments.cli import preflight
  from experiments.jobs.registry import job
  from experiments.jobs.restore import restore_module
  preflight.check_workdir(workdir, train=False)
  restore = functools.partial(restore_module, workdir)   # the one place analyses restore
  print(job(kind).analyze(workdir, restore, which=which, step=step, **options))
  return 0
