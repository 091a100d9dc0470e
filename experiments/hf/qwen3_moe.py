"""Qwen3-MoE (`Qwen3MoeForCausalLM`): its config.json fields and its expert tensors.

Which layers are sparse: transformers' rule, layer i (0-based) is an MoE layer
iff i is not in `mlp_only_layers`, `num_experts` > 0 and
(i + 1) % `decoder_sparse_step` == 0; every other layer keeps the dense
SwiGLU of width `intermediate_size` (the Qwen3 names of experiments/hf/names.py).
An MoE layer is a softmax router over all E experts (float32), the top-k
probabilities (renormalised to sum 1 when `norm_topk_prob`), and no shared
expert: `experiments.models.moe.MoEFFN` with n_shared_experts = 0.

Expert tensors come in three layouts, all read and written (`to_hf` writes the
first); `layer_table` is their name table (rows as in experiments/hf/names.py):
  per expert (the Hub's Qwen3-MoE files, and what transformers 5 `save_pretrained` writes):
    mlp.gate.weight [E, D]                          -> mlp/router [D, E]       transpose
    mlp.experts.<e>.{gate,up}_proj.weight [h, D]    -> mlp/w_{gate,up} [E, D, h] stack of transposes
    mlp.experts.<e>.down_proj.weight [D, h]         -> mlp/w_down [E, h, D]    stack of transposes
  fused (transformers 5's in-memory parameters; its Qwen3-VL-MoE `save_pretrained` writes them):
    mlp.experts.gate_up_proj [E, 2h, D]  (gate rows first) -> w_gate, w_up   halves, swapped
    mlp.experts.down_proj [E, D, h]                        -> w_down         swapped
  fused_in_out (the Hub's Qwen3-VL-MoE files: transformers 4.57's parameters):
    mlp.experts.gate_up_proj [E, D, 2h]  (gate columns first) -> w_gate, w_up  halves
    mlp.experts.down_proj [E, h, D]                           -> w_down        as is
The fused gate_up_proj is written from both halves (tables.py `part_of`).
Mapping and deviations: DESIGN.md §11.
"""

from __future__ import annotations

import numpy as np

from experiments.hf.safetensors_io import HFCheckpointError
from experiments.hf.tables import (
  SAME,
  TRANSPOSE,
  Row,
  Rule,
  Target,
  part_of,
  stacked,
  table_shapes,
  table_targets,
  table_to_hf,
)

MODEL_TYPE = "qwen3_moe"
ARCHITECTURE = "Qwen3MoeForCausalLM"
LAYOUTS = ("per_expert", "fused", "fused_in_out")
# The fused layout's tensor names (transformers 5's Qwen3MoeExperts parameters).
_FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def moe_layers(hf: dict) -> tuple[int, ...]:
  """The 0-based layers transformers builds as `Qwen3MoeSparseMoeBlock`."""
  n_layers = int(hf["num_hidden_layers"])
  experts = int(_experts(hf))
  step = int(hf.get("decoder_sparse_step", 1) or 1)
  dense = {int(i) for i in (hf.get("mlp_only_layers") or [])}
  bad = sorted(i for i in dense if not 0 <= i < n_layers)
  if bad:
    raise HFCheckpointError(f"config.json: mlp_only_layers has {bad} outside "
                            f"[0, num_hidden_layers={n_layers}).")
  if experts <= 0:
    return ()
  return tuple(i for i in range(n_layers) if i not in dense and (i + 1) % step == 0)


def _experts(hf: dict) -> int:
  # transformers maps num_experts to num_local_experts and writes the latter; Hub
  # files (Qwen3-30B-A3B) write num_experts.
  value = hf.get("num_experts", hf.get("num_local_experts"))
  if value is None:
    raise HFCheckpointError("config.json: missing field 'num_experts'.")
  return int(value)


def moe_fields(hf: dict) -> dict:
  """The `MoEConfig` fields (d_model included) of a Qwen3-MoE config.json."""
  try:
    top_k = int(hf["num_experts_per_tok"])
    # transformers' balance loss sums over the k choices: k times ours (MoEConfig), so
    # the same weight on the same loss is router_aux_loss_coef · k.
    return dict(d_model=int(hf["hidden_size"]), n_experts=_experts(hf), top_k=top_k,
                expert_ffn_dim=int(hf["moe_intermediate_size"]), n_shared_experts=0,
                shared_ffn_dim=0, norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                router="softmax",
                balance_coef=float(hf.get("router_aux_loss_coef", 0.001)) * top_k)
  except KeyError as e:
    raise HFCheckpointError(f"config.json: missing field {e.args[0]!r}.") from None


