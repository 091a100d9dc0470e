"""The LM job: the decoder LM with its memory and FFN branches, on byte or token data, from
scratch or from a Hugging Face backbone (`init_from=hf:DIR`); its hooks
(experiments/jobs/registry.py lists them).

  task.py      the task: data, loss, evaluation, the per-document losses of the last one
  evaluate.py  a checkpoint's validation metrics (`lngram-exp eval`)
  sample.py    prompt continuations (`lngram-exp sample`)
  checks.py    what only an LM config is checked for
  planning.py  the plan hooks (`lngram-exp plan`)
"""

from __future__ import annotations

from experiments.jobs.registry import Checked

BLOCKS = ("model", "data", "optim", "train")
A_CONFIG = "an LM config"


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


def planner():
  """The plan hooks (experiments/jobs/lm/planning.py)."""
  from experiments.jobs.lm import planning
  return planning


def analyze(workdir, restore, *, which=None, step: int | None = None, stability_steps=None,
            **options) -> str:
  """The Lngram ID analyses of a run (experiments/analysis/run.py `analyze_lm`, `options`
  its seed, max_positions, n_perm, dedup, max_file_share, perm_strata, n_rho_boot); the
  line `lngram-exp analyze` prints."""
  from experiments.analysis.run import LM_ANALYSES, analyze_lm
  steps = list(stability_steps or [])
  if not all(str(s).strip().isdigit() for s in steps):
    raise ValueError(f"--stability_steps={','.join(map(str, steps))}: give checkpoint steps "
                     "as integers, e.g. 100,300.")
  out = analyze_lm(workdir, restore=restore, which=tuple(which or LM_ANALYSES), step=step,
                   stability_steps=tuple(int(s) for s in steps) or None, **options)
  return f"wrote {sorted(out)} (.json, .md, .png) into {workdir}/analysis"


def summary(checked: Checked, result: dict) -> str:
  """"validation bits per byte: X" (byte data) or "validation bits per token: X" (token
  data), from the final evaluation's `eval/bits_per_<unit>`."""
  from experiments.jobs.lm.task import bits_key
  unit = "token" if checked.config.data.get("kind") == "tokens" else "byte"
  return f"validation bits per {unit}: {result['eval'].get(bits_key('eval', unit)):.4f}"
