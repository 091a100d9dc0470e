"""The LM job: the decoder LM with its memory and FFN branches, on byte or token data, from
scratch or from a Hugging Face backbone (`init_from=hf:DIR`); its hooks
(experiments/jobs/registry.py lists them).

  task.py      the task: data, loss, evaluation, the per-document losses of the last one
  evaluate.py  a checkpoint's validation metrics (`lngram-exp eval`)
  sample.py    prompt continuations (`lngram-exp sample`)
"""

from __future__ import annotations

from experiments.jobs.registry import Checked

BLOCKS = ("model", "data", "optim", "train")


def check(config) -> Checked:
  """The numbers, then the model config (init_from=hf:DIR: the checkpoint's backbone)."""
  from experiments.hf.backbone import with_hf_backbone
  from experiments.jobs.checks import check_experiment_config
  from experiments.models.config import lm_config
  check_experiment_config(config)
  config = with_hf_backbone(config)
  return Checked("lm", config, lm_config(config))


def make_task(checked: Checked, workdir, mesh=None):
  from experiments.jobs.lm.task import lm_task
  return lm_task(checked.config, workdir, mesh, model_config=checked.model)


def build(saved: dict, rngs):
  """(trained module, model): the LM trains itself."""
  from experiments.models import DecoderLM, LMConfig
  model = DecoderLM(LMConfig.from_dict(saved["model"]), rngs=rngs)
  return model, model


def param_bytes(checked: Checked) -> int:
  from flax import nnx

  from experiments.jobs.checks import module_bytes
  from experiments.models import DecoderLM
  return module_bytes(lambda: DecoderLM(checked.model, rngs=nnx.Rngs(0)))


def memory_line(checked: Checked, devices: int) -> str:
  from experiments.jobs.checks import plan_line
  return plan_line(checked.config, devices)


def summary(checked: Checked, result: dict) -> str:
  """"validation bits per byte: X" (byte data) or "validation bits per token: X" (token
  data), from the final evaluation's `eval/bits_per_<unit>`."""
  from experiments.jobs.lm.task import bits_key
  unit = "token" if checked.config.data.get("kind") == "tokens" else "byte"
  return f"validation bits per {unit}: {result['eval'].get(bits_key('eval', unit)):.4f}"
