"""Hugging Face tensor names -> `DecoderLM` parameter paths, with the transform of each.

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
The same table read backwards is the export (`to_hf`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from experiments.hf import qwen3_moe
from experiments.models.config import LMConfig


@dataclasses.dataclass(frozen=True)
class Target:
  """One parameter: the HF tensors it is built from and how (arrays in HF layout)."""
  sources: tuple[str, ...]
  build: Callable[..., np.ndarray]


def _same(a):
  return a


def _linear(*shape):
  """[out, in] -> [in, *shape] (the output axis split into `shape`)."""
  return lambda w: np.reshape(w.T, (w.shape[1], *shape))


def _linear_in(*shape):
  """[out, in] -> [*shape, out] (the input axis split into `shape`; o_proj)."""
  return lambda w: np.reshape(w.T, (*shape, w.shape[0]))


def param_targets(config: LMConfig, experts: str = "per_expert") -> dict[str, Target]:
  """{our parameter path: Target} for every backbone parameter of `config`;
  `experts`: the layout of MoE expert tensors (experiments/hf/qwen3_moe.py)."""
  c = config
  Hq, Hkv, Dh = c.n_heads, c.n_kv_heads, c.head_dim
  t = {"embed/table": Target(("model.embed_tokens.weight",), _same),
       "final_norm/scale": Target(("model.norm.weight",), _same)}
  if not c.tie_embeddings:
    t["unembed"] = Target(("lm_head.weight",), lambda w: w.T)
  kv = _linear(Hkv, Dh)
  for i in range(c.n_layers):
    hf, ours = f"model.layers.{i}.", f"blocks/{i}/"
    a = hf + "self_attn."
    t[ours + "attn_norm/scale"] = Target((hf + "input_layernorm.weight",), _same)
    t[ours + "mlp_norm/scale"] = Target((hf + "post_attention_layernorm.weight",), _same)
    t[ours + "attn/w_q"] = Target((a + "q_proj.weight",), _linear(Hq, Dh))
    t[ours + "attn/w_kv"] = Target((a + "k_proj.weight", a + "v_proj.weight"),
                                   lambda k, v: np.stack([kv(k), kv(v)], axis=1))
    t[ours + "attn/w_o"] = Target((a + "o_proj.weight",), _linear_in(Hq, Dh))
    if c.qkv_bias:
      t[ours + "attn/b_q"] = Target((a + "q_proj.bias",), lambda b: np.reshape(b, (Hq, Dh)))
      t[ours + "attn/b_kv"] = Target(
          (a + "k_proj.bias", a + "v_proj.bias"),
          lambda k, v: np.stack([np.reshape(k, (Hkv, Dh)), np.reshape(v, (Hkv, Dh))]))
    if c.qk_norm:
      t[ours + "attn/q_norm/scale"] = Target((a + "q_norm.weight",), _same)
      t[ours + "attn/k_norm/scale"] = Target((a + "k_norm.weight",), _same)
    if i in c.moe_layers:
      t |= qwen3_moe.layer_targets(c, i, Target, experts)
      continue
    for name in ("gate", "up", "down"):
      t[ours + f"mlp/w_{name}"] = Target((hf + f"mlp.{name}_proj.weight",), lambda w: w.T)
  return t


# Tensors a checkpoint may hold that no parameter reads: old rotary buffers,
# and lm_head beside tied embeddings (it is the embedding table).
def ignorable(name: str, config: LMConfig) -> bool:
  return name.endswith("rotary_emb.inv_freq") or (config.tie_embeddings
                                                  and name == "lm_head.weight")


def to_hf(config: LMConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Our backbone parameters {path: array} as HF tensors {name: array} (the export)."""
  c = config
  Hq, Hkv, Dh = c.n_heads, c.n_kv_heads, c.head_dim
  out = {}
  for i in c.moe_layers:
    out |= qwen3_moe.layer_to_hf(c, i, params)
  for path, target in param_targets(config).items():
    p = np.asarray(params[path])
    names = target.sources
    if "/mlp/" in path and int(path.split("/")[1]) in c.moe_layers:
      continue   # written above
    if path.endswith("attn/w_kv"):
      for j, name in enumerate(names):
        out[name] = p[:, j].reshape(p.shape[0], Hkv * Dh).T
    elif path.endswith("attn/b_kv"):
      for j, name in enumerate(names):
        out[name] = p[j].reshape(Hkv * Dh)
    elif path.endswith("attn/w_q"):
      out[names[0]] = p.reshape(p.shape[0], Hq * Dh).T
    elif path.endswith("attn/w_o"):
      out[names[0]] = p.reshape(Hq * Dh, p.shape[-1]).T
    elif path.endswith("attn/b_q"):
      out[names[0]] = p.reshape(Hq * Dh)
    elif p.ndim == 2 and path != "embed/table":
      out[names[0]] = p.T
    else:
      out[names[0]] = p
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_shapes(config: LMConfig, experts: str = "per_expert") -> dict[str, tuple[int, ...]]:
  """{HF tensor name: shape} that a checkpoint of `config` holds (`experts`: the
  layout of MoE expert tensors)."""
  c = config
  D, V, F = c.d_model, c.vocab_size, c.ffn_dim
  q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  s = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
  if not c.tie_embeddings:
    s["lm_head.weight"] = (V, D)
  for i in range(c.n_layers):
    hf = f"model.layers.{i}."
    a = hf + "self_attn."
    s |= {hf + "input_layernorm.weight": (D,), hf + "post_attention_layernorm.weight": (D,),
          a + "q_proj.weight": (q, D), a + "k_proj.weight": (kv, D),
          a + "v_proj.weight": (kv, D), a + "o_proj.weight": (D, q)}
    if i in c.moe_layers:
      s |= qwen3_moe.layer_shapes(c, i, experts)
    else:
      s |= {hf + "mlp.gate_proj.weight": (F, D), hf + "mlp.up_proj.weight": (F, D),
            hf + "mlp.down_proj.weight": (D, F)}
    if c.qkv_bias:
      s |= {a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)}
    if c.qk_norm:
      s |= {a + "q_norm.weight": (c.head_dim,), a + "k_norm.weight": (c.head_dim,)}
  return s
