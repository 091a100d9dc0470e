"""The PVM branch as pure functions over a dict of arrays (DESIGN.md §3).

    x_lat = RMSNorm(x W_down_txt)                        [B, T, d']
    V_lat = V_img W_down_vis                             [B, Nv, d']  (not normalised)
    q = QKNorm(x_lat W_q),  k = QKNorm(V_lat W_k),  v = V_lat W_v     (per head, no RoPE)
    a = VisualAttn(q, k, v; padding mask) W_o            [B, T, d']
    h = a + SwiGLU(RMSNorm(a))                           latent FFN of width F
    y = λ · RMSNorm_affine-free(h W_up) · text_mask      [B, T, d]

The caller adds y beside the FFN: x + FFN(norm(x)) + y, with x the
post-attention residual. Everything that depends on the image alone (k, v)
lives in a `VisualCache`, computed once per image and reused at every decode
step. Parameter names (the keys below) are those of the NNX module.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lngram_jax.norms import rms_norm
from pvm_jax.attention import visual_attention
from pvm_jax.config import PVMConfig

PARAM_SHAPES_DOC = {
    "w_down_txt": "[d, d']",
    "lat_norm": "[d']",
    "w_down_vis": "[dv, d']",
    "w_q": "[d', Hq·dh]",
    "w_k": "[d', Hkv·dh]",
    "w_v": "[d', Hkv·dh]",
    "q_norm": "[dh]",
    "k_norm": "[dh]",
    "w_o": "[Hq·dh, d']",
    "ffn_norm": "[d']",
    "w_gate": "[d', F]",
    "w_in": "[d', F]",
    "w_ffn_out": "[F, d']",
    "w_up": "[d', d]",
    "gate": "[] (λ)",
}


class VisualCache(NamedTuple):
  """What the branch needs from one image; a pytree (jit/scan friendly).

  k: [B, Nv, Hkv, dh] projected and QK-normed keys; v: [B, Nv, Hkv, dh]
  projected values; valid: [B, Nv] bool, False on visual padding.
  """

  k: jax.Array
  v: jax.Array
  valid: jax.Array


def _w(params, name, config):
  return params[name].astype(config.dtype)


def visual_cache(params, config: PVMConfig, v_img_BxNvxDv, visual_valid_BxNv=None):
  """K/V of the visual tokens, computed once per image.

  Padding tokens are zeroed before the projection, so whatever the padding
  holds (even inf or NaN) cannot leak through the masked softmax.
  """
  c = config
  B, Nv, _ = v_img_BxNvxDv.shape
  if visual_valid_BxNv is None:
    visual_valid_BxNv = jnp.ones((B, Nv), bool)
  valid_BxNv = visual_valid_BxNv.astype(bool)
  v_img = jnp.where(valid_BxNv[:, :, None], v_img_BxNvxDv.astype(c.dtype), 0)
  v_lat_BxNvxL = v_img @ _w(params, "w_down_vis", c)
  k_BxNvxHkvxDh = (v_lat_BxNvxL @ _w(params, "w_k", c)).reshape(B, Nv, c.kv_heads, c.head_dim)
  k_BxNvxHkvxDh = rms_norm(k_BxNvxHkvxDh, params["k_norm"], eps=c.eps)
  v_BxNvxHkvxDh = (v_lat_BxNvxL @ _w(params, "w_v", c)).reshape(B, Nv, c.kv_heads, c.head_dim)
  return VisualCache(k=k_BxNvxHkvxDh, v=v_BxNvxHkvxDh, valid=valid_BxNv)


def swiglu(x_xL, w_gate_LxF, w_in_LxF, w_out_FxL):
  """SiLU(x W_gate) ⊙ (x W_in) W_out."""
  return (jax.nn.silu(x_xL @ w_gate_LxF) * (x_xL @ w_in_LxF)) @ w_out_FxL


def latent_retrieval(params, config: PVMConfig, x_BxTxD, cache: VisualCache, *,
                     return_probs: bool = False):
  """h = a + SwiGLU(RMSNorm(a)) in the latent space: [B, T, d'] (before W_up).

  With `return_probs` also the cross-attention probabilities p_BxTxHqxNv.
  """
  c = config
  B, T, _ = x_BxTxD.shape
  x_lat_BxTxL = rms_norm(x_BxTxD @ _w(params, "w_down_txt", c), params["lat_norm"], eps=c.eps)
  q_BxTxHqxDh = (x_lat_BxTxL @ _w(params, "w_q", c)).reshape(B, T, c.q_heads, c.head_dim)
  q_BxTxHqxDh = rms_norm(q_BxTxHqxDh, params["q_norm"], eps=c.eps)
  o_BxTxHqxDh, p_BxTxHqxNv = visual_attention(q_BxTxHqxDh, cache.k, cache.v, cache.valid,
                                            return_probs=True)
  a_BxTxL = o_BxTxHqxDh.reshape(B, T, c.latent_dim) @ _w(params, "w_o", c)
  ffn_in = rms_norm(a_BxTxL, params["ffn_norm"], eps=c.eps)
  h_BxTxL = a_BxTxL + swiglu(ffn_in, _w(params, "w_gate", c), _w(params, "w_in", c),
                             _w(params, "w_ffn_out", c))
  return (h_BxTxL, p_BxTxHqxNv) if return_probs else h_BxTxL


def pvm_forward(params, config: PVMConfig, x_BxTxD, cache: VisualCache, text_mask_BxT=None,
                *, return_probs: bool = False):
  """The branch output y: [B, T, d] in config.dtype; zero where text_mask is 0.

  Each position is computed from its own x and the cache only: no quantity
  mixes text positions, which is what makes the output independent of how
  much text precedes it.
  """
  c = config
  x_BxTxD = x_BxTxD.astype(c.dtype)
  if text_mask_BxT is not None:
    text_BxTx1 = text_mask_BxT.astype(bool)[:, :, None]
    # Image positions compute from zeros: y is +0.0 there anyway, and a NaN
    # they hold then reaches no gradient either (0·NaN = NaN in the backward).
    x_BxTxD = jnp.where(text_BxTx1, x_BxTxD, 0).astype(c.dtype)
  h_BxTxL, p_BxTxHqxNv = latent_retrieval(params, c, x_BxTxD, cache, return_probs=True)
  u_BxTxD = rms_norm(h_BxTxL @ _w(params, "w_up", c), eps=c.eps)
  y_BxTxD = params["gate"].astype(c.dtype) * u_BxTxD
  if text_mask_BxT is not None:
    # where, not a product: image tokens get exactly +0.0 whatever y holds there.
    y_BxTxD = jnp.where(text_BxTx1, y_BxTxD, 0)
  return (y_BxTxD, p_BxTxHqxNv) if return_probs else y_BxTxD
