"""The jobs a run can be (LM, tiny VLM, Qwen3-VL) above the trainer: their checks, tasks
and `restore`.

    run_train(config, workdir)    train (or resume) the run an experiment config
                                  describes: mesh, lock, task, `experiments.trainer.train`
    make_task(config, workdir, mesh)  the task alone
    job_of(config), job(name)     a job's hooks (registry.py: which job a config is, and
                                  what every job provides)
    lm/, vlm/, qwen3vl/           each job: its hooks (`__init__`), its task and helpers,
                                  its plan hooks (planning.py)
    abstract.py                   AbstractRun: what a planner hands `lngram-exp plan`
    init_from.py                  copying weights from an earlier run
    metrics.py                    the memory branches' metrics protocol
    checks.py                     checks before anything is built (every job's)
    restore.py                    restore(workdir) -> (model, config)
    saved.py                      the config a checkpoint records, and the resume check
"""

from __future__ import annotations

from pathlib import Path

from experiments.jobs.checks import check_experiment_config, check_memory
from experiments.jobs.registry import Checked, job, job_name, job_of
from experiments.jobs.saved import saved_config


def make_task(config, workdir, mesh=None, *, checked: Checked | None = None):
  """The task an experiment config describes, on `mesh`.

  `checked`: the job's `check(config)` when the caller ran it already (the CLI does,
  before it touches the workdir), so that a config is checked and its model config built
  once. A model larger than this machine's memory is refused here, before the corpus is
  read or any parameter allocated.
  """
  checked = checked or job_of(config).check(config)
  check_memory(checked)
  return job(checked.job).make_task(checked, workdir, mesh)


def run_train(config, workdir, *, callback=None, task=None, checked: Checked | None = None
              ) -> dict:
  """Trains (or resumes) the run `config` describes in `workdir`; the trainer's summary.

  The mesh (`config.mesh`) is checked before the workdir is touched; the task is
  built while the workdir is locked (it writes the corpus manifest, renders
  scenes). `task`: a prebuilt task (tests), else `make_task`. Returns
  {"step", "eval", "interrupted", "workdir", "final"} (`experiments.trainer.train`).
  """
  from experiments.trainer import loop
  from experiments.trainer.placement import make_train_mesh
  mesh = make_train_mesh(config.get("mesh"))
  with loop.open_run(Path(workdir)) as run:
    task = task or make_task(config, run.workdir, mesh, checked=checked)
    return loop.train(task, config.train, run.workdir, mesh, callback=callback, run=run)


__all__ = ["Checked", "check_experiment_config", "check_memory", "job", "job_name", "job_of",
           "make_task", "run_train", "saved_config"]
