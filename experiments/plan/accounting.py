"""What a decoder LM should cost, from its config alone: parameters and training FLOPs.

The plan prints these beside what XLA reports for the compiled step, so each
number has a first-principles check. Symbols as in DESIGN.md §1; L layers,
BT tokens per step.

PARAMETERS (exact; the plan's test compares them with the abstract model's shapes):
  embedding V·D (+ unembed D·V when untied), final norm D; per layer the two norms
  2·D, attention D·Hq·Dh + D·2·Hkv·Dh + Hq·Dh·D (+ biases Hq·Dh + 2·Hkv·Dh, + q/k
  norms 2·Dh); a dense FFN 3·D·F; an MoE FFN router D·E + experts 3·E·D·H + shared
  3·D·(n_shared·H_shared) (+ the expert bias E when it is updated); each memory
  branch its own `param_count` (experiments/models/params.py); LoRA factors (model.lora,
  rank r) per targeted weight r·(in + out): w_q r·(D + Hq·Dh), w_kv r·(D + 2·Hkv·Dh),
  w_o r·(Hq·Dh + D), each dense-FFN weight r·(D + F).

FLOPs OF ONE TRAINING STEP (a multiply-add is 2 FLOPs; the backward costs twice
the forward, so a matmul weight used once per token costs 6 FLOPs per token):
  train = 6·A·BT + 12·L·T·Hq·Dh·BT          (with remat the blocks' share of A and the
                                            attention term cost 8/6 as much: one more
                                            forward; the output projection always costs
                                            8 per weight and token: the chunked cross
                                            entropy recomputes its logits in the
                                            backward, experiments/models/cross_entropy.py)
  where A counts the multiply-adds per token of every matmul:
    attention projections D·Hq·Dh + D·2·Hkv·Dh + Hq·Dh·D per layer; the dense FFN
    3·D·F, or the MoE FFN D·E + K·3·D·H + 3·D·(n_shared·H_shared) (K routed
    experts per token: active, not total, parameters); the output projection D·V
    (tied or not);
    Lngram v2 per layer: router D·R·M, W_Q D·Hq·Dh, W_O Hq·Dh·D and the readout:
      absorbed / pallas forms 2·Hq·Dh·Dr (W_K folded into the query, W_V after the
      sum) + 2·Hq·R·Dr (scores and weighted sum over R routes of width Dr);
      literal / streaming forms R·Dr·2·Hkv·Dh (K and V of every route) + 2·Hq·R·Dh;
    the other memory arms their "active" parameter count (table rows read count
    as multiply-adds: an overestimate of a few per cent of the branch).
  and 12·L·T·Hq·Dh is causal attention's QKᵀ and AV over the whole T×T square
  (XLA computes the masked half too), forward and backward.
Left out: norms, softmax, the optimiser's update and the surrogate gradients'
elementwise work (a few per cent at small widths; XLA counts them).
"""

from __future__ import annotations

import re

from experiments.models.config import LMConfig
from experiments.models.params import branch_param_count

ABSORBED = ("absorbed", "pallas", "pallas_fused")


def _moe(model: LMConfig):
  return getattr(model, "moe", None), tuple(getattr(model, "moe_layers", ()) or ())


def _shared_width(moe) -> int:
  n_shared = int(getattr(moe, "n_shared_experts", 0) or 0)
  return n_shared * int(getattr(moe, "shared_ffn_dim", 0) or moe.expert_ffn_dim)


def lora_count(model: LMConfig) -> int:
  """Elements of the LoRA factors of `model` (module docstring); 0 without LoRA."""
  if model.lora is None:
    return 0
  D, F, r = model.d_model, model.ffn_dim, model.lora.rank
  q, kv = model.n_heads * model.head_dim, 2 * model.n_kv_heads * model.head_dim
  sizes = {"attn/w_q": D + q, "attn/w_kv": D + kv, "attn/w_o": q + D,
           "mlp/w_gate": D + F, "mlp/w_up": D + F, "mlp/w_down": F + D}
  _, moe_layers = _moe(model)
  pattern = re.compile(model.lora.targets)
  return sum(r * size for i in range(model.n_layers) for name, size in sizes.items()
             if (i not in moe_layers or name.startswith("attn/"))
             and pattern.fullmatch(f"blocks/{i}/{name}"))


