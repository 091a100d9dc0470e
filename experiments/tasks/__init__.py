"""What a job is: the LM and VLM tasks above the trainer, their checks and `restore`.

    run_train(config, workdir)    train (or resume) the run an experiment config
                                  describes: mesh, lock, task, `experiments.trainer.train`
    make_task(config, workdir, mesh)  the task alone (a VLM stage if the config has
                                  a `vlm` block, else the byte LM)
    tasks/lm.py, evaluate.py, sample.py   the LM task, its evaluation and sampling
    tasks/vlm.py, vlm_loss.py     VLM stage 0, Stage I, Stage II
    tasks/qwen3vl.py, qwen3vl_data.py   PVM on Qwen3-VL: Stage I, Stage II
    tasks/init_from.py            copying weights from an earlier run
    tasks/metrics.py              the memory branches' metrics protocol
    tasks/checks.py               checks before anything is built
    tasks/restore.py              restore(workdir) -> (model, config)
"""

from __future__ import annotations

from pathlib import Path

from experiments.tasks.checks import check_experiment_config, check_memory
from experiments.tasks.saved import saved_config


def make_task(config, workdir, mesh=None):
  """The task an experiment config describes, on `mesh`: a VLM stage if it has a
  `vlm` block, else the byte LM.

  Bad numbers and a model larger than this machine's memory are refused here,
  before the corpus is read or any parameter allocated.
  """
  check_experiment_config(config)
  if "qwen3vl" in config:   # a Qwen3-VL stage: its checkpoint sets the size
    from experiments.tasks.qwen3vl import qwen3vl_task
    return qwen3vl_task(config, workdir, mesh)
  check_memory(config)
  if "vlm" in config:
    from experiments.tasks.vlm import vlm_task
    return vlm_task(config, workdir, mesh)
  from experiments.tasks.lm import lm_task
  return lm_task(config, workdir, mesh)


def run_train(config, workdir, *, callback=None, task=None) -> dict:
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
    task = task or make_task(config, run.workdir, mesh)
    return loop.train(task, config.train, run.workdir, mesh, callback=callback, run=run)


__all__ = ["check_experiment_config", "check_memory", "make_task", "run_train",
           "saved_config"]
