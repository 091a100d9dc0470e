"""Export a Qwen3-VL run (import-hf or a PVM stage) as a Hugging Face checkpoint, PVM included.

    qwen3vl_to_hf(model)                    {HF name: array}: backbone + the authors' PVM
    qwen3vl_config_json(config, source)     config.json (text_config with pvm_layers, ...)
    export_qwen3vl(model, workdir, out)     writes out/ (`lngram-exp export-hf` calls it)

The backbone is the import's name table read backwards (`qwen3vl_table` of
experiments/hf/qwen3vl/names.py, through `names.table_to_hf`); the PVM branches
go under the authors' names in the same safetensors (`model.language_model.
layers.<i>.pvm_block.*`, experiments/hf/pvm_format.py) and config.json's
text_config gets their `pvm_layers` / `pvm_hidden_size`, so the authors'
`PVMQwen3VLForConditionalGeneration.from_pretrained(out)` holds what we
trained, and our import reads it back bit for bit (DESIGN.md §11.8).
Without PVM layers this is a plain `Qwen3VLForConditionalGeneration`
checkpoint, or `Qwen3VLMoeForConditionalGeneration` for a decoder with MoE
layers (experiments/hf/qwen3vl/moe.py: its fields, its fused expert layouts).
Like export-hf's LM path, `out` appears whole at the end or not at all
(`new_directory`). A run that came from a checkpoint keeps that config.json
(`hf_config.json` in the run): every field we do not model survives.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from experiments.hf.atomic_dir import check_new_directory, new_directory
from experiments.hf.pvm_format import pvm_text_fields, pvm_to_hf
from experiments.hf.qwen3vl import moe
from experiments.hf.qwen3vl.load import ARCHITECTURE, MODEL_TYPE
from experiments.hf.qwen3vl.names import qwen3vl_table
from experiments.hf.safetensors_io import SINGLE_NAME, write_file
from experiments.hf.tables import table_to_hf
from experiments.trainer.optimizer import path_str

SOURCE_CONFIG = "hf_config.json"


def _flat(model) -> dict[str, np.ndarray]:
  return {path_str(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]}


def qwen3vl_to_hf(model, experts: str = moe.DEFAULT_LAYOUT) -> dict[str, np.ndarray]:
  """Every parameter of `model` (a Qwen3VL) under its HF / the PVM authors' name; a
  Qwen3-VL-MoE's experts in the layout `experts` (experiments/hf/qwen3vl/moe.py)."""
  c = model.config
  if c.text.moe_layers:
    moe.check_exportable(c.text)
  flat = _flat(model)
  out = table_to_hf(qwen3vl_table(c, experts), flat)
  if c.text.ffn_branch_layers:
    out |= pvm_to_hf(c.text, flat, "lm/")
  return out


def qwen3vl_config_json(config, source: dict | None = None) -> dict:
  """config.json of `config` (over `source`, the config.json the run came from)."""
  c, t, v = config, config.text, config.vision
  out = dict(source or {})
  sparse = bool(t.moe_layers) or out.get("model_type") == moe.MODEL_TYPE
  text = dict(out.get("text_config") or {})
  source_text = dict(text)
  for key in ("pvm_layers", "pvm_hidden_size"):
    text.pop(key, None)
  rope = dict(text.get("rope_parameters") or {})
  rope.update(rope_type="default", rope_theta=t.rope_theta, mrope_section=list(t.mrope_section),
              mrope_interleaved=bool(t.mrope_interleaved))
  text.update(model_type="qwen3_vl_text", vocab_size=t.vocab_size, hidden_size=t.d_model,
              intermediate_size=t.ffn_dim, num_hidden_layers=t.n_layers,
              num_attention_heads=t.n_heads, num_key_value_heads=t.n_kv_heads,
              head_dim=t.head_dim, rms_norm_eps=t.norm_eps, hidden_act="silu",
              max_position_embeddings=t.max_len, attention_bias=False,
              tie_word_embeddings=t.tie_embeddings, rope_parameters=rope,
              dtype=np.dtype(t.param_dtype).name, **pvm_text_fields(t))
  text.pop("rope_scaling", None)
  if sparse:   # Qwen3-VL-MoE: its own types; only the top-level flag ties (text's kept)
    text.update(model_type=moe.TEXT_MODEL_TYPE)
    del text["tie_word_embeddings"]
    text.update({k: v for k, v in source_text.items() if k == "tie_word_embeddings"})
    if t.moe_layers:
      text.update(moe.moe_text_fields(t, source_text))
  vision = dict(out.get("vision_config") or {})
  vision.update(model_type=moe.VISION_MODEL_TYPE if sparse else "qwen3_vl", depth=v.depth,
                hidden_size=v.hidden_size, num_heads=v.num_heads,
                intermediate_size=v.intermediate_size, patch_size=v.patch_size,
                temporal_patch_size=v.temporal_patch_size,
                spatial_merge_size=v.spatial_merge_size, in_channels=v.in_channels,
                out_hidden_size=v.out_hidden_size,
                num_position_embeddings=v.num_position_embeddings,
                deepstack_visual_indexes=list(v.deepstack_visual_indexes),
                hidden_act=v.hidden_act)
  out.update(architectures=[moe.ARCHITECTURE if sparse else ARCHITECTURE],
             model_type=moe.MODEL_TYPE if sparse else MODEL_TYPE, text_config=text,
             vision_config=vision, image_token_id=c.image_token_id,
             video_token_id=c.video_token_id, vision_start_token_id=c.vision_start_token_id,
             vision_end_token_id=c.vision_end_token_id, tie_word_embeddings=t.tie_embeddings)
  out.pop("torch_dtype", None)
  return out


def export_qwen3vl(model, workdir, out, step: int, experts: str | None = None) -> dict:
  """Writes config.json + model.safetensors (+ the run's processor files) into `out`,
  whole or not at all (experiments/hf/atomic_dir.py `new_directory`). experts: the
  layout of a Qwen3-VL-MoE's expert tensors (the one its run was imported from; default
  transformers 5's)."""
  out = check_new_directory(out, "out", "export-hf", "checkpoint")
  workdir = Path(workdir)
  source_path = workdir / SOURCE_CONFIG
  source = json.loads(source_path.read_text()) if source_path.is_file() else None
  tensors = qwen3vl_to_hf(model, experts or moe.DEFAULT_LAYOUT)
  with new_directory(out, "out", "export-hf", "checkpoint") as tmp:
    write_file(tmp / SINGLE_NAME, tensors, {"format": "pt"})
    (tmp / "config.json").write_text(
        json.dumps(qwen3vl_config_json(model.config, source), indent=2, sort_keys=True))
    # The processor files: the run's own copy (a stage run) or the run directory's (import-hf).
    for folder in (workdir / "processor", workdir):
      for path in sorted(folder.glob("*")) if folder.is_dir() else ():
        if path.is_file() and (path.name.startswith(("tokenizer", "chat_template",
                                                     "preprocessor", "special_tokens"))
                               or path.name == "generation_config.json"):
          if not (tmp / path.name).exists():
            shutil.copyfile(path, tmp / path.name)
  return {"out": str(out), "files": [SINGLE_NAME], "tensors": len(tensors), "step": int(step),
          "left_out": []}
