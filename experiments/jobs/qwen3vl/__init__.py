"""PVM on Qwen3-VL as a job: Stage I (SFT) and Stage II (GRPO) from a Qwen3-VL checkpoint;
its hooks (experiments/jobs/registry.py lists them).

  task.py     the stages as trainer tasks, the processor, the memory plan line
  data.py     conversation batches
  planning.py  the plan hooks (`lngram-exp plan`)
"""

from __future__ import annotations

from experiments.jobs.registry import Checked

BLOCKS = ("train",)   # the qwen3vl block is checked by check_qwen3vl_config
A_CONFIG = "a qwen3vl config"


def check(config) -> Checked:
  """The numbers and the qwen3vl block (`hf_dir` a directory or a hub id); the model
  config comes from the checkpoint when the task is built (the processor is read first)."""
  from experiments.jobs.checks import check_experiment_config
  from experiments.jobs.qwen3vl.task import (
    check_is_qwen3vl,
    check_qwen3vl_config,
    with_local_checkpoint,
  )
  check_experiment_config(config)
  given = config.qwen3vl.hf_dir
  config = with_local_checkpoint(config)   # a hub id: its snapshot in the hub's cache
  check_qwen3vl_config(config)
  if config.qwen3vl.hf_dir:
    check_is_qwen3vl(config.qwen3vl.hf_dir, given)
  return Checked("qwen3vl", config)


def make_task(checked: Checked, workdir, mesh=None):
  from experiments.jobs.qwen3vl.task import qwen3vl_task
  return qwen3vl_task(checked.config, workdir, mesh)


def build(saved: dict, rngs):
  from experiments.vlm.qwen3vl.config import Qwen3VLConfig
  from experiments.vlm.qwen3vl.model import Qwen3VL
  model = Qwen3VL(Qwen3VLConfig.from_dict(saved["model"]), rngs=rngs)
  return model, model


def param_bytes(checked: Checked) -> None:
  del checked   # the checkpoint sets the size: `memory_line` plans it per device


def memory_line(checked: Checked, devices: int) -> str:
  from experiments.jobs.qwen3vl.task import plan_line
  return plan_line(checked.config, devices)


def planner():
  """The plan hooks (experiments/jobs/qwen3vl/planning.py)."""
  from experiments.jobs.qwen3vl import planning
  return planning


def analyze(workdir, restore, *, which=None, step: int | None = None, **options) -> str:
  """None of the analyses read a Qwen3-VL run: a one-line refusal."""
  del restore, which, step, options
  raise ValueError(f"{workdir} is a qwen3vl run; analyze reads LM runs (the ID analyses) "
                   "and tiny-VLM runs.")


def summary(checked: Checked, result: dict) -> str:
  """Stage I / II: the last logged loss or reward."""
  del checked
  final = result["final"]
  key = "reward" if final["stage"] == "grpo" else "loss"
  return f"Qwen3-VL {final['stage']}: last train/{key} {final[key][-1]}"
