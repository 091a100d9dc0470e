"""Grouped-query causal self-attention with RoPE, packed segments and a KV cache.

One `attend` serves all three paths, so they differ only in their masks:
  parallel  keys = the sequence itself; mask = causal & same segment & key valid;
  prefill   the parallel path, also returning K, V to fill the cache;
  decode    one query per row against the cache; mask = cache slots holding a
            real token of the row's current segment (the new slot included).
Shape legend in experiments/models/layers.py.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.layers import normal, rope


def causal_mask(batch_time: tuple[int, int], *, segment_ids=None, valid=None):
  """mask_BxTxS (S = T): query t sees key s <= t of its segment, if s is valid."""
  B, T = batch_time
  t = jnp.arange(T)
  mask_BxTxS = jnp.broadcast_to(t[:, None] >= t[None, :], (B, T, T))
  if segment_ids is not None:
    mask_BxTxS = mask_BxTxS & (segment_ids[:, :, None] == segment_ids[:, None, :])
  if valid is not None:
    mask_BxTxS = mask_BxTxS & valid.astype(bool)[:, None, :]
  return mask_BxTxS


def attend(q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh, mask_BxTxS):
  """Softmax attention of H query heads over K KV heads (head h reads h // G).

  Scores and softmax in float32. Masked scores take finfo.min rather than
  -inf, so a fully masked row (a padding query) stays finite.
  """
  B, T, H, Dh = q_BxTxHxDh.shape
  K = k_BxSxKxDh.shape[2]
  q_BxTxKxGxDh = q_BxTxHxDh.reshape(B, T, K, H // K, Dh)
  s_BxKxGxTxS = jnp.einsum("btkgh,bskh->bkgts", q_BxTxKxGxDh, k_BxSxKxDh,
                           preferred_element_type=jnp.float32) / math.sqrt(Dh)
  s_BxKxGxTxS = jnp.where(mask_BxTxS[:, None, None], s_BxKxGxTxS,
                          jnp.finfo(jnp.float32).min)
  p_BxKxGxTxS = jax.nn.softmax(s_BxKxGxTxS, axis=-1)
  o_BxTxKxGxDh = jnp.einsum("bkgts,bskh->btkgh", p_BxKxGxTxS.astype(v_BxSxKxDh.dtype),
                            v_BxSxKxDh, preferred_element_type=jnp.float32)
  return o_BxTxKxGxDh.reshape(B, T, H, Dh).astype(q_BxTxHxDh.dtype)


class Attention(nnx.Module):
  """GQA self-attention: w_q [D, H, Dh], w_kv [D, 2, K, Dh], w_o [H, Dh, D]."""

  def __init__(self, *, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int,
               rope_theta: float, dtype, param_dtype, init_std: float, out_std: float,
               rngs: nnx.Rngs):
    self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
    self.rope_theta = rope_theta
    self.dtype = dtype
    self.w_q = nnx.Param(
        normal(init_std)(rngs.params(), (d_model, n_heads, head_dim), param_dtype))
    self.w_kv = nnx.Param(
        normal(init_std)(rngs.params(), (d_model, 2, n_kv_heads, head_dim), param_dtype))
    self.w_o = nnx.Param(
        normal(out_std)(rngs.params(), (n_heads, head_dim, d_model), param_dtype))

  def qkv(self, x_BxTxD, positions_BxT):
    """Rotated queries [B, T, H, Dh] and keys, plus values [B, T, K, Dh]."""
    x_BxTxD = x_BxTxD.astype(self.dtype)
    q_BxTxHxDh = jnp.einsum("btd,dhe->bthe", x_BxTxD, self.w_q[...].astype(self.dtype))
    kv_BxTx2xKxDh = jnp.einsum("btd,dckh->btckh", x_BxTxD,
                               self.w_kv[...].astype(self.dtype))
    k_BxTxKxDh, v_BxTxKxDh = kv_BxTx2xKxDh[:, :, 0], kv_BxTx2xKxDh[:, :, 1]
    q_BxTxHxDh = rope(q_BxTxHxDh, positions_BxT, theta=self.rope_theta)
    k_BxTxKxDh = rope(k_BxTxKxDh, positions_BxT, theta=self.rope_theta)
    return q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh

  def project_out(self, o_BxTxHxDh):
    return jnp.einsum("bthe,hed->btd", o_BxTxHxDh, self.w_o[...].astype(self.dtype))

  def __call__(self, x_BxTxD, positions_BxT, *, segment_ids=None, valid=None,
               return_kv=False):
    q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh = self.qkv(x_BxTxD, positions_BxT)
    mask_BxTxS = causal_mask(x_BxTxD.shape[:2], segment_ids=segment_ids, valid=valid)
    y_BxTxD = self.project_out(attend(q_BxTxHxDh, k_BxTxKxDh, v_BxTxKxDh, mask_BxTxS))
    if return_kv:
      return y_BxTxD, (k_BxTxKxDh, v_BxTxKxDh)
    return y_BxTxD

  def decode(self, x_Bx1xD, positions_Bx1, k_cache_BxSxKxDh, v_cache_BxSxKxDh, *,
             index_B, key_ok_BxS):
    """One step: write this token's K, V at slot index_B, attend over the cache.

    `key_ok_BxS` must already mark the new slot. Returns y [B, 1, D] and the
    updated caches.
    """
    q_Bx1xHxDh, k_Bx1xKxDh, v_Bx1xKxDh = self.qkv(x_Bx1xD, positions_Bx1)
    rows_B = jnp.arange(x_Bx1xD.shape[0])
    k_cache_BxSxKxDh = k_cache_BxSxKxDh.at[rows_B, index_B].set(
        k_Bx1xKxDh[:, 0].astype(k_cache_BxSxKxDh.dtype))
    v_cache_BxSxKxDh = v_cache_BxSxKxDh.at[rows_B, index_B].set(
        v_Bx1xKxDh[:, 0].astype(v_cache_BxSxKxDh.dtype))
    o_Bx1xHxDh = attend(q_Bx1xHxDh, k_cache_BxSxKxDh, v_cache_BxSxKxDh,
                        key_ok_BxS[:, None, :])
    return self.project_out(o_Bx1xHxDh), k_cache_BxSxKxDh, v_cache_BxSxKxDh
