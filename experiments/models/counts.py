"""Analytic parameter counts of a whole `DecoderLM`, and the Lngram v2 paper's Table 4 claim.

    lm_param_count(config)          {"total", "active", parts}: from the config alone
    table4_comparison(v1, v2)       v1 and v2 module counts beside the paper's claim
    table4_lines(v1, v2)            the same as printable lines

Formula (D width, V vocabulary, per layer Hq, Hkv, Dh, F):
  embedding V·D, + the output table D·V when untied, + the final norm D;
  each layer: two norms 2D; attention D·Hq·Dh + 2·D·Hkv·Dh + Hq·Dh·D
  (+ Hq·Dh + 2·Hkv·Dh with q/k/v biases, + 2·Dh with q/k norms);
  FFN 3·D·F (dense) or the MoE's router D·E + E·3·D·H + 3·D·S (shared width S);
  memory branches their `param_count` (experiments/models/params.py).
Active per token: everything except the E - K routed experts a token skips and
the memory tables' unread rows; the embedding and output tables count in full
(the usual convention for activated parameters). The MoE's routing bias
(auxiliary-loss-free balancing) is state, not counted. Tests compare `total`
with the parameters `nnx.eval_shape` builds.
"""

from __future__ import annotations

from experiments.models.config import LMConfig
from experiments.models.moe import param_count as moe_param_count
from experiments.models.params import memory_params

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
