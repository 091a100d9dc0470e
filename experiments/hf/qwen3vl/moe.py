"""Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`, Qwen3-VL-30B-A3B): its differences.

    text_as_qwen3_moe(hf)                   text_config as a Qwen3-MoE config.json (load.py)
    experts_layout(ckpt, lm, text_name)     which fused expert layout the files hold
    moe_text_fields(lm, source_text)        text_config's MoE fields (the export)

The vision tower, DeepStack, multimodal RoPE, the special ids and the tensor
names outside the experts are Qwen3-VL's (experiments/hf/qwen3vl/). The decoder
is Qwen3-MoE's (experiments/hf/qwen3_moe.py): layer i is sparse iff i is not in
`mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0; a softmax router
over all experts (float32), top-k, no shared expert; dense layers keep the
SwiGLU of width `intermediate_size`. One difference: transformers' Qwen3-VL-MoE
router always renormalises the top-k probabilities (its config has no
`norm_topk_prob`), so the model gets norm_topk_prob=True and a config.json
that sets it false is refused. Output tying is the top-level
`tie_word_embeddings` (default false), as transformers reads it; text_config's
own flag (true by default there) is ignored.

Expert tensors are fused per layer, in one of two layouts (experiments/hf/
qwen3_moe.py `layer_table`), both read, told apart by their shapes:
  fused_in_out  gate_up_proj [E, D, 2h], down_proj [E, h, D]: the Hub's files
  fused         gate_up_proj [E, 2h, D], down_proj [E, D, h]: what transformers 5
                `save_pretrained` writes (it reads both)
Where D = 2h the gate_up shapes agree and down_proj decides, where h = D the
reverse (never both). Per-expert names are refused: transformers does not
read them for this model. An export writes the layout its run was imported
from (`fused` for a run of no recorded layout). DESIGN.md §11.6.
"""

from __future__ import annotations

import re

from experiments.hf import qwen3_moe
from experiments.hf.safetensors_io import HFCheckpointError
from experiments.models.config import LMConfig

MODEL_TYPE = "qwen3_vl_moe"
ARCHITECTURE = "Qwen3VLMoeForConditionalGeneration"
TEXT_MODEL_TYPE, VISION_MODEL_TYPE = MODEL_TYPE + "_text", MODEL_TYPE + "_vision"
LAYOUTS = ("fused", "fused_in_out")
DEFAULT_LAYOUT = "fused"
# transformers renames a vision_config of model_type "qwen3_vl_moe" (old files) to ours.
_VISION_TYPES = (None, VISION_MODEL_TYPE, MODEL_TYPE)
_PER_EXPERT = re.compile(r"\.mlp\.experts\.\d+\.")


def text_as_qwen3_moe(hf: dict) -> dict:
  """The text_config of a `qwen3_vl_moe` config.json as a Qwen3-MoE config.json (whose
  `hf_lm_config` gives the decoder), with the top-level tying and dtype; refuses
  sub-configs of another model and a norm_topk_prob the router does not compute."""
  text, vision = hf["text_config"], hf["vision_config"]
  for key, value, allowed in (("text_config", text.get("model_type"), (None, TEXT_MODEL_TYPE)),
                              ("vision_config", vision.get("model_type"), _VISION_TYPES)):
    if value not in allowed:
      raise HFCheckpointError(f"config.json: {key}.model_type {value!r} is not part of a "
                              f"{MODEL_TYPE!r} model (expected {allowed[1]!r}).")
  if text.get("norm_topk_prob", True) is not True:
    raise HFCheckpointError(
        f"config.json: text_config.norm_topk_prob={text['norm_topk_prob']!r}; Qwen3-VL-MoE's "
        "router always renormalises the top-k probabilities (transformers ignores the "
        "field), so a model without it would not be this checkpoint's.")
  return {**text, "model_type": qwen3_moe.MODEL_TYPE, "architectures": [qwen3_moe.ARCHITECTURE],
          "norm_topk_prob": True, "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False))}


def experts_layout(ckpt, config: LMConfig, text_name) -> str:
  """The layout (LAYOUTS) of the checkpoint's fused expert tensors, from the first MoE
  layer's shapes (DEFAULT_LAYOUT when neither fits: the tensor checks then name what
  differs). text_name: a decoder tensor's name in the checkpoint (names.py)."""
  have = ckpt.names()
  per_expert = sorted(n for n in have if _PER_EXPERT.search(n))
  if per_expert:
    raise HFCheckpointError(
        f"{ckpt.dir}: per-expert tensors ({per_expert[0]}, ...); Qwen3-VL-MoE checkpoints "
        "hold each layer's experts fused (mlp.experts.gate_up_proj, mlp.experts.down_proj), "
        "the only layout transformers reads for this model.")
  if not config.moe_layers:
    return DEFAULT_LAYOUT
  for layout in LAYOUTS:
    want = qwen3_moe.layer_shapes(config, config.moe_layers[0], layout)
    if all(text_name(n) in have and ckpt.shape(text_name(n)) == shape
           for n, shape in want.items()):
      return layout
  return DEFAULT_LAYOUT


def check_exportable(config: LMConfig) -> None:
  """Refuses MoE settings Qwen3VLMoeForConditionalGeneration cannot express."""
  qwen3_moe.check_exportable(config)
  if not config.moe.norm_topk_prob:
    raise HFCheckpointError("export-hf: Qwen3-VL-MoE's router always renormalises the top-k "
                            "probabilities; this model has norm_topk_prob=False.")


def moe_text_fields(config: LMConfig, source: dict) -> dict:
  """text_config's MoE fields for `config` (over `source`, the text_config the run came
  from, whose spelling is kept where it means the same: num_experts or
  num_local_experts, decoder_sparse_step with mlp_only_layers, router_aux_loss_coef)."""
  check_exportable(config)
  fields = qwen3_moe.hf_config_fields(config)
  fields.pop("norm_topk_prob")   # not a field of this model: the router always renormalises
  count = fields.pop("num_experts")
  fields["num_local_experts" if "num_local_experts" in source else "num_experts"] = count
  try:
    same_layers = (int(source["num_hidden_layers"]) == config.n_layers
                   and qwen3_moe.moe_layers(source) == tuple(config.moe_layers))
  except (KeyError, TypeError, ValueError):
    same_layers = False
  if same_layers:   # the source's own rule stays (a step, a list, or both)
    fields.pop("decoder_sparse_step")
    fields.pop("mlp_only_layers")
  coef = source.get("router_aux_loss_coef")
  if isinstance(coef, (int, float)) and coef * config.moe.top_k == config.moe.balance_coef:
    fields.pop("router_aux_loss_coef")
  return fields
