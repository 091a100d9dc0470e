"""A dense decoder layer of the same width: the yardstick of `experiments.tools.bench.layer`.

    u = x + Attn(RMSNorm(x)),   y = u + SwiGLU(RMSNorm(u))

Grouped-query causal attention (Hq query heads reading Hkv KV heads of width
dh, Hq·dh = d) and a SwiGLU of width 3·d (Llama's 6144 at d = 2048). There is
no rotary embedding: a few elementwise ops that do not move the comparison.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lngram_jax.norms import rms_norm


class DenseDecoderLayer(nnx.Module):
  """Pre-norm attention + SwiGLU block, parameters normal(0, 0.02)."""

  def __init__(self, d_model: int, *, q_heads: int, kv_heads: int, head_dim: int,
               ffn_mult: int = 3, dtype=jnp.float32, param_dtype=jnp.float32,
               attention: str = "xla", rngs: nnx.Rngs):
    if q_heads * head_dim != d_model or q_heads % kv_heads:
      raise ValueError(
          f"DenseDecoderLayer: need q_heads*head_dim == d_model and kv_heads | q_heads; "
          f"got q_heads={q_heads}, head_dim={head_dim}, d_model={d_model}, "
          f"kv_heads={kv_heads}.")
    self.q_heads, self.kv_heads, self.head_dim = q_heads, kv_heads, head_dim
    self.dtype, self.attention = dtype, attention
    init = nnx.initializers.normal(stddev=0.02)
    d, ffn = d_model, ffn_mult * d_model
    self.attn_norm = nnx.Param(jnp.ones((d,), param_dtype))
    self.w_q = nnx.Param(init(rngs.params(), (d, q_heads * head_dim), param_dtype))
    self.w_kv = nnx.Param(init(rngs.params(), (d, 2 * kv_heads * head_dim), param_dtype))
    self.w_o = nnx.Param(init(rngs.params(), (q_heads * head_dim, d), param_dtype))
    self.ffn_norm = nnx.Param(jnp.ones((d,), param_dtype))
    self.w_gate_up = nnx.Param(init(rngs.params(), (d, 2, ffn), param_dtype))
    self.w_down = nnx.Param(init(rngs.params(), (ffn, d), param_dtype))

  def __call__(self, x_BxTxD):
    dt = self.dtype
    B, T, _ = x_BxTxD.shape
    x_BxTxD = x_BxTxD.astype(dt)
    a_BxTxD = rms_norm(x_BxTxD, self.attn_norm[...])
    q = (a_BxTxD @ self.w_q[...].astype(dt)).reshape(B, T, self.q_heads, self.head_dim)
    kv = (a_BxTxD @ self.w_kv[...].astype(dt)).reshape(B, T, 2, self.kv_heads, self.head_dim)
    o_BxTxHqxDh = jax.nn.dot_product_attention(
        q, kv[:, :, 0], kv[:, :, 1], is_causal=True, implementation=self.attention)
    u_BxTxD = x_BxTxD + o_BxTxHqxDh.reshape(B, T, -1) @ self.w_o[...].astype(dt)
    f_BxTxD = rms_norm(u_BxTxD, self.ffn_norm[...])
    gate_up = jnp.einsum("btd,dkf->btkf", f_BxTxD, self.w_gate_up[...].astype(dt))
    hidden_BxTxF = jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1]
    return u_BxTxD + hidden_BxTxF @ self.w_down[...].astype(dt)
