"""The slow, obviously-correct twin of the MoE FFN (experiments/models/moe/layer.py).

One token at a time (`jax.lax.map` over the N tokens): its router
probabilities, its K experts by a stable descending sort (ties: the lowest
index first), and the gated sum of those experts' SwiGLUs, each expert's
weights read by index. Same parameters as `MoEFFN`; the tests compare values
and gradients of the grouped dispatch with this. Imports nothing from moe.py
(moe.py uses `experts_loop` for dispatch="reference").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _swiglu_D(x_D, w_gate_DxH, w_up_DxH, w_down_HxD):
  return (jax.nn.silu(x_D @ w_gate_DxH) * (x_D @ w_up_DxH)) @ w_down_HxD


def experts_loop(x_NxD, experts_NxK, gates_NxK, w_gate_ExDxH, w_up_ExDxH, w_down_ExHxD):
  """Σ_j gates[n, j] · SwiGLU_{experts[n, j]}(x_n), token by token: [N, D] in x's dtype."""
  dtype = x_NxD.dtype

  def one_token(args):
    x_D, experts_K, gates_K = args
    y_D = jnp.zeros(x_D.shape, dtype)
    for j in range(experts_K.shape[0]):   # K is small and static
      e = experts_K[j]
      y_D = y_D + gates_K[j].astype(dtype) * _swiglu_D(
          x_D, w_gate_ExDxH[e].astype(dtype), w_up_ExDxH[e].astype(dtype),
          w_down_ExHxD[e].astype(dtype))
    return y_D

  return jax.lax.map(one_token, (x_NxD, experts_NxK, gates_NxK))


def route_loop(x_NxD, router_DxE, bias_E=None, *, top_k: int, norm_topk_prob: bool):
  """(p [N, E], experts [N, K], gates [N, K]), token by token, top-k by a stable sort."""
  ct = jnp.promote_types(x_NxD.dtype, jnp.float32)

  def one_token(x_D):
    p_E = jax.nn.softmax(x_D.astype(ct) @ router_DxE.astype(ct))
    scores_E = p_E if bias_E is None else p_E + bias_E.astype(ct)
    experts_K = jnp.argsort(-jax.lax.stop_gradient(scores_E), stable=True)[:top_k]
    gates_K = p_E[experts_K]
    if norm_topk_prob:
      gates_K = gates_K / gates_K.sum()
    return p_E, experts_K.astype(jnp.int32), gates_K

  return jax.lax.map(one_token, x_NxD)


def moe_forward_loop(module, x_BxTxD):
  """`MoEFFN.__call__`'s y, recomputed token by token from `module`'s parameters."""
  c = module.config
  B, T, D = x_BxTxD.shape
  x_NxD = x_BxTxD.astype(module.dtype).reshape(B * T, D)
  bias_E = None if module.expert_bias is None else module.expert_bias[...]
  _, experts_NxK, gates_NxK = route_loop(x_NxD, module.router[...], bias_E, top_k=c.top_k,
                                         norm_topk_prob=c.norm_topk_prob)
  y_NxD = experts_loop(x_NxD, experts_NxK, gates_NxK, module.w_gate[...], module.w_up[...],
                       module.w_down[...])
  if module.shared is not None:
    s = module.shared
    y_NxD = y_NxD + jax.lax.map(
        lambda x_D: _swiglu_D(x_D, s.w_gate[...].astype(x_D.dtype),
                              s.w_up[...].astype(x_D.dtype), s.w_down[...].astype(x_D.dtype)),
        x_NxD)
  return y_NxD.reshape(B, T, D)
