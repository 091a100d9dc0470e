"""Small building blocks of the decoder LM: RMSNorm, rotary embeddings, SwiGLU.

Shape legend: experiments/models/__init__.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lngram_jax.norms import rms_norm


def normal(std: float):
  return nnx.initializers.normal(stddev=std)


class RMSNorm(nnx.Module):
  """RMSNorm with a learned scale; statistics in float32 (lngram_jax.rms_norm)."""

  def __init__(self, dim: int, *, eps: float, param_dtype):
    self.eps = eps
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))

  def __call__(self, x_BxTxD):
    return rms_norm(x_BxTxD, self.scale[...], eps=self.eps)


def segment_positions(segment_ids_BxT) -> jnp.ndarray:
  """Positions that restart at 0 at every segment start: int32 [B, T].

  A segment starts where the id differs from the previous token's id, so a
  packed row [a a a b b c] gets positions [0 1 2 0 1 0].
  """
  B, T = segment_ids_BxT.shape
  t_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  prev_BxT = jnp.pad(segment_ids_BxT[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
  starts_BxT = jnp.where(segment_ids_BxT != prev_BxT, t_BxT, 0)
  # The latest start at or before t is a running max of the start indices.
  return t_BxT - jax.lax.cummax(starts_BxT, axis=1)


def rope(x_BxTxHxDh, positions_BxT, *, theta: float):
  """Rotary position embedding (rotate-half form), computed in float32.

  Channel i < Dh/2 pairs with channel i + Dh/2 and turns by the angle
  position · theta^(-2i/Dh).
  """
  Dh = x_BxTxHxDh.shape[-1]
  half = Dh // 2
  inv_freq_F = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / Dh)
  angle_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_F
  sin_BxTx1xF = jnp.sin(angle_BxTxF)[:, :, None, :]
  cos_BxTx1xF = jnp.cos(angle_BxTxF)[:, :, None, :]
  x = x_BxTxHxDh.astype(jnp.float32)
  x1, x2 = x[..., :half], x[..., half:]
  out = jnp.concatenate([x1 * cos_BxTx1xF - x2 * sin_BxTx1xF,
                         x2 * cos_BxTx1xF + x1 * sin_BxTx1xF], axis=-1)
  return out.astype(x_BxTxHxDh.dtype)


class SwiGLU(nnx.Module):
  """y = (SiLU(x W_gate) ⊙ x W_up) W_down."""

  def __init__(self, d_model: int, ffn_dim: int, *, dtype, param_dtype, init_std: float,
               out_std: float, rngs: nnx.Rngs):
    self.dtype = dtype
    self.w_gate = nnx.Param(normal(init_std)(rngs.params(), (d_model, ffn_dim), param_dtype))
    self.w_up = nnx.Param(normal(init_std)(rngs.params(), (d_model, ffn_dim), param_dtype))
    self.w_down = nnx.Param(normal(out_std)(rngs.params(), (ffn_dim, d_model), param_dtype))

  def __call__(self, x_BxTxD):
    x_BxTxD = x_BxTxD.astype(self.dtype)
    gate_BxTxF = jnp.einsum("btd,df->btf", x_BxTxD, self.w_gate[...].astype(self.dtype))
    up_BxTxF = jnp.einsum("btd,df->btf", x_BxTxD, self.w_up[...].astype(self.dtype))
    return jnp.einsum("btf,fd->btd", jax.nn.silu(gate_BxTxF) * up_BxTxF,
                      self.w_down[...].astype(self.dtype))


class Embedding(nnx.Module):
  """Token embedding; `attend` is the tied output projection (float32 logits)."""

  def __init__(self, vocab_size: int, d_model: int, *, dtype, param_dtype,
               init_std: float, rngs: nnx.Rngs):
    self.dtype = dtype
    self.table = nnx.Param(normal(init_std)(rngs.params(), (vocab_size, d_model), param_dtype))

  def __call__(self, tokens_BxT):
    return jnp.take(self.table[...], tokens_BxT, axis=0).astype(self.dtype)

  def attend(self, x_BxTxD):
    return jnp.einsum("btd,vd->btv", x_BxTxD, self.table[...].astype(self.dtype),
                      preferred_element_type=jnp.float32)
