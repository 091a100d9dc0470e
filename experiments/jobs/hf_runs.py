"""Runs and Hugging Face checkpoints: `lngram-exp import-hf` and `export-hf`.

    import_hf(hf_dir, workdir)      a run directory: saved config + step-0
                                    checkpoint (the trainer's checkpointer) + the
                                    tokenizer files; `restore`, `eval`, `sample`,
                                    `analyze` and `init_from=<workdir>` read it
    export_hf(workdir, out)         a run's backbone (and its memory or PVM branches)
                                    as a checkpoint transformers loads
                                    (experiments/hf/export.py, hf/qwen3vl/export.py)

A `qwen3_vl` or `qwen3_vl_moe` checkpoint becomes a run of kind "qwen3vl"
(`import_qwen3vl`).
`init_from=hf:DIR` (the same backbone, straight into a training run) lives in
experiments/hf/backbone.py.

The run directory appears whole at the end or not at all (experiments/hf/
atomic_dir.py `new_directory`): a kill leaves no half run that `sample` would
read, and the rerun is not refused. A tokenizer.json with more ids than the
embedding has rows is refused (those ids would index past it); a checkpoint
without one whose vocabulary is not the 256 bytes is imported with a warning
(the run has no tokenizer: text needs one).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from experiments.hf.atomic_dir import check_new_directory, new_directory
from experiments.hf.backbone import set_backbone
from experiments.hf.config import HF_CONFIG_COPY
from experiments.hf.export import TOKENIZER_FILES
from experiments.hf.hub import resolve_checkpoint
from experiments.hf.load import load_hf
from experiments.hf.safetensors_io import HFCheckpointError

# Files beside the weights that a run keeps (tokenizer, EOS ids, the source config).
KEPT_FILES = TOKENIZER_FILES
# A Qwen3-VL run also keeps what its processor reads (experiments/hf/qwen3vl/processor.py).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.jinja",
                   "chat_template.json")


def export_hf(workdir, out, *, step: int | None = None, adapter: bool = False,
              max_shard_bytes: int = 4 * 2**30) -> dict:
  """Writes the backbone of the run in `workdir` (newest valid step, or `step`) to `out`.

  `out` must be new or empty; it appears whole at the end or not at all
  (`new_directory`). A branch with no Hugging Face form is named in a warning. A run
  with LoRA factors is written merged (W + (α/r)·A·B), or with `adapter` as a PEFT
  adapter alone (experiments/hf/peft_adapter.py). Returns {"out", "files", "tensors",
  "step", "left_out" (the warnings' lines)}.
  """
  from experiments.hf.export import export_lm
  from experiments.jobs.restore import restore

  out = check_new_directory(out, "out", "export-hf", "checkpoint")
  model, experiment = restore(workdir, step)
  if adapter:
    return export_adapter(model, workdir, out, experiment.restored_step)
  model = merged_model(model)
  if type(model).__name__ == "Qwen3VL":   # with its PVM branches in the authors' layout
    from experiments.hf.qwen3vl.export import export_qwen3vl
    source = experiment.get("import_hf") or {}   # a Qwen3-VL-MoE keeps its expert layout
    return export_qwen3vl(model, workdir, out, experiment.restored_step,
                          experts=source.get("experts_layout"))
  return export_lm(model, workdir, out, experiment.restored_step,
                   max_shard_bytes=max_shard_bytes)


def import_hf(hf_dir, workdir, *, adapter=None, dtype=None, param_dtype=None,
              max_len=None) -> dict:
  """Writes the checkpoint in `hf_dir` (a directory, or a hub id `org/name[@revision]`:
  experiments/hf/hub.py) as the run directory `workdir` (new or empty); `adapter`: a
  PEFT LoRA adapter directory whose factors the run's model carries.

  Every check (config, tokenizer, tensors, shapes, files) runs before anything
  is written; the run directory appears whole at the end or not at all.
  Returns {"workdir", "config" (LMConfig), "params" (array count), "kept" (files)}.
  """
  from experiments.configs import load_config
  from experiments.hf.config import hf_lm_config, read_config_json
  from experiments.hf.qwen3vl.load import is_qwen3vl
  from experiments.jobs.saved import saved_config

  workdir = check_new_workdir(workdir)
  hf_dir = resolve_checkpoint(hf_dir)   # a hub id: its snapshot in the Hugging Face cache
  hf = read_config_json(hf_dir)
  if is_qwen3vl(hf):
    if adapter:
      raise HFCheckpointError("import-hf --adapter reads adapters of causal-LM checkpoints; "
                              f"{hf_dir} is a Qwen3-VL one.")
    return import_qwen3vl(hf_dir, workdir, dtype=dtype, param_dtype=param_dtype,
                          max_len=max_len)
  check_tokenizer(hf_dir, hf_lm_config(hf).vocab_size, workdir)   # before the weights load
  model, lm = load_hf(hf_dir, dtype=dtype, param_dtype=param_dtype, max_len=max_len)
  if adapter:
    model, lm = with_adapter(hf_dir, adapter, lm)
  experiment = load_config("lm_baseline.py")
  set_backbone(experiment.model, lm, check=False)
  experiment.model.update(max_len=lm.max_len, dtype=lm.dtype.name,
                          param_dtype=lm.param_dtype.name)
  experiment.data.seq_len = min(experiment.data.seq_len, lm.max_len)
  if lm.lora is not None:
    experiment.model.lora.update(lm.lora.to_dict())
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

  from experiments.hf.config import read_config_json
  from experiments.hf.qwen3vl.load import experts_layout_of, load_qwen3vl, qwen3vl_config
  from experiments.hf.safetensors_io import Checkpoint
  from experiments.jobs.saved import saved_config

  workdir = check_new_workdir(workdir)
  hf_dir = resolve_checkpoint(hf_dir)
  hf = read_config_json(hf_dir)
  check_tokenizer(hf_dir, qwen3vl_config(hf).text.vocab_size, workdir)
  model, config = load_qwen3vl(hf_dir, dtype=dtype, param_dtype=param_dtype, max_len=max_len)
  source = {"model_type": hf["model_type"], "hf_config": HF_CONFIG_COPY}
  if config.text.moe_layers:   # export-hf writes the experts back in the layout read
    source["experts_layout"] = experts_layout_of(Checkpoint(hf_dir), config)
  experiment = ml_collections.ConfigDict({"import_hf": source, "seed": 0})
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  kept = write_run(hf_dir, workdir, params, saved_config("qwen3vl", experiment, config),
                   KEPT_FILES + PROCESSOR_FILES)
  return {"workdir": str(workdir), "config": config.text, "qwen3vl": config,
          "params": len(jax.tree.leaves(params)), "kept": kept}


def check_new_workdir(workdir) -> Path:
  return check_new_directory(workdir, "workdir", "import-hf", "run")


def check_tokenizer(hf_dir, vocab_size: int, workdir) -> None:
  """Refuses a tokenizer.json with more ids than the model's `vocab_size` embedding
  rows (ids the tokenizer emits would index past the embedding: garbage or NaN
  logits, no error); warns when there is none and the vocabulary is not the 256
  bytes (the run has no tokenizer, and byte ids are not this model's tokens)."""
  from experiments.data.tokens.tokenizer import describe
  path = Path(hf_dir) / "tokenizer.json"
  if path.is_file():
    size = describe(str(path)).vocab_size   # an unreadable file: one line, naming it
    if size > vocab_size:
      raise HFCheckpointError(
          f"{path}: the tokenizer has {size} ids but the model's embedding has {vocab_size} "
          f"rows; ids {vocab_size}..{size - 1} would index past it (a tokenizer.json of "
          "another model?).")
  elif vocab_size != 256:
    warnings.warn(f"{hf_dir} has no tokenizer.json and a vocabulary of {vocab_size} ids: "
                  f"the run {workdir} has no tokenizer, so sampling or training on text "
                  "needs one (copy the checkpoint's tokenizer.json into the run).",
                  UserWarning, stacklevel=3)


def write_run(hf_dir, workdir: Path, params: dict, saved: dict,
              kept_files: tuple[str, ...] = KEPT_FILES) -> list[str]:
  """Step 0 (`params`, `saved` config) and the kept files into `workdir`, which
  appears whole at the end or not at all; returns the kept names."""
  from experiments.trainer.checkpoint import run_checkpointer

  kept = [name for name in kept_files if (Path(hf_dir) / name).is_file()]
  with new_directory(workdir, "workdir", "import-hf", "run") as tmp:
    ckpt = run_checkpointer(tmp, async_save=False)
    try:
      ckpt.save(0, params=params, config=saved)
      ckpt.wait()
    finally:
      ckpt.close()
    for name in kept:
      shutil.copyfile(Path(hf_dir) / name, tmp / name)
    shutil.copyfile(Path(hf_dir) / "config.json", tmp / HF_CONFIG_COPY)
  return kept


def with_adapter(hf_dir, adapter, lm):
  """(model, config) of the base in `hf_dir` with the PEFT adapter's factors on it."""
  from experiments.hf.names import lm_table
  from experiments.hf.peft_adapter import read_adapter
  lora, factors = read_adapter(adapter, lm_table(lm))
  model, lm = load_hf(hf_dir, config=lm.replace(lora=lora))
  for path, (a, b) in factors.items():
    module = model
    *parents, name = path.split("/")
    for part in parents:
      module = module[int(part)] if part.isdigit() else getattr(module, part)
    for suffix, value in (("_lora_a", a), ("_lora_b", b)):
      factor = getattr(module, name + suffix)
      factor[...] = jax.numpy.asarray(value.reshape(factor.shape), factor.dtype)
  return model, lm


def merged_model(model):
  """`model` itself, or with LoRA factors the same model without them, each factor pair
  folded into its weight (experiments/models/lora.py `merged_params`)."""
  from experiments.models.lora import merged_params
  lm = model.lm if type(model).__name__ == "Qwen3VL" else model
  lora = lm.config.lora
  if lora is None:
    return model
  config = (model.config.replace(text=lm.config.replace(lora=None))
            if lm is not model else lm.config.replace(lora=None))
  abstract = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
  graphdef, params, _ = nnx.split(abstract, nnx.Param, ...)
  nnx.replace_by_pure_dict(params, merged_params(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)), lora.scale))
  return nnx.merge(graphdef, params, nnx.split(model, nnx.Param, ...)[2])


def export_adapter(model, workdir, out, step: int) -> dict:
  """The run's LoRA factors as a PEFT adapter in `out` (experiments/hf/peft_adapter.py)."""
  from experiments.hf.peft_adapter import write_adapter
  from experiments.jobs.init_from import flat_params
  if type(model).__name__ == "Qwen3VL":
    from experiments.hf.qwen3vl.names import qwen3vl_table
    table, lora = qwen3vl_table(model.config), model.config.text.lora
  else:
    from experiments.hf.names import lm_table
    table, lora = lm_table(model.config), model.config.lora
  if lora is None:
    raise HFCheckpointError(f"{workdir}: export-hf --adapter: the run has no LoRA factors.")
  flat = {k: np.asarray(v) for k, v in flat_params(nnx.state(model, nnx.Param)).items()}
  with new_directory(out, "out", "export-hf", "checkpoint") as tmp:
    files = write_adapter(tmp, table, flat, lora)
  return {"out": str(out), "files": files, "tensors": sum(k.endswith(("_lora_a", "_lora_b"))
                                                          for k in flat), "step": step,
          "left_out": []}
