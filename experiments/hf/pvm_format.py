"""PVM branches under the authors' parameter names and config fields (DESIGN.md §11.8).

    pvm_table(lm_config)              {our path: Row}: the name table (experiments/hf/names.py)
    pvm_targets(lm_config)            {our path: Target} reading their tensors (import)
    pvm_to_hf(lm_config, flat)        {their name: array} of every PVM layer (export)
    pvm_text_fields(lm_config)        {"pvm_layers", "pvm_hidden_size"} for text_config
    pvm_config_from_hf(text_config)   (layers, PVMBranchConfig) their fields describe, or None
    authors_mismatch(lm_config)       why their module cannot hold our branches ([] if it can)

The authors' code is a modified Hugging Face `modeling_qwen3_vl.py` (GitHub
repository huaixuheqing/PVM): `Qwen3VLTextDecoderLayer` holds a
`PVMMemoryBlock` as `pvm_block` at each layer of `text_config.pvm_layers`
(0-based), of latent width `text_config.pvm_hidden_size`. Its query reads the
post-attention residual and its output is added beside the FFN; its visual
context is the merged visual embeddings at the image positions (before the
DeepStack adds), padded per row; image positions get 0: what our
`PVMBranch` computes (DESIGN.md §3.1). Per layer i, under
`model.language_model.layers.<i>.pvm_block.`:

  ours (PVMBranch)         theirs (PVMMemoryBlock)                 transform
  w_down_txt [D, L]        text_reducer.weight [L, D]              transpose
  lat_norm [L]             input_norm.weight [L]                   none
  w_down_vis [D, L]        vision_reducer.weight [L, D]            transpose
  w_q [L, Hq·Dh]           cross_attn.q_proj.weight [Hq·Dh, L]     transpose
  w_k, w_v [L, Hkv·Dh]     cross_attn.{k,v}_proj.weight            transpose
  q_norm, k_norm [Dh]      cross_attn.{q,k}_norm.weight [Dh]       none
  w_o [Hq·Dh, L]           cross_attn.o_proj.weight [L, Hq·Dh]     transpose
  ffn_norm [L]             post_attn_norm.weight [L]               none
  w_gate, w_in [L, F]      mlp.{gate,up}_proj.weight [F, L]        transpose
  w_ffn_out [F, L]         mlp.down_proj.weight [L, F]             transpose
  w_up [L, D]              output_expander.weight [D, L]           transpose
  gate []                  gate_alpha [1]                          reshape

Their block derives every width from the text config: head dim = the
backbone's `head_dim`, KV heads = max(1, Hq // (heads / KV heads)), latent
FFN = int(L·(intermediate_size / hidden_size)), visual width = hidden_size,
every norm's eps = `rms_norm_eps`, no biases (`attention_bias` false). A branch
config that departs from that (our `head_dim`, `latent_ffn_dim`, `visual_dim`,
`eps` options, the "hidden" source) has no counterpart: `authors_mismatch`
names the field and the export refuses it.
"""

from __future__ import annotations

import numpy as np

from experiments.hf.safetensors_io import HFCheckpointError
from experiments.hf.tables import SAME, TRANSPOSE, Row, Target, reshaped, table_targets, table_to_hf
from experiments.models.config import LMConfig
from experiments.vlm.qwen3vl.pvm import authors_pvm_config
from pvm_jax.config import PVMConfig

SOURCE = "PVMMemoryBlock (modeling_qwen3_vl.py, github.com/huaixuheqing/PVM)"
PREFIX = "model.language_model.layers.{layer}.pvm_block."
# The text_config fields their configuration class adds.
PVM_FIELDS = ("pvm_layers", "pvm_hidden_size")


# ours -> (theirs, their shape from the branch config, the rule). Every rule is exact
# (a transpose or a reshape), so export -> import is bit for bit.
NAMES = {
    "w_down_txt": ("text_reducer.weight", lambda p: (p.latent_dim, p.d_model), TRANSPOSE),
    "lat_norm": ("input_norm.weight", lambda p: (p.latent_dim,), SAME),
    "w_down_vis": ("vision_reducer.weight", lambda p: (p.latent_dim, p.vis_dim), TRANSPOSE),
    "w_q": ("cross_attn.q_proj.weight", lambda p: (p.q_heads * p.head_dim, p.latent_dim),
            TRANSPOSE),
    "w_k": ("cross_attn.k_proj.weight", lambda p: (p.kv_heads * p.head_dim, p.latent_dim),
            TRANSPOSE),
    "w_v": ("cross_attn.v_proj.weight", lambda p: (p.kv_heads * p.head_dim, p.latent_dim),
            TRANSPOSE),
    "q_norm": ("cross_attn.q_norm.weight", lambda p: (p.head_dim,), SAME),
    "k_norm": ("cross_attn.k_norm.weight", lambda p: (p.head_dim,), SAME),
    "w_o": ("cross_attn.o_proj.weight", lambda p: (p.latent_dim, p.q_heads * p.head_dim),
            TRANSPOSE),
    "ffn_norm": ("post_attn_norm.weight", lambda p: (p.latent_dim,), SAME),
    "w_gate": ("mlp.gate_proj.weight", lambda p: (p.ffn_dim, p.latent_dim), TRANSPOSE),
    "w_in": ("mlp.up_proj.weight", lambda p: (p.ffn_dim, p.latent_dim), TRANSPOSE),
    "w_ffn_out": ("mlp.down_proj.weight", lambda p: (p.latent_dim, p.ffn_dim), TRANSPOSE),
    "w_up": ("output_expander.weight", lambda p: (p.d_model, p.latent_dim), TRANSPOSE),
    "gate": ("gate_alpha", lambda p: (1,), reshaped()),
}


