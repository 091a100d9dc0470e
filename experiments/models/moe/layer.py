"""The mixture-of-experts FFN of the decoder: routed SwiGLU experts, top-k, shared experts.

A layer in `LMConfig.moe_layers` runs `MoEFFN` where other layers run the dense
SwiGLU (experiments/models/lm.py). Per token x (DeepSeekMoE, Dai et al.,
arXiv 2401.06066; Qwen3-MoE's router):

    p      = softmax(x W_r)                       [E], float32 (float64 for float64 x)
    S      = top_k(p + b)                         the k experts; b = expert_bias (0 if off)
    g_e    = p_e for e in S                       / Σ_{e∈S} p_e when norm_topk_prob
    y      = Σ_{e∈S} g_e · SwiGLU_e(x) + SwiGLU_shared(x)

Ties in top_k go to the lowest expert index (`jax.lax.top_k` keeps index order
among equal values; the reference's stable argsort does the same). No token is
dropped by default (no capacity). Shared experts (DeepSeek-V2) are one SwiGLU of width
n_shared_experts · shared_ffn_dim, always on.

Balance loss (Switch, Fedus et al., arXiv 2101.03961, in DeepSeek's top-k form),
over the N valid tokens:

    load_e = #{(n, j): S_n[j] = e} / (k·N)        share of routed slots (no gradient)
    P_e    = (1/N) Σ_n p_{n,e}
    balance_loss = E · Σ_e load_e · P_e           1 when perfectly balanced

and the LM adds balance_coef · balance_loss per MoE layer. (Hugging Face's
`load_balancing_loss_func` sums over the k choices separately: k times this.)

Auxiliary-loss-free balancing (DeepSeek-V3, arXiv 2412.19437), bias_update_rate
γ > 0: after each train step b_e ← b_e + γ · sign(1/E − load_e) (underloaded
experts gain, overloaded lose); b only picks S, the gates g stay those of p.
b is `ExpertBias`, a parameter that no gradient reaches (top_k's indices have
none) and whose optimiser update the train step replaces by this rule
(`bias_update`; experiments/trainer/step.py), so checkpoints, restore and
insertion carry it like every parameter.

Dispatch: "grouped" sorts the N·k token slots by expert, runs the experts as
three grouped matmuls over the sorted slots (kernels/grouped_matmul: megablox
in a TPU program, XLA's ragged_dot elsewhere) and adds the gated outputs back
into their tokens; "reference" is the per-token loop of
experiments/models/moe/reference.py (the test twin). On a training mesh of more
than one device the grouped form runs under shard_map, each device on its own
tokens; with an `expert` axis the slots travel by all-to-all to the device
holding their expert and back (expert parallelism,
experiments/models/moe/parallel.py). No slot is dropped unless a
capacity_factor is set.

Shape legend: experiments/models/__init__.py; N tokens (B·T), E experts, K top_k,
H expert width, S = N·K token slots. Layout and choices: DESIGN.md §6.7.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.layers import SwiGLU, normal
from experiments.models.moe import parallel as moe_parallel
from experiments.models.moe import reference as moe_reference
from kernels.grouped_matmul import grouped_matmul
from lngram_jax import dataclass_json

ROUTERS = ("softmax",)
DISPATCHES = ("grouped", "reference")
_OWNER = "MoEConfig"


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """One MoE FFN layer (module docstring).

  d_model: D. n_experts: E routed experts. top_k: K experts per token.
  expert_ffn_dim: H, each routed expert's hidden width. n_shared_experts:
  always-on experts (0 = none), run as one SwiGLU of width
  n_shared_experts · shared_ffn_dim; shared_ffn_dim 0 = expert_ffn_dim.
  norm_topk_prob: renormalise the K gates to sum to 1 (Qwen3-MoE).
  router: "softmax". balance_coef: weight of the balance loss in the LM loss.
  bias_update_rate: γ of the auxiliary-loss-free bias (0 = off, no bias).
  dispatch: "grouped" (grouped matmuls) or "reference" (per-token loop).
  capacity_factor: 0 (dropless: every token reaches its K experts) or c > 0: on
  an `expert` axis each device receives at most ceil(c · its slots) rows and
  drops the rest, counted per step (experiments/models/moe/parallel.py).
  """

  d_model: int
  n_experts: int = 8
  top_k: int = 2
  expert_ffn_dim: int = 256
  n_shared_experts: int = 0
  shared_ffn_dim: int = 0
  norm_topk_prob: bool = False
  router: str = "softmax"
  balance_coef: float = 0.01
  bias_update_rate: float = 0.0
  dispatch: str = "grouped"
  capacity_factor: float = 0.0

  def __post_init__(self):
    for name in ("d_model", "n_experts", "top_k", "expert_ffn_dim"):
      dataclass_json.check_positive_int(_OWNER, name, getattr(self, name))
    dataclass_json.check_int_at_least(_OWNER, "n_shared_experts", self.n_shared_experts, 0)
    dataclass_json.check_int_at_least(_OWNER, "shared_ffn_dim", self.shared_ffn_dim, 0,
                                      "(0 = expert_ffn_dim)")
    dataclass_json.check_bool(_OWNER, "norm_topk_prob", self.norm_topk_prob)
    for name in ("balance_coef", "bias_update_rate", "capacity_factor"):
      dataclass_json.check_finite(_OWNER, name, getattr(self, name), at_least=0.0)
    if self.top_k > self.n_experts:
      raise ValueError(f"{_OWNER}: top_k={self.top_k} must be <= n_experts={self.n_experts}.")
    if self.router not in ROUTERS:
      raise ValueError(f"{_OWNER}: router={self.router!r} must be one of {ROUTERS}.")
    if self.dispatch not in DISPATCHES:
      raise ValueError(f"{_OWNER}: dispatch={self.dispatch!r} must be one of {DISPATCHES}.")

  @property
  def shared_width(self) -> int:
    """Width of the one shared SwiGLU (0: no shared experts)."""
    return self.n_shared_experts * (self.shared_ffn_dim or self.expert_ffn_dim)

  def replace(self, **changes) -> MoEConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    return dataclass_json.to_json(self)

  @classmethod
  def from_dict(cls, d: dict) -> MoEConfig:
    return dataclass_json.from_json(cls, d, owner="MoEConfig.from_dict")


def param_count(config: MoEConfig) -> dict[str, int]:
  """Parameters of one MoE FFN: total, and active (what one token's forward reads:
  the router, K routed experts and the shared experts). The bias (E) is not counted."""
  c = config
  D, E, K, H = c.d_model, c.n_experts, c.top_k, c.expert_ffn_dim
  router, expert, shared = D * E, 3 * D * H, 3 * D * c.shared_width
  return {"total": router + E * expert + shared, "active": router + K * expert + shared,
          "router": router, "experts": E * expert, "shared": shared}


class ExpertBias(nnx.Param):
  """The auxiliary-loss-free routing bias b [E] (float32).

  A Param only so that checkpoints, restore, insertion and placement carry it
  with the weights; no gradient reaches it and the train step overwrites the
  optimiser's update with the sign rule (`bias_update`).
  """


# --- the functional core --------------------------------------------------------------------


def compute_dtype(dtype):
  """float32 for the router's softmax, float64 when the activations are float64."""
  return jnp.promote_types(dtype, jnp.float32)