def hf_config_fields(config) -> dict:
  """config.json fields of an LMConfig with MoE layers (the export; inverse of the above)."""
  moe = config.moe
  dense = [i for i in range(config.n_layers) if i not in set(config.moe_layers)]
  return dict(num_experts=moe.n_experts, num_experts_per_tok=moe.top_k,
              moe_intermediate_size=moe.expert_ffn_dim, norm_topk_prob=moe.norm_topk_prob,
              router_aux_loss_coef=moe.balance_coef / moe.top_k, decoder_sparse_step=1,
              mlp_only_layers=dense)


def check_exportable(config) -> None:
  """Refuses MoE settings that Qwen3MoeForCausalLM cannot express."""
  moe = config.moe
  if not config.qk_norm or config.qkv_bias:
    raise HFCheckpointError("export-hf: Qwen3-MoE has q/k norms and no q/k/v biases; this "
                            f"model has qk_norm={config.qk_norm}, qkv_bias={config.qkv_bias}.")
  if moe.n_shared_experts or moe.router != "softmax" or moe.bias_update_rate:
    raise HFCheckpointError(
        "export-hf: Qwen3-MoE has no shared experts, a softmax router and no routing bias; "
        f"this model has n_shared_experts={moe.n_shared_experts}, router={moe.router!r}, "
        f"bias_update_rate={moe.bias_update_rate}.")


def layout_of(names) -> str:
  """'fused' if the checkpoint holds transformers 5's fused expert tensors, else
  'per_expert' (the Hub's layout)."""
  return "fused" if any(n.endswith(_FUSED[0]) for n in names) else "per_expert"


# [E, D, h] <-> [E, h, D] (the fused layout's experts).
_SWAP = Rule(lambda w: np.ascontiguousarray(np.swapaxes(w, 1, 2)),
             lambda a, shape: (np.swapaxes(a, 1, 2),))


def layer_table(config, layer: int, layout: str = "per_expert") -> dict[str, Row]:
  """The name table of the MoE FFN of `layer` (0-based): {our path: Row}."""
  if layout not in LAYOUTS:
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}.")
  hf, ours = f"model.layers.{layer}.mlp.", f"blocks/{layer}/mlp/"
  D, E, h = config.d_model, config.moe.n_experts, config.moe.expert_ffn_dim
  t = {ours + "router": Row(hf + "gate.weight", (E, D), TRANSPOSE)}
  if layout != "per_expert":
    # One gate_up_proj (gate, then up, along its 2h axis) and one down_proj, stored
    # [E, out, in] ("fused": swapped to ours) or [E, in, out] ("fused_in_out": ours).
    swapped = layout == "fused"
    rule = _SWAP if swapped else SAME
    gate_up = (hf + "experts.gate_up_proj", (E, 2 * h, D) if swapped else (E, D, 2 * h))
    axis = 1 if swapped else 2
    t[ours + "w_gate"] = Row(*gate_up, part_of(rule, 0, 2, axis))
    t[ours + "w_up"] = Row(*gate_up, part_of(rule, 1, 2, axis))
    t[ours + "w_down"] = Row(hf + "experts.down_proj", (E, D, h) if swapped else (E, h, D), rule)
    return t
  for name, shape in (("gate", (h, D)), ("up", (h, D)), ("down", (D, h))):
    t[ours + f"w_{name}"] = Row(tuple(hf + f"experts.{e}.{name}_proj.weight" for e in range(E)),
                                shape, stacked(TRANSPOSE, axis=0))
  return t


def layer_targets(config, layer: int, target_cls=Target, layout: str = "per_expert") -> dict:
  """{our path: Target} of the MoE FFN of `layer` (0-based)."""
  return {path: target_cls(t.sources, t.build)
          for path, t in table_targets(layer_table(config, layer, layout)).items()}


def layer_shapes(config, layer: int, layout: str = "per_expert") -> dict:
  """{HF tensor name: shape} of the MoE FFN of `layer`."""
  return table_shapes(layer_table(config, layer, layout))


def layer_to_hf(config, layer: int, params: dict) -> dict:
  """Our MoE FFN of `layer` as per-expert HF tensors (the export)."""
  return table_to_hf(layer_table(config, layer), params)
