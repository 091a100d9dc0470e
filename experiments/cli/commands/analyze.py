"""`lngram-exp analyze --workdir=runs/x [--step=N] [--which=...]`: the Lngram ID analyses of
an LM run (experiments/analysis); attention decay, accuracy by length, LogitLens and
grounding of a VLM run (experiments/vlm). Which flags apply depends on the run's kind."""

from __future__ import annotations

COMMANDS = {"analyze": "Lngram ID analyses of an LM run; attention, accuracy, LogitLens and "
                       "grounding analyses of a VLM run"}
FLAGS_OF = {"analyze": {"workdir", "which", "step"}}
REQUIRED_OF = {"analyze": ("workdir",)}
# The flags of each kind of run, on top of FLAGS_OF["analyze"].
ANALYZE_FLAGS_OF = {"lm": {"max_positions", "seed", "n_perm", "stability_steps", "dedup",
                           "max_file_share", "perm_strata", "n_rho_boot"},
                    "vlm": {"n", "max_new_tokens"}}
VLM_ANALYSES = ("attention", "accuracy", "logit_lens", "grounding")
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
  """The run's kind decides which analyses, and so which flags, apply."""
  del command, argv
  from experiments.cli import preflight
  from experiments.cli.overrides import given_flags, refuse_flags
  from experiments.jobs.restore import run_job_name
  preflight.check_workdir(f.workdir, train=False)
  kind = run_job_name(f.workdir)
  if kind not in ANALYZE_FLAGS_OF:
    raise ValueError(f"{f.workdir} is a {kind} run; analyze reads LM runs (the ID analyses) "
                     "and tiny-VLM runs.")
  refuse_flags(given_flags(f), f"analyze of an {kind.upper()} run",
               FLAGS_OF["analyze"] | ANALYZE_FLAGS_OF[kind],
               {f"analyze of {k.upper()} runs": v for k, v in ANALYZE_FLAGS_OF.items()})
  if kind == "vlm":
    return analyze_command(f.workdir, kind, which=f.which, step=f.step, n=f.n,
                           max_new_tokens=f.max_new_tokens)
  return analyze_command(f.workdir, kind, which=f.which, step=f.step, seed=f.seed,
                         max_positions=f.max_positions, n_perm=f.n_perm,
                         stability_steps=f.stability_steps, dedup=f.dedup,
                         max_file_share=f.max_file_share, perm_strata=f.perm_strata,
                         n_rho_boot=f.n_rho_boot)


def analyze_command(workdir, kind: str, *, which=None, step: int | None = None, n: int = 32,
                    max_new_tokens: int | None = None, stability_steps=None,
                    **lm_options) -> int:
  """Runs the analyses of a run of `kind` ("lm": `analyze_lm`, with `lm_options`
  seed, max_positions, n_perm, ...; "vlm": `experiments.analysis.vlm_run.analyze`)."""
  import functools

  from experiments.cli import preflight
  from experiments.jobs.restore import restore_module
  preflight.check_workdir(workdir, train=False)
  restore = functools.partial(restore_module, workdir)   # the one place analyses restore
  if kind == "vlm":
    from experiments.analysis.vlm_run import analyze
    out = analyze(workdir, restore=restore, which=tuple(which or VLM_ANALYSES), step=step,
                  n=n, max_new_tokens=max_new_tokens)
    print(f"wrote {sorted(out)} (.json, .png) into {workdir}")
    return 0
  from experiments.analysis.run import LM_ANALYSES, analyze_lm
  steps = list(stability_steps or [])
  if not all(str(s).strip().isdigit() for s in steps):
    raise ValueError(f"--stability_steps={','.join(map(str, steps))}: give checkpoint steps "
                     "as integers, e.g. 100,300.")
  out = analyze_lm(workdir, restore=restore, which=tuple(which or LM_ANALYSES), step=step,
                   stability_steps=tuple(int(s) for s in steps) or None, **lm_options)
  print(f"wrote {sorted(out)} (.json, .md, .png) into {workdir}/analysis")
  return 0
