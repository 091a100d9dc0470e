"""Hugging Face `Qwen3VLForConditionalGeneration` / `Qwen3VLMoeForConditionalGeneration`
checkpoints in `Qwen3VL`, without torch.

    config = qwen3vl_config(read_config_json(hf_dir))   config.json -> Qwen3VLConfig
    model, config = load_qwen3vl(hf_dir)                 shape-only build, then each tensor
    logits = vlm_logits(model, inputs)                   a HF processor's dict -> [B, T, V]

config.json holds `text_config` (a Qwen3 decoder with `rope_parameters.
mrope_section` / `mrope_interleaved`), `vision_config` and the special token
ids; `tie_word_embeddings` sits at the top level. A checkpoint without a vision
tower (no `vision_config`, a `qwen3_vl_text` config, or no `model.visual.*`
tensors) is refused in one line. Text configs with the PVM authors' fields
(`pvm_layers`, `pvm_hidden_size`; experiments/hf/pvm_format.py) get PVM
branches at those layers, read from the checkpoint's `pvm_block` tensors when
it holds them, else at their init (zero gate: step 0 is the base model). A
`qwen3_vl_moe` config.json (Qwen3-VL-30B-A3B) gives the decoder Qwen3-MoE's
sparse layers; its config fields and expert layouts: experiments/hf/qwen3vl/moe.py.
Names: experiments/hf/qwen3vl/names.py; mapping and deviations: DESIGN.md §11.6.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from experiments.hf.config import (
  BACKBONE_FIELDS,
  config_json_errors,
  hf_lm_config,
  read_config_json,
)
from experiments.hf.load import check_tensor_set, copy_params, named
from experiments.hf.names import ignorable
from experiments.hf.qwen3vl import moe
from experiments.hf.qwen3vl.names import VISION_PREFIX, qwen3vl_table, text_name
from experiments.hf.safetensors_io import Checkpoint, HFCheckpointError
from experiments.hf.tables import table_shapes, table_targets
from experiments.vlm.qwen3vl.config import Qwen3VLConfig, VisionConfig
from experiments.vlm.qwen3vl.model import Qwen3VL

MODEL_TYPE = "qwen3_vl"
ARCHITECTURE = "Qwen3VLForConditionalGeneration"
# What a checkpoint may name: transformers' class, or the PVM paper authors' subclass
# (their `save_pretrained` writes its own name; the tensors and config fields are the
# layout read here). Exports keep writing ARCHITECTURE, which both load.
ARCHITECTURES_READ = (ARCHITECTURE, "PVMQwen3VLForConditionalGeneration")
_VISION_FIELDS = ("depth", "hidden_size", "num_heads", "intermediate_size", "patch_size",
                  "temporal_patch_size", "spatial_merge_size", "in_channels",
                  "out_hidden_size", "num_position_embeddings")
_NO_TOWER = "a checkpoint without a vision tower cannot be loaded as Qwen3-VL"


def is_qwen3vl(hf: dict) -> bool:
  """A Qwen3-VL or Qwen3-VL-MoE config.json (or one of their text decoders alone)."""
  return hf.get("model_type") in (MODEL_TYPE, MODEL_TYPE + "_text", moe.MODEL_TYPE,
                                  moe.TEXT_MODEL_TYPE)


def _pvm(text: dict, lm):
  """(layers, PVMBranchConfig) of the authors' PVM fields, or None."""
  try:
    from experiments.hf.pvm_format import pvm_config_from_hf
  except ImportError:   # the PVM format module is optional for a plain import
    return None
  return pvm_config_from_hf(text, lm)