def param_count(model: LMConfig) -> dict[str, int]:
  """{"total", "backbone", "memory", "lora", "moe_experts"}: parameters of `model` (module
  docstring); raises ValueError for a beside-FFN branch, which has no formula here."""
  if model.ffn_branch_layers:
    raise ValueError("plan: no analytic parameter count for beside-FFN branches "
                     f"(model.ffn_branch_layers={model.ffn_branch_layers}).")
  D, V, L = model.d_model, model.vocab_size, model.n_layers
  Hq, Hkv, Dh = model.n_heads, model.n_kv_heads, model.head_dim
  attn = D * Hq * Dh + D * 2 * Hkv * Dh + Hq * Dh * D
  if model.qkv_bias:
    attn += Hq * Dh + 2 * Hkv * Dh
  if model.qk_norm:
    attn += 2 * Dh
  moe, moe_layers = _moe(model)
  dense_ffn = 3 * D * model.ffn_dim
  experts = 0
  ffn = dense_ffn * (L - len(moe_layers))
  if moe_layers:
    per = D * moe.n_experts + 3 * moe.n_experts * D * moe.expert_ffn_dim
    per += 3 * D * _shared_width(moe)
    per += moe.n_experts if float(getattr(moe, "bias_update_rate", 0.0) or 0.0) > 0 else 0
    ffn += per * len(moe_layers)
    experts = 3 * moe.n_experts * D * moe.expert_ffn_dim * len(moe_layers)
  backbone = V * D + (0 if model.tie_embeddings else D * V) + D + L * (2 * D + attn) + ffn
  memory = 0
  if model.memory_layers:
    memory = len(model.memory_layers) * branch_param_count(model.memory)["total"]
  lora = lora_count(model)
  return {"total": backbone + memory + lora, "backbone": backbone, "memory": memory,
          "lora": lora, "moe_experts": experts}


def _memory_macs(mem) -> int:
  """Multiply-adds per token of one memory layer (module docstring)."""
  if type(mem).__name__ != "LngramConfig":
    return branch_param_count(mem)["active"]
  D, R, Hq, Dh, Dr = mem.d_model, mem.routes, mem.q_heads, mem.head_dim, mem.route_dim
  dense = D * R * mem.bits + 2 * D * Hq * Dh
  if mem.readout in ABSORBED:
    return dense + 2 * Hq * Dh * Dr + 2 * Hq * R * Dr
  return dense + R * Dr * 2 * mem.kv_heads * Dh + 2 * Hq * R * Dh


def macs_per_token(model: LMConfig) -> dict[str, int]:
  """{"matmul": A, "attention": T-dependent part per token and layer ÷ T (Hq·Dh),
  "active_params": A} (module docstring)."""
  D, L = model.d_model, model.n_layers
  Hq, Hkv, Dh = model.n_heads, model.n_kv_heads, model.head_dim
  moe, moe_layers = _moe(model)
  ffn = 3 * D * model.ffn_dim * (L - len(moe_layers))
  if moe_layers:
    ffn += len(moe_layers) * (D * moe.n_experts + moe.top_k * 3 * D * moe.expert_ffn_dim
                              + 3 * D * _shared_width(moe))
  matmul = L * (D * Hq * Dh + D * 2 * Hkv * Dh + Hq * Dh * D) + ffn + D * model.vocab_size
  if model.memory_layers:
    matmul += len(model.memory_layers) * _memory_macs(model.memory)
  return {"matmul": matmul, "attention": Hq * Dh}


def train_flops(model: LMConfig, *, batch: int, seq_len: int) -> float:
  """FLOPs of one training step over batch × seq_len tokens (module docstring)."""
  macs = macs_per_token(model)
  tokens = batch * seq_len
  passes = 8 if model.remat else 6   # remat reruns each block's forward
  unembed = model.d_model * model.vocab_size   # 8: the chunked loss recomputes its logits
  return (passes * (macs["matmul"] - unembed) * tokens + 8 * unembed * tokens
          + 2 * passes * model.n_layers * seq_len * macs["attention"] * tokens)
