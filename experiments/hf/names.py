"""Hugging Face tensor names <-> `DecoderLM` parameter paths: one table, read both ways.

The table machinery (Row, Rule, the derivations) is experiments/hf/tables.py. Each
family writes its table once: the dense decoders here (`lm_table`), Qwen3-MoE's
expert rows in experiments/hf/qwen3_moe.py, Qwen3-VL in
experiments/hf/qwen3vl/names.py, the PVM and Lngram v2 branches in
experiments/hf/pvm_format.py and experiments/hf/memory_export.py.

HF linear weights are [out, in] (y = x Wᵀ); ours are [in, ...] (y = x W), with
the head axes split out. Per layer i (`model.layers.i.` prefix on the left):

  self_attn.q_proj.weight [Hq·Dh, D]     blocks/i/attn/w_q [D, Hq, Dh]      transpose, split
  self_attn.{k,v}_proj.weight [Hkv·Dh, D] blocks/i/attn/w_kv [D, 2, Hkv, Dh] transpose, split, stack
  self_attn.o_proj.weight [D, Hq·Dh]     blocks/i/attn/w_o [Hq, Dh, D]      transpose, split
  self_attn.q_proj.bias [Hq·Dh]          blocks/i/attn/b_q [Hq, Dh]          (Qwen2)
  self_attn.{k,v}_proj.bias              blocks/i/attn/b_kv [2, Hkv, Dh]     (Qwen2)
  self_attn.{q,k}_norm.weight [Dh]       blocks/i/attn/{q,k}_norm/scale      (Qwen3)
  input_layernorm.weight                 blocks/i/attn_norm/scale
  post_attention_layernorm.weight        blocks/i/mlp_norm/scale
  mlp.{gate,up}_proj.weight [F, D]       blocks/i/mlp/w_{gate,up} [D, F]     transpose
  mlp.down_proj.weight [D, F]            blocks/i/mlp/w_down [F, D]          transpose
and model.embed_tokens.weight [V, D] -> embed/table, model.norm.weight ->
final_norm/scale, lm_head.weight [V, D] -> unembed [D, V] (untied only).
Qwen3-MoE's sparse layers replace the mlp.* rows by their router and experts
(experiments/hf/qwen3_moe.py).
"""

from __future__ import annotations

import numpy as np

from experiments.hf import qwen3_moe
from experiments.hf.tables import (
  SAME,
  TRANSPOSE,
  Row,
  Target,
  reshaped,
  split_in,
  split_out,
  stacked,
  table_shapes,
  table_targets,
  table_to_hf,
)
from experiments.models.config import LMConfig


def lm_table(config: LMConfig, experts: str = "per_expert") -> dict[str, Row]:
  """The name table of every backbone parameter of `config`; `experts`: the layout of
  MoE expert tensors (experiments/hf/qwen3_moe.py)."""
  c = config
  D, V, F = c.d_model, c.vocab_size, c.ffn_dim
  Hq, Hkv, Dh = c.n_heads, c.n_kv_heads, c.head_dim
  q, kv = Hq * Dh, Hkv * Dh
  t = {"embed/table": Row("model.embed_tokens.weight", (V, D), SAME),
       "final_norm/scale": Row("model.norm.weight", (D,), SAME)}
  if not c.tie_embeddings:
    t["unembed"] = Row("lm_head.weight", (V, D), TRANSPOSE)
  for i in range(c.n_layers):
    hf, ours = f"model.layers.{i}.", f"blocks/{i}/"
    a = hf + "self_attn."
    t[ours + "attn_norm/scale"] = Row(hf + "input_layernorm.weight", (D,), SAME)
    t[ours + "mlp_norm/scale"] = Row(hf + "post_attention_layernorm.weight", (D,), SAME)
    t[ours + "attn/w_q"] = Row(a + "q_proj.weight", (q, D), split_out(Hq, Dh))
    t[ours + "attn/w_kv"] = Row((a + "k_proj.weight", a + "v_proj.weight"), (kv, D),
                                stacked(split_out(Hkv, Dh), axis=1))
    t[ours + "attn/w_o"] = Row(a + "o_proj.weight", (D, q), split_in(Hq, Dh))
    if c.qkv_bias:
      t[ours + "attn/b_q"] = Row(a + "q_proj.bias", (q,), reshaped(Hq, Dh))
      t[ours + "attn/b_kv"] = Row((a + "k_proj.bias", a + "v_proj.bias"), (kv,),
                                  stacked(reshaped(Hkv, Dh), axis=0))
    if c.qk_norm:
      t[ours + "attn/q_norm/scale"] = Row(a + "q_norm.weight", (Dh,), SAME)
      t[ours + "attn/k_norm/scale"] = Row(a + "k_norm.weight", (Dh,), SAME)
    if i in c.moe_layers:
      t |= qwen3_moe.layer_table(c, i, experts)
      continue
    for name, shape in (("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
      t[ours + f"mlp/w_{name}"] = Row(hf + f"mlp.{name}_proj.weight", shape, TRANSPOSE)
  return t


def param_targets(config: LMConfig, experts: str = "per_expert") -> dict[str, Target]:
  """{our parameter path: Target} for every backbone parameter of `config`;
  `experts`: the layout of MoE expert tensors (experiments/hf/qwen3_moe.py)."""
  return table_targets(lm_table(config, experts))


# Tensors a checkpoint may hold that no parameter reads: old rotary buffers,
# and lm_head beside tied embeddings (it is the embedding table).
def ignorable(name: str, config: LMConfig) -> bool:
  return name.endswith("rotary_emb.inv_freq") or (config.tie_embeddings
                                                  and name == "lm_head.weight")


def to_hf(config: LMConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Our backbone parameters {path: array} as HF tensors {name: array} (the export;
  MoE experts per expert)."""
  return table_to_hf(lm_table(config), params)


def hf_shapes(config: LMConfig, experts: str = "per_expert") -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape} that a checkpoint of `config` holds (`experts`: the
  layout of MoE expert tensors)."""
  return table_shapes(lm_table(config, experts))