def qwen3vl_config(hf: dict, *, dtype=None, param_dtype=None, max_len=None) -> Qwen3VLConfig:
  """The Qwen3VLConfig of a `qwen3_vl` or `qwen3_vl_moe` config.json dict (PVM layers when
  it names them; MoE decoder layers: experiments/hf/qwen3vl/moe.py)."""
  model_type = hf.get("model_type")
  if model_type in (MODEL_TYPE + "_text", moe.TEXT_MODEL_TYPE):
    raise HFCheckpointError(f"config.json: model_type {model_type!r} is the text decoder "
                            f"alone; {_NO_TOWER}.")
  if model_type not in (MODEL_TYPE, moe.MODEL_TYPE):
    raise HFCheckpointError(f"config.json: model_type {model_type!r} is not "
                            f"{MODEL_TYPE!r} or {moe.MODEL_TYPE!r}.")
  readable = ARCHITECTURES_READ if model_type == MODEL_TYPE else (moe.ARCHITECTURE,)
  archs = hf.get("architectures") or [readable[0]]
  if len(archs) != 1 or archs[0] not in readable:
    raise HFCheckpointError(f"config.json: architectures {archs} is not supported for "
                            f"model_type {model_type!r} (supported: one of "
                            f"{list(readable)}).")
  vision, text = hf.get("vision_config"), hf.get("text_config")
  if not isinstance(vision, dict) or not vision:
    raise HFCheckpointError(f"config.json: no vision_config; {_NO_TOWER}.")
  if not isinstance(text, dict) or not text:
    raise HFCheckpointError("config.json: no text_config (Qwen3-VL's decoder).")
  held = hf.get("dtype") or hf.get("torch_dtype") or text.get("dtype") or "float32"
  if model_type == moe.MODEL_TYPE:
    as_lm = moe.text_as_qwen3_moe(hf)
  else:
    as_lm = {**text, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
             "tie_word_embeddings": hf.get("tie_word_embeddings",
                                           text.get("tie_word_embeddings", False))}
  lm = hf_lm_config({**as_lm, "dtype": held}, dtype=dtype, param_dtype=param_dtype,
                    max_len=max_len)
  rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
  section = tuple(rope.get("mrope_section") or ())
  with config_json_errors():
    lm = lm.replace(mrope_section=section,
                    mrope_interleaved=bool(rope.get("mrope_interleaved", False)))
    pvm = _pvm(text, lm)
    if pvm is not None:
      lm = lm.replace(ffn_branch_layers=tuple(pvm[0]), ffn_branch=pvm[1])
    missing = [k for k in _VISION_FIELDS if k not in vision]
    if missing:
      raise HFCheckpointError(f"config.json: vision_config lacks {missing}.")
    v_rope = dict(vision.get("rope_parameters") or {})
    tower = VisionConfig(
        **{k: int(vision[k]) for k in _VISION_FIELDS},
        deepstack_visual_indexes=tuple(vision.get("deepstack_visual_indexes") or ()),
        hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
        rope_theta=float(v_rope.get("rope_theta", 10000.0)),
        dtype=lm.dtype, param_dtype=lm.param_dtype)
    ids = {k: int(hf[k]) for k in ("image_token_id", "video_token_id",
                                   "vision_start_token_id", "vision_end_token_id")}
    return Qwen3VLConfig(text=lm, vision=tower, **ids)


def experts_layout_of(ckpt: Checkpoint, config: Qwen3VLConfig) -> str:
  """The layout of the checkpoint's MoE expert tensors (experiments/hf/qwen3vl/moe.py);
  a dense decoder has none (its table ignores it)."""
  if not config.text.moe_layers:
    return moe.DEFAULT_LAYOUT
  return moe.experts_layout(ckpt, config.text, text_name)


