"""Which job a config (or a saved run) is: the one place that reads it.

A job is what a run trains: "lm" (the decoder LM, byte or token data, HF backbones),
"vlm" (the tiny VLM's stages) or "qwen3vl" (PVM on Qwen3-VL, Stage I / II). A config
selects a job by the block it carries (`vlm`, `qwen3vl`; an LM config has neither); a
saved run by the "kind" its checkpoint's config JSON records.

Each job is a package `experiments/jobs/<name>/` whose `__init__` holds the job's hooks
(importing nothing heavy at module level, so `restore` needs neither grain nor the
data stack); adding a job is one such package and its name in JOBS:

  BLOCKS                        the config blocks the job cannot run without
  A_CONFIG                      how a refusal names the job's config ("an LM config")
  check(config) -> Checked      every one-line refusal of the job's config, and the model
                                config built from it: once per run (`make_task` takes it)
  make_task(checked, workdir, mesh) -> Task      the task the trainer runs
  build(saved, rngs) -> module  the trained module a checkpoint's saved config describes
                                (`experiments.restore`)
  memory_line(checked, devices) -> str | None    the memory plan `train` prints for
                                `plan_devices` (None: the job has none)
  param_bytes(checked) -> int | None   bytes of the model's parameters from shapes (None:
                                the checkpoint sets the size; no machine-memory check)
  summary(checked, result) -> str      the line `lngram-exp train` ends with
  planner() -> module | None    the job's plan hooks, imported when asked (None: the job
                                is not planned; `lngram-exp plan` refuses in one line):
      check_mesh(config, sizes)            refuses a mesh the config cannot use
      abstract_run(config, mesh)           (AbstractRun, model config, geometry): the
                                           step and its state from shapes alone
                                           (experiments/jobs/abstract.py)
      counts(config, run, mc, geo, devices, token_shards)   parameters and FLOPs by
                                           formula, the activation estimate, the rows
  analyze(workdir, restore, *, which, step, **options) -> str   runs the analyses of a
                                run of the job (`lngram-exp analyze`; `restore` restores
                                its checkpoints, `options` are the job's analyze flags)
                                and returns the line the command prints; a job whose
                                runs no analysis reads refuses in one line
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

JOBS = ("lm", "vlm", "qwen3vl")
# The config block that selects each job other than "lm", in the order they are looked for.
SELECTING_BLOCK = {"qwen3vl": "qwen3vl", "vlm": "vlm"}


@dataclasses.dataclass(frozen=True)
class Checked:
  """A config its job has checked: `config` as the job runs it (an LM config with
  `init_from=hf:DIR` takes the checkpoint's backbone fields) and `model`, the model config
  built from it (None where the checkpoint sets the model: Qwen3-VL)."""
  job: str
  config: Any
  model: Any = None


def job_name(config) -> str:
  """"lm", "vlm" or "qwen3vl": the job an experiment config describes."""
  return next((name for name, block in SELECTING_BLOCK.items() if block in config), "lm")


def saved_job_name(saved: dict) -> str:
  """The job of a checkpoint's saved config (runs written before the VLM stages joined
  the loop record none: "lm")."""
  from experiments.trainer.errors import CheckpointError
  name = saved.get("kind", "lm")
  if name not in JOBS:
    raise CheckpointError(f"unknown run kind {name!r} in the checkpoint's config.")
  return name


def job(name: str):
  """The hooks of job `name` (the module docstring lists them)."""
  if name not in JOBS:
    raise ValueError(f"unknown job {name!r}; the jobs are {', '.join(JOBS)}.")
  return importlib.import_module(f"experiments.jobs.{name}")


def job_of(config):
  """The hooks of the job an experiment config describes."""
  return job(job_name(config))
