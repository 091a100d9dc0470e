"""Grouped-query causal self-attention with RoPE, packed segments and a KV cache.

One `attend` serves all three paths, so they differ only in their masks:
  parallel  keys = the sequence itself; mask = causal & same segment & key valid
            (`kernels.attention.causal_attention`: a flash kernel where the step is
            compiled for TPU or GPU, O(T) memory; this einsum form on CPU, with
            `attention="xla"`, and when the probabilities are asked for);
  prefill   the parallel path, also returning K, V to fill the cache;
  decode    one query per row against the cache; mask = cache slots holding a
            real token of the row's current segment (the new slot included).
`decode_rows` is decode for a cache the caller cannot update in place (a
scanned layer stack): `attend_cache_and_new` reads the cache's slots and the
new key beside it, and the caller writes the returned rows.
Shape legend in experiments/models/__init__.py.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from experiments.models.layers import RMSNorm, cast, mrope_axes, normal, rope, rope_inv_freq
from experiments.models.layout import BATCH_AXES
from kernels.attention.api import causal_attention


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


def attend(q_BxTxHqxDh, k_BxSxHkvxDh, v_BxSxHkvxDh, mask_BxTxS, *, return_probs=False):
  """Softmax attention of Hq query heads over Hkv KV heads (head h reads h // G).

  Scores and softmax in float32. Masked scores take finfo.min rather than
  -inf, so a fully masked row (a padding query) stays finite. With
  `return_probs` also the probabilities p_BxHqxTxS (analyses).
  """
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  Hkv = k_BxSxHkvxDh.shape[2]
  q_BxTxHkvxGxDh = q_BxTxHqxDh.reshape(B, T, Hkv, Hq // Hkv, Dh)
  s_BxHkvxGxTxS = jnp.einsum("btkgh,bskh->bkgts", q_BxTxHkvxGxDh, k_BxSxHkvxDh,
                             preferred_element_type=jnp.float32) / math.sqrt(Dh)
  s_BxHkvxGxTxS = jnp.where(mask_BxTxS[:, None, None], s_BxHkvxGxTxS,
                            jnp.finfo(jnp.float32).min)
  p_BxHkvxGxTxS = jax.nn.softmax(s_BxHkvxGxTxS, axis=-1)
  o_BxTxHkvxGxDh = jnp.einsum("bkgts,bskh->btkgh", p_BxHkvxGxTxS.astype(v_BxSxHkvxDh.dtype),
                              v_BxSxHkvxDh, preferred_element_type=jnp.float32)
  o_BxTxHqxDh = o_BxTxHkvxGxDh.reshape(B, T, Hq, Dh).astype(q_BxTxHqxDh.dtype)
  if return_probs:
    # Query head h = k·G + g, the order of the reshape above.
    return o_BxTxHqxDh, p_BxHkvxGxTxS.reshape(B, Hq, T, -1)
  return o_BxTxHqxDh


def attend_cache_and_new(q_Bx1xHqxDh, k_BxSxHkvxDh, v_BxSxHkvxDh, k_Bx1xHkvxDh,
                         v_Bx1xHkvxDh, key_ok_BxS):
  """`attend` of one query per row over the cache slots `key_ok_BxS` marks and the
  row's own new key and value, which are not in the cache: one softmax over both
  score sets. The same maths as writing the new key into its slot and attending
  over the cache with that slot marked, without the cache write.
  """
  B, _, Hq, Dh = q_Bx1xHqxDh.shape
  Hkv = k_BxSxHkvxDh.shape[2]
  S = k_BxSxHkvxDh.shape[1]
  q_Bx1xHkvxGxDh = q_Bx1xHqxDh.reshape(B, 1, Hkv, Hq // Hkv, Dh)

  def scores(k_BxSxHkvxDh):
    return jnp.einsum("btkgh,bskh->bkgts", q_Bx1xHkvxGxDh, k_BxSxHkvxDh,
                      preferred_element_type=jnp.float32) / math.sqrt(Dh)

  s_BxHkvxGx1xS = jnp.where(key_ok_BxS[:, None, None, None, :], scores(k_BxSxHkvxDh),
                            jnp.finfo(jnp.float32).min)
  s_BxHkvxGx1xS1 = jnp.concatenate([s_BxHkvxGx1xS, scores(k_Bx1xHkvxDh)], axis=-1)
  p_BxHkvxGx1xS1 = jax.nn.softmax(s_BxHkvxGx1xS1, axis=-1).astype(v_BxSxHkvxDh.dtype)
  read = functools.partial(jnp.einsum, "bkgts,bskh->btkgh", preferred_element_type=jnp.float32)
  o_Bx1xHkvxGxDh = (read(p_BxHkvxGx1xS1[..., :S], v_BxSxHkvxDh)
                    + read(p_BxHkvxGx1xS1[..., S:], v_Bx1xHkvxDh))
  return o_Bx1xHkvxGxDh.reshape(B, 1, Hq, Dh).astype(q_Bx1xHqxDh.dtype)


class Attention(nnx.Module):
  """GQA self-attention: w_q [D, Hq, Dh], w_kv [D, 2, Hkv, Dh], w_o [Hq, Dh, D].

  Options the pretrained families need (all off by default; DESIGN.md §11):
  `qkv_bias` adds b_q [Hq, Dh] and b_kv [2, Hkv, Dh] (Qwen2); `qk_norm` applies
  an RMSNorm over Dh, one scale shared by the heads, to q and k before RoPE
  (Qwen3); `rope_scaling` rescales the RoPE frequencies (`rope_inv_freq`);
  `mrope_section` makes positions [3, B, T] (t, h, w) rotate their own
  frequencies (Qwen3-VL, `layers.mrope_axes`).
  """

  def __init__(self, *, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int,
               rope_theta: float, dtype, param_dtype, init_std: float, out_std: float,
               rngs: nnx.Rngs, qkv_bias: bool = False, qk_norm: bool = False,
               rope_scaling: tuple = (), norm_eps: float = 1e-6,
               norm_scale_in_dtype: bool = False, mrope_section: tuple = (),
               mrope_interleaved: bool = False, implementation: str = "auto"):
    self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
    self.implementation = implementation   # LMConfig.attention: "auto" or "xla"
    # Multimodal RoPE (Qwen3-VL): which of the t, h, w positions each frequency reads.
    self.mrope_axes = (tuple(int(a) for a in mrope_axes(head_dim, mrope_section,
                                                         mrope_interleaved))
                       if mrope_section else None)
    self.rope_theta = rope_theta
    # A tuple of (name, value) pairs: static, hashable, rebuilt into a dict.
    self.rope_scaling = tuple(rope_scaling)
    self.dtype = dtype
    self.w_q = nnx.Param(
        normal(init_std)(rngs.params(), (d_model, n_heads, head_dim), param_dtype))
    self.w_kv = nnx.Param(
        normal(init_std)(rngs.params(), (d_model, 2, n_kv_heads, head_dim), param_dtype))
    self.w_o = nnx.Param(
        normal(out_std)(rngs.params(), (n_heads, head_dim, d_model), param_dtype))
    # Zero biases and unit norm scales draw no random numbers, so the weights
    # above stay those of the same seed without the options.
    self.b_q = nnx.Param(jnp.zeros((n_heads, head_dim), param_dtype)) if qkv_bias else None
    self.b_kv = (nnx.Param(jnp.zeros((2, n_kv_heads, head_dim), param_dtype)) if qkv_bias
                 else None)
    norm = dict(eps=norm_eps, param_dtype=param_dtype, scale_in_dtype=norm_scale_in_dtype)
    self.q_norm = RMSNorm(head_dim, **norm) if qk_norm else None
    self.k_norm = RMSNorm(head_dim, **norm) if qk_norm else None

  def qkv(self, x_BxTxD, positions_BxT):
    """Rotated queries [B, T, Hq, Dh] and keys, plus values [B, T, Hkv, Dh]."""
    x_BxTxD = x_BxTxD.astype(self.dtype)
    q_BxTxHqxDh = jnp.einsum("btd,dhe->bthe", x_BxTxD, cast(self.w_q[...], self.dtype))
    kv_BxTx2xHkvxDh = jnp.einsum("btd,dckh->btckh", x_BxTxD,
                                 cast(self.w_kv[...], self.dtype))
    if self.b_q is not None:
      q_BxTxHqxDh = q_BxTxHqxDh + self.b_q[...].astype(self.dtype)
      kv_BxTx2xHkvxDh = kv_BxTx2xHkvxDh + self.b_kv[...].astype(self.dtype)
    k_BxTxHkvxDh, v_BxTxHkvxDh = kv_BxTx2xHkvxDh[:, :, 0], kv_BxTx2xHkvxDh[:, :, 1]
    if self.q_norm is not None:
      q_BxTxHqxDh = self.q_norm(q_BxTxHqxDh).astype(self.dtype)
      k_BxTxHkvxDh = self.k_norm(k_BxTxHkvxDh).astype(self.dtype)
    inv_freq_F = None
    if self.rope_scaling:
      inv_freq_F = rope_inv_freq(self.head_dim, self.rope_theta, dict(self.rope_scaling))
    if positions_BxT.ndim == 3 and self.mrope_axes is None:
      raise ValueError("Attention: positions [3, B, T] need an mrope_section.")
    q_BxTxHqxDh = rope(q_BxTxHqxDh, positions_BxT, theta=self.rope_theta,
                       inv_freq_F=inv_freq_F, axes_F=self.mrope_axes)
    k_BxTxHkvxDh = rope(k_BxTxHkvxDh, positions_BxT, theta=self.rope_theta,
                       inv_freq_F=inv_freq_F, axes_F=self.mrope_axes)
    return q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh

  def project_out(self, o_BxTxHqxDh):
    return jnp.einsum("bthe,hed->btd", o_BxTxHqxDh, cast(self.w_o[...], self.dtype))

  def __call__(self, x_BxTxD, positions_BxT, *, segment_ids=None, valid=None,
               return_kv=False, return_probs=False, mesh=None):
    """y [B, T, D]; with `return_kv` also (K, V) [B, T, Hkv, Dh] (prefill) and with
    `return_probs` also p_BxHqxTxT (analyses): (y, extras) with extras a dict. `mesh`:
    the training mesh, over whose batch axes a flash kernel runs per shard."""
    q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh = self.qkv(x_BxTxD, positions_BxT)
    p_BxHqxTxS = None
    if return_probs:   # the analyses read the probabilities: the einsum form
      mask_BxTxS = causal_mask(x_BxTxD.shape[:2], segment_ids=segment_ids, valid=valid)
      o_BxTxHqxDh, p_BxHqxTxS = attend(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, mask_BxTxS,
                                       return_probs=True)
    else:
      o_BxTxHqxDh = causal_attention(
          q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids, valid, mesh=mesh,
          batch_axes=BATCH_AXES, implementation="xla" if self.implementation == "xla" else None)
    y_BxTxD = self.project_out(o_BxTxHqxDh)
    if not (return_kv or return_probs):
      return y_BxTxD
    extras = {}
    if return_kv:
      extras["k"], extras["v"] = k_BxTxHkvxDh, v_BxTxHkvxDh
    if return_probs:
      extras["probs"] = p_BxHqxTxS
    return y_BxTxD, extras

  def decode(self, x_Bx1xD, positions_Bx1, k_cache_BxSxHkvxDh, v_cache_BxSxHkvxDh, *,
             index_B, key_ok_BxS):
    """One step: write this token's K, V at slot index_B, attend over the cache.

    `key_ok_BxS` must already mark the new slot. Returns y [B, 1, D] and the
    updated caches.
    """
    q_Bx1xHqxDh, k_Bx1xHkvxDh, v_Bx1xHkvxDh = self.qkv(x_Bx1xD, positions_Bx1)
    rows_B = jnp.arange(x_Bx1xD.shape[0])
    k_cache_BxSxHkvxDh = k_cache_BxSxHkvxDh.at[rows_B, index_B].set(
        k_Bx1xHkvxDh[:, 0].astype(k_cache_BxSxHkvxDh.dtype))
    v_cache_BxSxHkvxDh = v_cache_BxSxHkvxDh.at[rows_B, index_B].set(
        v_Bx1xHkvxDh[:, 0].astype(v_cache_BxSxHkvxDh.dtype))
    o_Bx1xHqxDh = attend(q_Bx1xHqxDh, k_cache_BxSxHkvxDh, v_cache_BxSxHkvxDh,
                         key_ok_BxS[:, None, :])
    return self.project_out(o_Bx1xHqxDh), k_cache_BxSxHkvxDh, v_cache_BxSxHkvxDh

  def decode_rows(self, x_Bx1xD, positions_Bx1, k_cache_BxSxHkvxDh, v_cache_BxSxHkvxDh, *,
                  key_ok_BxS):
    """`decode` that leaves the cache as it is: attends over the slots `key_ok_BxS`
    marks (not the new one) and this token's own K, V. Returns y [B, 1, D] and the
    token's K, V rows [B, Hkv, Dh] in the cache dtype, for the caller to write.
    """
    q_Bx1xHqxDh, k_Bx1xHkvxDh, v_Bx1xHkvxDh = self.qkv(x_Bx1xD, positions_Bx1)
    # Rounded to the cache dtype first, as `decode` reads them back from the cache.
    k_Bx1xHkvxDh = k_Bx1xHkvxDh.astype(k_cache_BxSxHkvxDh.dtype)
    v_Bx1xHkvxDh = v_Bx1xHkvxDh.astype(v_cache_BxSxHkvxDh.dtype)
    o_Bx1xHqxDh = attend_cache_and_new(q_Bx1xHqxDh, k_cache_BxSxHkvxDh, v_cache_BxSxHkvxDh,
                                       k_Bx1xHkvxDh, v_Bx1xHkvxDh, key_ok_BxS)
    return self.project_out(o_Bx1xHqxDh), k_Bx1xHkvxDh[:, 0], v_Bx1xHkvxDh[:, 0]
