"""What a decoder LM should cost, from its config alone: parameters and training FLOPs.

    lm_param_count(config)          {"total", "active", parts}: from the config alone
    param_count(config)             the plan's view of the same count: {"total",
                                    "backbone", "memory", "lora", "moe_experts"}
    macs_per_token(config), train_flops(config, batch=, seq_len=)   FLOPs of a step
    table4_comparison(v1, v2)       v1 and v2 module counts beside the paper's claim
    table4_lines(v1, v2)            the same as printable lines

`lngram-exp plan` prints these beside what XLA reports for the compiled step, so each
number has a first-principles check. Symbols as in DESIGN.md §1; L layers, BT tokens
per step.

PARAMETERS (exact; tests compare `total` with the parameters `nnx.eval_shape` builds):
  embedding V·D, + the output table D·V when untied, + the final norm D;
  each layer: two norms 2D; attention D·Hq·Dh + 2·D·Hkv·Dh + Hq·Dh·D
  (+ Hq·Dh + 2·Hkv·Dh with q/k/v biases, + 2·Dh with q/k norms);
  FFN 3·D·F (dense) or the MoE's router D·E + E·3·D·H + 3·D·S (shared width S);
  memory branches their `param_count` (experiments/models/params.py).
Active per token: everything except the E - K routed experts a token skips and
the memory tables' unread rows; the embedding and output tables count in full
(the usual convention for activated parameters). The MoE's routing bias
(auxiliary-loss-free balancing) is state, not counted by `lm_param_count`; the
plan's `param_count` counts every parameter the model holds: that bias (E per MoE
layer) when it is updated (an `nnx.Param` then), and the LoRA factors (model.lora,
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
from experiments.models.moe import param_count as moe_param_count
from experiments.models.params import branch_param_count, memory_params

ABSORBED = ("absorbed", "pallas", "pallas_fused")

# "Lngram v2 ... reduces the total parameter count of the Lngram module by 82.6% and the
# activated parameters per token by 95.2%" at R = 16 (§4.4, Table 4).
TABLE4_PAPER = {"total": 0.826, "active": 0.952}


def _attention(c: LMConfig) -> int:
  q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
  n = c.d_model * q + 2 * c.d_model * kv + q * c.d_model
  if c.qkv_bias:
    n += q + 2 * kv
  if c.qk_norm:
    n += 2 * c.head_dim
  return n


def lm_param_count(config: LMConfig) -> dict[str, int]:
  """{"total", "active", "embedding", "attention", "ffn", "ffn_active", "norms",
  "memory", "memory_active"} of `config` (module docstring); beside-FFN
  branches are not counted (refused)."""
  c = config
  if c.ffn_branch_layers:
    raise ValueError("lm_param_count: beside-FFN branches are not counted; count them "
                     "with nnx.eval_shape.")
  D = c.d_model
  embedding = c.vocab_size * D * (1 if c.tie_embeddings else 2)
  norms = D + 2 * D * c.n_layers
  moe_layers = set(getattr(c, "moe_layers", ()) or ())
  ffn = ffn_active = 0
  for i in range(c.n_layers):
    if i in moe_layers:
      counts = moe_param_count(c.moe)
      ffn, ffn_active = ffn + counts["total"], ffn_active + counts["active"]
    else:
      ffn, ffn_active = ffn + 3 * D * c.ffn_dim, ffn_active + 3 * D * c.ffn_dim
  attention = c.n_layers * _attention(c)
  memory, memory_active = memory_params(c)
  dense = embedding + norms + attention
  return {"total": dense + ffn + memory, "active": dense + ffn_active + memory_active,
          "embedding": embedding, "attention": attention, "ffn": ffn,
          "ffn_active": ffn_active, "norms": norms, "memory": memory,
          "memory_active": memory_active}


def _moe(model: LMConfig):
  return getattr(model, "moe", None), tuple(getattr(model, "moe_layers", ()) or ())


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
  """{"total", "backbone", "memory", "lora", "moe_experts"}: every parameter `model`
  holds (`lm_param_count`, the updated routing bias and the LoRA factors: module
  docstring); raises ValueError for a beside-FFN branch, which has no formula here."""
  if model.ffn_branch_layers:
    raise ValueError("plan: no analytic parameter count for beside-FFN branches "
                     f"(model.ffn_branch_layers={model.ffn_branch_layers}).")
  counts = lm_param_count(model)
  moe, moe_layers = _moe(model)
  bias = experts = 0
  if moe_layers:
    updated = float(getattr(moe, "bias_update_rate", 0.0) or 0.0) > 0
    bias = moe.n_experts * len(moe_layers) if updated else 0
    experts = moe_param_count(moe)["experts"] * len(moe_layers)
  backbone = (counts["embedding"] + counts["norms"] + counts["attention"] + counts["ffn"]
              + bias)
  lora = lora_count(model)
  return {"total": backbone + counts["memory"] + lora, "backbone": backbone,
          "memory": counts["memory"], "lora": lora, "moe_experts": experts}


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
  """{"matmul": A, "attention": T-dependent part per token and layer ÷ T (Hq·Dh)}
  (module docstring)."""
  D, L = model.d_model, model.n_layers
  Hq, Hkv, Dh = model.n_heads, model.n_kv_heads, model.head_dim
  moe, moe_layers = _moe(model)
  ffn = 3 * D * model.ffn_dim * (L - len(moe_layers))
  if moe_layers:
    ffn += len(moe_layers) * (D * moe.n_experts + moe.top_k * 3 * D * moe.expert_ffn_dim
                              + 3 * D * moe.shared_width)
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


def table4_comparison(v1: LMConfig, v2: LMConfig) -> dict:
  """Lngram v1's and v2's module parameters (all memory layers) and v2's reduction,
  beside the paper's: {"v1": (total, active), "v2": (total, active),
  "reduction": {"total", "active"}, "paper": TABLE4_PAPER}."""
  a, b = memory_params(v1), memory_params(v2)
  if not a[0] or not b[0]:
    raise ValueError("table4_comparison: both models need memory layers (v1, then v2).")
  return {"v1": a, "v2": b,
          "reduction": {"total": 1 - b[0] / a[0], "active": 1 - b[1] / a[1]},
          "paper": dict(TABLE4_PAPER)}


def table4_lines(v1: LMConfig, v2: LMConfig) -> list[str]:
  """`table4_comparison` as lines for a terminal."""
  t = table4_comparison(v1, v2)
  r, p = t["reduction"], t["paper"]
  return [f"Lngram v1 module: {t['v1'][0] / 1e6:.2f}M parameters, {t['v1'][1] / 1e6:.2f}M "
          f"active per token ({len(v1.memory_layers)} layers)",
          f"Lngram v2 module: {t['v2'][0] / 1e6:.2f}M parameters, {t['v2'][1] / 1e6:.2f}M "
          f"active per token (R = {v2.memory.routes})",
          f"v2 vs v1: {100 * r['total']:.1f}% fewer parameters, {100 * r['active']:.1f}% fewer "
          f"active (paper, R = 16: {100 * p['total']:.1f}% / {100 * p['active']:.1f}%)"]
