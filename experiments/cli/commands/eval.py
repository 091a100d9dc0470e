"""`lngram-exp eval --workdir=runs/x [--step=N] [--mesh=data=2,table=4]`: the validation
metrics of an LM run's checkpoint (the newest, or --step): `eval/bits_per_byte` on a byte
corpus, `eval/bits_per_token` on token data."""

from __future__ import annotations

import sys

COMMANDS = {"eval": "validation bits per byte (per token on token data) of an LM run's "
                    "checkpoint"}
FLAGS_OF = {"eval": {"workdir", "step", "mesh"}}
REQUIRED_OF = {"eval": ("workdir",)}
FLAGS = []   # --workdir, --step, --mesh: experiments/cli/flags.py


def run(command: str, f, argv: list[str]) -> int:
  del command, argv
  return eval_command(f.workdir, step=f.step, mesh=f.mesh)


def eval_command(workdir, *, step: int | None = None, mesh: str | None = None) -> int:
  """Prints the validation metrics of an LM run's checkpoint (the newest, or `step`)."""
  from experiments.cli import preflight
  from experiments.jobs.lm.evaluate import evaluate_checkpoint
  preflight.check_workdir(workdir, train=False)
  metrics, step = evaluate_checkpoint(workdir, step=step, mesh=preflight.mesh_block(mesh))
  print(f"checkpoint step {step} of {workdir}", file=sys.stderr)
  for key, value in sorted(metrics.items()):
    print(f"{key:<32} {value:.4f}")
  return 0
