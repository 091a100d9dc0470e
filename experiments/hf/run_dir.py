"""A Hugging Face checkpoint as a run directory of ours: `lngram-exp import-hf`.

    import_hf(hf_dir, workdir)      a run directory: saved config + step-0
                                    checkpoint (the trainer's checkpointer) + the
                                    tokenizer files; `restore`, `eval`, `sample`,
                                    `analyze` and `init_from=<workdir>` read it

A `qwen3_vl` checkpoint becomes a run of kind "qwen3vl" (`import_qwen3vl`).
`init_from=hf:DIR` (the same backbone, straight into a training run) lives in
experiments/hf/backbone.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
from flax import nnx

from experiments.hf.backbone import set_backbone
from experiments.hf.load import load_hf
from experiments.hf.safetensors_io import HFCheckpointError

# Files beside the weights that a run keeps (tokenizer, EOS ids, the source config).
KEPT_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json")
HF_CONFIG_COPY = "hf_config.json"
# A Qwen3-VL run also keeps what its processor reads (experiments/qwen3vl/processor.py).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.jinja",
                   "chat_template.json")


def import_hf(hf_dir, workdir, *, dtype=None, param_dtype=None, max_len=None) -> dict:
  """Writes the checkpoint in `hf_dir` as the run directory `workdir` (new or empty).

  Every check (config, tensors, shapes, files) runs before anything is
  written; a failure while writing removes what this call created.
  Returns {"workdir", "config" (LMConfig), "params" (array count), "kept" (files)}.
  """
  from experiments.configs import load_config
  from experiments.hf.config import read_config_json
  from experiments.hf.qwen3vl import is_qwen3vl
  from experiments.tasks.saved import saved_config

  workdir = check_new_workdir(workdir)
  if is_qwen3vl(read_config_json(hf_dir)):
    return import_qwen3vl(hf_dir, workdir, dtype=dtype, param_dtype=param_dtype,
                          max_len=max_len)
  model, lm = load_hf(hf_dir, dtype=dtype, param_dtype=param_dtype, max_len=max_len)
  experiment = load_config("lm_baseline.py")
  set_backbone(experiment.model, lm, check=False)
  experiment.model.update(max_len=lm.max_len, dtype=lm.dtype.name,
                          param_dtype=lm.param_dtype.name)
  experiment.data.seq_len = min(experiment.data.seq_len, lm.max_len)
  saved = saved_config("lm", experiment, lm)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  kept = write_run(hf_dir, workdir, params, saved)
  return {"workdir": str(workdir), "config": lm, "params": len(jax.tree.leaves(params)),
          "kept": kept}


def import_qwen3vl(hf_dir, workdir, *, dtype=None, param_dtype=None, max_len=None) -> dict:
  """A Qwen3-VL checkpoint as a run of kind "qwen3vl" (`restore` rebuilds the
  `Qwen3VL`, with the authors' PVM layers when config.json names them); it
  also keeps the processor's files. Returns import_hf's dict ("config" is the
  text decoder's LMConfig) plus "qwen3vl" (the Qwen3VLConfig)."""
  import ml_collections

  from experiments.hf.qwen3vl import load_qwen3vl
  from experiments.tasks.saved import saved_config

  workdir = check_new_workdir(workdir)
  model, config = load_qwen3vl(hf_dir, dtype=dtype, param_dtype=param_dtype, max_len=max_len)
  experiment = ml_collections.ConfigDict(
      {"import_hf": {"model_type": "qwen3_vl", "hf_config": HF_CONFIG_COPY}, "seed": 0})
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  kept = write_run(hf_dir, workdir, params, saved_config("qwen3vl", experiment, config),
                   KEPT_FILES + PROCESSOR_FILES)
  return {"workdir": str(workdir), "config": config.text, "qwen3vl": config,
          "params": len(jax.tree.leaves(params)), "kept": kept}


def check_new_workdir(workdir) -> Path:
  workdir = Path(workdir).expanduser()
  if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
    raise HFCheckpointError(f"--workdir={workdir} exists and is not empty; import-hf "
                            "writes a new run directory.")
  return workdir


def write_run(hf_dir, workdir: Path, params: dict, saved: dict,
              kept_files: tuple[str, ...] = KEPT_FILES) -> list[str]:
  """Step 0 (`params`, `saved` config) and the kept files into `workdir`; returns the
  kept names. A failure removes the directory if this call created it."""
  from experiments.trainer.checkpoint import run_checkpointer

  created = not workdir.exists()
  kept = [name for name in kept_files if (Path(hf_dir) / name).is_file()]
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = run_checkpointer(workdir, async_save=False)
    try:
      ckpt.save(0, params=params, config=saved)
      ckpt.wait()
    finally:
      ckpt.close()
    for name in kept:
      shutil.copyfile(Path(hf_dir) / name, workdir / name)
    shutil.copyfile(Path(hf_dir) / "config.json", workdir / HF_CONFIG_COPY)
  except BaseException:
    if created:
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  return kept
