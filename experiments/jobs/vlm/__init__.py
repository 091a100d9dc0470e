"""The tiny VLM's job: stage 0 (cell pretraining), Stage I (SFT with PVM), Stage II (GRPO);
its hooks (experiments/jobs/registry.py lists them).

  task.py  the stages as trainer tasks
  loss.py  the stages' losses
"""

from __future__ import annotations

from experiments.jobs.registry import Checked

BLOCKS = ("train",)   # the vlm block is checked by vlm_config
A_CONFIG = "a vlm config"


def check(config) -> Checked:
  from experiments.jobs.checks import check_experiment_config
  from experiments.jobs.vlm.task import check_stage
  from experiments.vlm.tiny.config import vlm_config
  check_experiment_config(config)
  model = vlm_config(config)
  check_stage(config)
  return Checked("vlm", config, model)


def make_task(checked: Checked, workdir, mesh=None):
  from experiments.jobs.vlm.task import vlm_task
  return vlm_task(checked.config, workdir, mesh, model_config=checked.model)


def build(saved: dict, rngs):
  """(trained module, model): stage 0 trains the VLM inside a cell-classifier wrapper."""
  from experiments.trainer.errors import CheckpointError
  from experiments.vlm.tiny.config import VLMConfig
  from experiments.vlm.tiny.model import VLM
  model = VLM(VLMConfig.from_dict(saved["model"]), rngs=rngs)
  trained = saved.get("trained") or {}
  if trained.get("wrapper") == "cell_head":
    from experiments.vlm.tiny.cell_loss import CellPretrainer
    return CellPretrainer(model, trained["n_classes"], trained["weight"], rngs=rngs), model
  if trained:
    raise CheckpointError(f"unknown training wrapper {trained} in the checkpoint's config.")
  return model, model


def param_bytes(checked: Checked) -> int:
  from flax import nnx

  from experiments.jobs.checks import module_bytes
  from experiments.vlm.tiny.model import VLM
  return module_bytes(lambda: VLM(checked.model, rngs=nnx.Rngs(0)))


def memory_line(checked: Checked, devices: int) -> None:
  del checked, devices   # the tiny VLM fits anywhere


def planner() -> None:
  """None: `lngram-exp plan` does not plan the tiny VLM."""


def analyze(workdir, restore, *, which=None, step: int | None = None, n: int = 32,
            max_new_tokens: int | None = None) -> str:
  """Attention decay, accuracy by length, LogitLens and grounding over `n` validation
  scenes (experiments/analysis/vlm_run.py); the line `lngram-exp analyze` prints."""
  from experiments.analysis.vlm_run import ANALYSES
  from experiments.analysis.vlm_run import analyze as analyze_vlm
  out = analyze_vlm(workdir, restore=restore, which=tuple(which or ANALYSES), step=step, n=n,
                    max_new_tokens=max_new_tokens)
  return f"wrote {sorted(out)} (.json, .png) into {workdir}"


def summary(checked: Checked, result: dict) -> str:
  del checked
  return f"VLM {result['final']['stage']}: validation {result['final']['eval']['overall']}"