def route(x_NxD, router_DxE, bias_E=None, *, top_k: int, norm_topk_prob: bool):
  """(p [N, E], experts [N, K] int32, gates [N, K]) in `compute_dtype(x)`.

  top_k picks from p + bias (ties: lowest index); the gates are p itself.
  """
  ct = compute_dtype(x_NxD.dtype)
  logits_NxE = jnp.einsum("nd,de->ne", x_NxD.astype(ct), router_DxE.astype(ct))
  p_NxE = jax.nn.softmax(logits_NxE, axis=-1)
  scores_NxE = p_NxE if bias_E is None else p_NxE + jax.lax.stop_gradient(bias_E).astype(ct)
  _, experts_NxK = jax.lax.top_k(jax.lax.stop_gradient(scores_NxE), top_k)
  experts_NxK = experts_NxK.astype(jnp.int32)
  # p at the chosen experts, read through a one-hot mask and a sum (exact: one product by
  # 1, the rest by 0; elementwise, so no matmul precision applies): the TPU compiler
  # bills take_along_axis's gather and its scatter transpose at gigabytes per layer
  # (4 GiB forward at 8,192 tokens; DESIGN.md §6.7).
  pick_NxKxE = jax.nn.one_hot(experts_NxK, p_NxE.shape[-1], dtype=ct)
  gates_NxK = jnp.sum(p_NxE[:, None, :] * pick_NxKxE, axis=-1)
  if norm_topk_prob:
    gates_NxK = gates_NxK / jnp.sum(gates_NxK, axis=-1, keepdims=True)
  return p_NxE, experts_NxK, gates_NxK