def _targets(config: Qwen3VLConfig, ckpt: Checkpoint) -> dict:
  """The name table's targets, checked against the checkpoint before any tensor is read."""
  have = ckpt.names()
  if not any(n.startswith(VISION_PREFIX) for n in have):
    raise HFCheckpointError(f"{ckpt.dir}: no {VISION_PREFIX}* tensors; {_NO_TOWER}.")
  table = qwen3vl_table(config, experts_layout_of(ckpt, config))
  want = table_shapes(table)
  targets = table_targets(table)
  if config.text.ffn_branch_layers:
    from experiments.hf.pvm_format import pvm_targets
    pvm = pvm_targets(config.text, "lm/")
    sources = {s for t in pvm.values() for s in t.sources}
    if sources & have:     # an authors' PVM checkpoint: every PVM tensor must be there
      absent = sources - have
      if absent:
        raise HFCheckpointError(f"{ckpt.dir}: missing PVM tensors {named(absent)}.")
      targets |= pvm
      want = want | {s: ckpt.shape(s) for s in sources}
  check_tensor_set(ckpt, want, lambda n: ignorable(n, config.text))
  return targets


def load_qwen3vl(hf_dir, *, config: Qwen3VLConfig | None = None, dtype=None, param_dtype=None,
                 max_len=None, text_overrides: dict | None = None
                 ) -> tuple[Qwen3VL, Qwen3VLConfig]:
  """(model, config) of a Qwen3-VL checkpoint directory (on the default device).

  text_overrides: LMConfig fields replaced in the checkpoint's text config, e.g.
  `ffn_branch_layers` / `ffn_branch` (PVM at 8/16/24) or `memory_layers` /
  `memory`; the backbone fields must stay the checkpoint's. Built shape-only
  when every parameter comes from the checkpoint; with branches the model is
  drawn (seed 0) and the checkpoint's tensors copied in, so branches the
  checkpoint lacks keep their init (PVM's zero gate: step 0 is the base model).
  `hf_dir`: a directory or a hub id (experiments/hf/hub.py).
  """
  from experiments.hf.hub import resolve_checkpoint
  hf_dir = resolve_checkpoint(hf_dir)
  if config is None:
    config = qwen3vl_config(read_config_json(hf_dir), dtype=dtype, param_dtype=param_dtype,
                            max_len=max_len)
  if text_overrides:
    backbone = set(text_overrides) & set(BACKBONE_FIELDS)
    if backbone:
      raise HFCheckpointError(f"text_overrides may not change the checkpoint's backbone "
                              f"fields {sorted(backbone)}.")
    try:
      config = config.replace(text=config.text.replace(**text_overrides))
    except (TypeError, ValueError) as e:
      raise HFCheckpointError(f"text_overrides: {e}") from None
  ckpt = Checkpoint(hf_dir)
  targets = _targets(config, ckpt)
  build = lambda: Qwen3VL(config, rngs=nnx.Rngs(0))  # noqa: E731
  # Branches and LoRA factors keep their init (no tensor): the model is built concrete.
  branched = config.text.ffn_branch_layers or config.text.memory_layers or config.text.lora
  model = build() if branched else nnx.eval_shape(build)
  copy_params(model, targets, ckpt, hf_dir)
  return model, config


def vlm_logits(model: Qwen3VL, inputs: dict) -> np.ndarray:
  """float32 logits [B, T, V] of a HF Qwen3-VL processor's dict of numpy arrays
  (`input_ids`, `attention_mask`, `pixel_values`, `image_grid_thw`, and
  `mm_token_type_ids` when present); padding may be on either side."""
  known = {"input_ids", "attention_mask", "pixel_values", "image_grid_thw",
           "mm_token_type_ids"}
  if "input_ids" not in inputs:
    raise ValueError("vlm_logits: the inputs have no input_ids.")
  extra = sorted(set(inputs) - known)
  if extra:
    raise ValueError(f"vlm_logits: unsupported inputs {extra} (images only: no video).")
  logits_BxTxV, _ = model(np.asarray(inputs["input_ids"]),
                          pixel_values=inputs.get("pixel_values"),
                          image_grid_thw=inputs.get("image_grid_thw"),
                          attention_mask_BxT=inputs.get("attention_mask"),
                          mm_token_type_ids=inputs.get("mm_token_type_ids"))
  return np.asarray(jax.device_get(logits_BxTxV), np.float32)
