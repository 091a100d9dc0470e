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


def export_hf(workdir, out, *, step: int | None = None,
              max_shard_bytes: int = 4 * 2**30) -> dict:
  """Writes the backbone of the run in `workdir` (newest valid step, or `step`) to `out`.

  `out` must be new or empty; it appears whole at the end or not at all
  (`new_directory`). A branch with no Hugging Face form is named in a warning.
  Returns {"out", "files", "tensors", "step", "left_out" (the warnings' lines)}.
  """
  from experiments.hf.export import export_lm
  from experiments.jobs.restore import restore

  out = check_new_directory(out, "out", "export-hf", "checkpoint")
  model, experiment = restore(workdir, step)
  if type(model).__name__ == "Qwen3VL":   # with its PVM branches in the authors' layout
    from experiments.hf.qwen3vl.export import export_qwen3vl
    source = experiment.get("import_hf") or {}   # a Qwen3-VL-MoE keeps its expert layout
    return export_qwen3vl(model, workdir, out, experiment.restored_step,
                          experts=source.get("experts_layout"))
  return export_lm(model, workdir, out, experiment.restored_step,
                   max_shard_bytes=max_shard_bytes)


def import_hf(hf_dir, workdir, *, dtype=None, param_dtype=None, max_len=None) -> dict:
  """Writes the checkpoint in `hf_dir` (a directory, or a hub id `org/name[@revision]`:
  experiments/hf/hub.py) as the run directory `workdir` (new or empty).

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
    return import_qwen3vl(hf_dir, workdir, dtype=dtype, param_dtype=param_dtype,
                          max_len=max_len)
  check_tokenizer(hf_dir, hf_lm_config(hf).vocab_size, workdir)   # before the weights load
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