def balance_stats(p_NxE, experts_NxK, valid_N=None):
  """(balance_loss scalar, load [E]) over the valid tokens (module docstring); float32."""
  N, E = p_NxE.shape
  K = experts_NxK.shape[-1]
  w_N = jnp.ones((N,), jnp.float32) if valid_N is None else valid_N.astype(jnp.float32)
  n = jnp.maximum(w_N.sum(), 1.0)
  counts_E = jnp.zeros((E,), jnp.float32).at[experts_NxK.reshape(-1)].add(
      jnp.repeat(w_N, K))
  load_E = jax.lax.stop_gradient(counts_E / (K * n))
  # Selected, not multiplied: a NaN probability at a padding token stays out.
  p_NxE = jnp.where(w_N[:, None] > 0, p_NxE.astype(jnp.float32), 0.0)
  P_E = jnp.einsum("n,ne->e", w_N, p_NxE) / n
  return E * jnp.sum(load_E * P_E), load_E


def bias_update(bias_E, load_E, rate: float):
  """DeepSeek-V3's rule: b + γ · sign(1/E − load) (float32)."""
  E = load_E.shape[-1]
  return (bias_E + rate * jnp.sign(1.0 / E - load_E)).astype(bias_E.dtype)


def expert_swiglu(rows_RxD, sizes_L, w_gate_LxDxH, w_up_LxDxH, w_down_LxHxD):
  """SwiGLU_l of each row, rows sorted by expert l (sizes_L rows each; rows past them
  come out zero): three grouped matmuls (kernels/grouped_matmul, chosen by the
  platform the program is lowered for). [R, D] in the rows' dtype."""
  h_RxH = (jax.nn.silu(grouped_matmul(rows_RxD, w_gate_LxDxH, sizes_L))
           * grouped_matmul(rows_RxD, w_up_LxDxH, sizes_L))
  return grouped_matmul(h_RxH, w_down_LxHxD, sizes_L)


def grouped_experts(x_NxD, experts_NxK, gates_NxK, w_gate_ExDxH, w_up_ExDxH, w_down_ExHxD):
  """Σ_j gates[n, j] · SwiGLU_{experts[n, j]}(x_n) on one device: [N, D] in x's dtype.

  The N·K slots are sorted by expert (stable), run as grouped matmuls
  (`expert_swiglu`) and added back into their tokens with their gates.
  """
  N, D = x_NxD.shape
  K = experts_NxK.shape[-1]
  E = w_gate_ExDxH.shape[0]
  expert_S = experts_NxK.reshape(N * K)
  order_S = jnp.argsort(expert_S, stable=True)
  sizes_E = jnp.bincount(expert_S, length=E).astype(jnp.int32)
  token_S = order_S // K
  dtype = x_NxD.dtype
  ys_SxD = expert_swiglu(x_NxD[token_S], sizes_E, w_gate_ExDxH, w_up_ExDxH, w_down_ExHxD)
  gates_S = gates_NxK.reshape(N * K)[order_S].astype(dtype)
  return jnp.zeros((N, D), dtype).at[token_S].add(ys_SxD * gates_S[:, None])


# --- the module -----------------------------------------------------------------------------