def authors_mismatch(lm_config: LMConfig) -> list[str]:
  """The fields where `lm_config`'s PVM branches differ from the authors' block ([] if none)."""
  pvm = lm_config.ffn_branch
  if not isinstance(pvm, PVMConfig) or not lm_config.ffn_branch_layers:
    return []
  theirs = authors_pvm_config(lm_config, pvm.latent_dim)
  out = []
  for name in ("d_model", "head_dim", "kv_heads", "ffn_dim", "vis_dim", "eps"):
    a, b = getattr(pvm, name), getattr(theirs, name)
    if a != b:
      out.append(f"{name}={a} (theirs: {b})")
  if getattr(pvm, "source", "raw") != "raw":
    out.append(f"source={pvm.source!r} (theirs: 'raw')")
  return out


def pvm_layers(lm_config: LMConfig) -> tuple[int, ...]:
  """The layers holding a PVM branch (empty when the beside-FFN slot holds none)."""
  if not isinstance(lm_config.ffn_branch, PVMConfig):
    return ()
  return tuple(lm_config.ffn_branch_layers)


def pvm_text_fields(lm_config: LMConfig) -> dict:
  """The authors' text_config fields for `lm_config`'s PVM branches ({} without any)."""
  layers = pvm_layers(lm_config)
  if not layers:
    return {}
  return {"pvm_layers": list(layers), "pvm_hidden_size": lm_config.ffn_branch.latent_dim}


def pvm_config_from_hf(text_config: dict, lm_config: LMConfig):
  """(layers, PVMBranchConfig) the authors' fields of `text_config` describe, or None.

  `lm_config`: the backbone already read from the same text_config (widths,
  heads, eps). A checkpoint without `pvm_layers` (a base Qwen3-VL, or theirs
  with PVM off) gives None.
  """
  layers = text_config.get("pvm_layers")
  if not layers:
    return None
  if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                             for i in layers):
    raise HFCheckpointError(f"config.json: text_config.pvm_layers={layers!r} must be a list "
                            "of layer indices.")
  bad = [i for i in layers if not 0 <= i < lm_config.n_layers]
  if bad:
    raise HFCheckpointError(f"config.json: text_config.pvm_layers {bad} outside 0.."
                            f"{lm_config.n_layers - 1}.")
  latent = text_config.get("pvm_hidden_size", 512)   # their configuration class's default
  if not isinstance(latent, int) or latent < 1 or latent % lm_config.head_dim:
    raise HFCheckpointError(f"config.json: text_config.pvm_hidden_size={latent!r} must be a "
                            f"positive multiple of head_dim={lm_config.head_dim}.")
  return tuple(sorted(set(layers))), authors_pvm_config(lm_config, latent)


def pvm_table(lm_config: LMConfig, ours_prefix: str = "") -> dict[str, Row]:
  """The name table of every PVM parameter of `lm_config` ({our path: Row}; shapes are
  their block's for our branch config).

  `ours_prefix`: where the DecoderLM sits in the model ('lm/' in Qwen3VL);
  the paths are then `<prefix>blocks/<i>/ffn_branch/<name>`.
  """
  out = {}
  for layer in pvm_layers(lm_config):
    for ours, (theirs, shape, rule) in NAMES.items():
      out[f"{ours_prefix}blocks/{layer}/ffn_branch/{ours}"] = Row(
          PREFIX.format(layer=layer) + theirs, shape(lm_config.ffn_branch), rule)
  return out


def pvm_targets(lm_config: LMConfig, ours_prefix: str = "") -> dict[str, Target]:
  """{our path: Target} of every PVM parameter of `lm_config`, read from their tensors
  (`ours_prefix`: as `pvm_table`'s)."""
  return table_targets(pvm_table(lm_config, ours_prefix))


def pvm_to_hf(lm_config: LMConfig, flat: dict, ours_prefix: str = "") -> dict[str, np.ndarray]:
  """{their name: array} of every PVM layer; `flat`: our parameters by path.

  Refused (one line) when their block cannot hold the branch (`authors_mismatch`).
  """
  problems = authors_mismatch(lm_config)
  if problems:
    raise HFCheckpointError(f"the PVM branches have no {SOURCE} counterpart: "
                            + "; ".join(problems) + ".")
  return table_to_hf(pvm_table(lm_config, ours_prefix), flat)