class MoEFFN(nnx.Module):
  """Routed + shared SwiGLU experts (module docstring). Parameters:

    router   [D, E]        (logits = x @ router)
    w_gate, w_up [E, D, H]; w_down [E, H, D]
    shared   the dense `SwiGLU` (w_gate, w_up, w_down) when n_shared_experts > 0
    expert_bias [E]        `ExpertBias`, only when bias_update_rate > 0

  Draw order: router, w_gate, w_up, w_down, shared.
  """

  def __init__(self, config: MoEConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
               init_std: float = 0.02, out_std: float | None = None, rngs: nnx.Rngs):
    c = self.config = config
    D, E, H = c.d_model, c.n_experts, c.expert_ffn_dim
    out_std = init_std if out_std is None else out_std
    self.dtype = dtype
    self.router = nnx.Param(normal(init_std)(rngs.params(), (D, E), param_dtype))
    self.w_gate = nnx.Param(normal(init_std)(rngs.params(), (E, D, H), param_dtype))
    self.w_up = nnx.Param(normal(init_std)(rngs.params(), (E, D, H), param_dtype))
    self.w_down = nnx.Param(normal(out_std)(rngs.params(), (E, H, D), param_dtype))
    self.shared = SwiGLU(D, c.shared_width, dtype=dtype, param_dtype=param_dtype,
                         init_std=init_std, out_std=out_std, rngs=rngs) if c.shared_width else None
    self.expert_bias = (ExpertBias(jnp.zeros((E,), jnp.float32))
                        if c.bias_update_rate > 0 else None)

  def __call__(self, x_BxTxD, *, valid_BxT=None, mesh=None):
    """(y [B, T, D] in the module's dtype, aux {"balance_loss": float32 scalar,
    "expert_load": [E] float32}); `mesh`: the training mesh (more than one device:
    the dispatch runs per token block, and over `expert` expert-parallel)."""
    c = self.config
    B, T, D = x_BxTxD.shape
    if D != c.d_model:
      raise ValueError(f"MoEFFN: input width {D} != d_model={c.d_model}.")
    x_BxTxD = x_BxTxD.astype(self.dtype)
    x_NxD = x_BxTxD.reshape(B * T, D)
    bias_E = None if self.expert_bias is None else self.expert_bias[...]
    p_NxE, experts_NxK, gates_NxK = route(x_NxD, self.router[...], bias_E, top_k=c.top_k,
                                          norm_topk_prob=c.norm_topk_prob)
    weights = (self.w_gate[...], self.w_up[...], self.w_down[...])
    dropped = None
    if c.dispatch == "reference":
      y_NxD = moe_reference.experts_loop(x_NxD, experts_NxK, gates_NxK, *weights)
    elif _on_mesh(mesh):
      y_BxTxD, dropped = moe_parallel.expert_parallel_experts(
          expert_swiglu, grouped_experts, mesh, x_BxTxD, experts_NxK.reshape(B, T, -1),
          gates_NxK.reshape(B, T, -1), *weights, capacity_factor=c.capacity_factor)
      y_NxD = y_BxTxD.reshape(B * T, D)
    else:
      y_NxD = grouped_experts(x_NxD, experts_NxK, gates_NxK, *weights)
    y_BxTxD = y_NxD.reshape(B, T, D).astype(self.dtype)
    if self.shared is not None:
      y_BxTxD = y_BxTxD + self.shared(x_BxTxD)
    valid_N = None if valid_BxT is None else valid_BxT.reshape(B * T)
    balance_loss, load_E = balance_stats(p_NxE, experts_NxK, valid_N)
    aux = {"balance_loss": balance_loss.astype(jnp.float32), "expert_load": load_E}
    if c.capacity_factor > 0:
      aux["dropped"] = jnp.zeros((), jnp.int32) if dropped is None else dropped
    return y_BxTxD, aux


def _on_mesh(mesh) -> bool:
  # On any mesh of more than one device, also with expert = 1: left to XLA, the sort
  # and gathers of the grouped dispatch become one global sort of the whole batch's
  # slots on every device; under shard_map each device sorts its own tokens' slots.
  return mesh is not None and mesh.size > 1


def routing_bias_updates(model, aux: dict) -> dict:
  """The new routing biases of a `DecoderLM`'s MoE layers after a step whose forward
  gave `aux` (`bias_update` of each layer's `moe/<i>/expert_load`), as the subtree
  {"blocks": {i: {"mlp": {"expert_bias": b}}}} of its parameters; {} if none.

  The LM loss returns this under the train step's RULE_UPDATES
  (experiments/trainer/step.py), which writes it over the optimiser's update.
  """
  blocks = {}
  for i, block in enumerate(model.blocks):
    mlp = block.mlp
    if not isinstance(mlp, MoEFFN) or mlp.expert_bias is None:
      continue
    if tuple(model.layer_spans[i]) != (i, i + 1):
      raise ValueError("the routing-bias update needs the unrolled model (scan=False).")
    new_E = bias_update(mlp.expert_bias[...], aux[f"moe/{i}/expert_load"],
                        mlp.config.bias_update_rate)
    blocks[i] = {"mlp": {"expert_bias": new_E}}
  return {"blocks": blocks} if blocks else {}
