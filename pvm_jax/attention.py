"""Cross-attention from text positions to the visual tokens only (paper §4, Thm 4.1).

For query head a (KV head κ(a) = a // G) at text position t:

    s_i = q_{t,a}·k_{i,κ(a)}/√Dh + bias_i,   bias_i = 0 (valid) or finfo.min (padding),
    β_i = exp(s_i) / Σ_{i'∈V} exp(s_i'),      o_{t,a} = Σ_i β_i v_{i,κ(a)}.

The partition function runs over the visual set V of one image, never over
the text history, so β depends on (q_t, V) alone: the length of the preceding
text does not appear (Theorem 4.1). A row whose image has no valid token
returns 0 (not NaN) and passes finite gradients. Statistics are float32, or
the input dtype when it is wider.

`visual_attention` is the grouped einsum form; `visual_attention_reference`
repeats the KV heads and loops over query heads with a plain masked softmax:
the slow, obviously-correct twin the tests compare against (values and grads).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from lngram_jax import checks


def _stat_dtype(dtype):
  return jnp.promote_types(dtype, jnp.float32)


def padding_bias(visual_valid_BxNv, dtype=jnp.float32):
  """The additive mask: 0 on valid visual tokens, finfo(dtype).min on padding."""
  return jnp.where(visual_valid_BxNv, 0.0, jnp.finfo(dtype).min).astype(dtype)


def _check(q_BxTxHqxDh, k_BxNvxHkvxDh, v_BxNvxHkvxDh, visual_valid_BxNv):
  checks.check_rank("q", q_BxTxHqxDh, 4, "[B, T, Hq, dh]")
  checks.check_rank("k", k_BxNvxHkvxDh, 4, "[B, Nv, Hkv, dh]")
  checks.check_rank("v", v_BxNvxHkvxDh, 4, "[B, Nv, Hkv, dh]")
  B, _, Hq, Dh = q_BxTxHqxDh.shape
  if k_BxNvxHkvxDh.shape != v_BxNvxHkvxDh.shape:
    raise ValueError(f"k {k_BxNvxHkvxDh.shape} and v {v_BxNvxHkvxDh.shape} differ.")
  Bk, Nv, Hkv, Dk = k_BxNvxHkvxDh.shape
  if Bk != B or Dk != Dh or Hq % Hkv:
    raise ValueError(
        f"q {q_BxTxHqxDh.shape} does not fit k {k_BxNvxHkvxDh.shape}: need the "
        "same batch and dh, and Hq a multiple of Hkv.")
  if visual_valid_BxNv is not None and tuple(visual_valid_BxNv.shape) != (B, Nv):
    raise ValueError(
        f"visual_valid must have shape {(B, Nv)} ([B, Nv]); got "
        f"{tuple(visual_valid_BxNv.shape)}.")


def visual_attention(q_BxTxHqxDh, k_BxNvxHkvxDh, v_BxNvxHkvxDh, visual_valid_BxNv=None,
                     *, return_probs: bool = False):
  """Grouped-query cross-attention over the visual tokens of each example.

  Returns o_BxTxHqxDh in q's dtype and, with `return_probs`, the probabilities
  p_BxTxHqxNv, float32 or wider (rows of an image with no valid token are 0).
  """
  _check(q_BxTxHqxDh, k_BxNvxHkvxDh, v_BxNvxHkvxDh, visual_valid_BxNv)
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  Nv, Hkv = k_BxNvxHkvxDh.shape[1:3]
  G = Hq // Hkv
  acc = _stat_dtype(q_BxTxHqxDh.dtype)
  if visual_valid_BxNv is None:
    visual_valid_BxNv = jnp.ones((B, Nv), bool)
  visual_valid_BxNv = visual_valid_BxNv.astype(bool)
  q_BxTxHkvxGxDh = q_BxTxHqxDh.reshape(B, T, Hkv, G, Dh)
  s_BxHkvxGxTxNv = jnp.einsum("btkgd,bnkd->bkgtn", q_BxTxHkvxGxDh, k_BxNvxHkvxDh,
                            preferred_element_type=acc) / math.sqrt(Dh)
  bias_Bx1x1x1xNv = padding_bias(visual_valid_BxNv, acc)[:, None, None, None, :]
  s_BxHkvxGxTxNv = s_BxHkvxGxTxNv + bias_Bx1x1x1xNv
  p_BxHkvxGxTxNv = _masked_softmax(s_BxHkvxGxTxNv, visual_valid_BxNv[:, None, None, None, :])
  o_BxTxHkvxGxDh = jnp.einsum("bkgtn,bnkd->btkgd", p_BxHkvxGxTxNv, v_BxNvxHkvxDh.astype(acc),
                            preferred_element_type=acc)
  o_BxTxHqxDh = o_BxTxHkvxGxDh.reshape(B, T, Hq, Dh).astype(q_BxTxHqxDh.dtype)
  if not return_probs:
    return o_BxTxHqxDh
  p_BxTxHqxNv = jnp.transpose(p_BxHkvxGxTxNv, (0, 3, 1, 2, 4)).reshape(B, T, Hq, Nv)
  return o_BxTxHqxDh, p_BxTxHqxNv


def _masked_softmax(s_xNv, valid_xNv):
  """Softmax over the last axis; selecting on `valid` makes all-padding rows 0.

  With every token masked, s is finfo.min everywhere, so exp(s - max) is 1 for
  the padding: the select zeroes it (a select, not a product, so nothing a
  padded score holds can leak) and the guarded division keeps the row (and
  its gradient) at exactly 0.
  """
  m = jax.lax.stop_gradient(jnp.max(s_xNv, axis=-1, keepdims=True))
  e_xNv = jnp.where(valid_xNv.astype(bool), jnp.exp(s_xNv - m), 0).astype(s_xNv.dtype)
  denom = jnp.sum(e_xNv, axis=-1, keepdims=True)
  return e_xNv / jnp.where(denom > 0, denom, 1.0)


def visual_attention_reference(q_BxTxHqxDh, k_BxNvxHkvxDh, v_BxNvxHkvxDh,
                               visual_valid_BxNv=None):
  """Slow twin: KV heads repeated per query head, one head at a time, jnp.where mask."""
  _check(q_BxTxHqxDh, k_BxNvxHkvxDh, v_BxNvxHkvxDh, visual_valid_BxNv)
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  Nv, Hkv = k_BxNvxHkvxDh.shape[1:3]
  G = Hq // Hkv
  if visual_valid_BxNv is None:
    visual_valid_BxNv = jnp.ones((B, Nv), bool)
  acc = _stat_dtype(q_BxTxHqxDh.dtype)
  q = q_BxTxHqxDh.astype(acc)
  k = k_BxNvxHkvxDh.astype(acc)
  v = v_BxNvxHkvxDh.astype(acc)
  heads = []
  for a in range(Hq):
    kv = a // G
    s_BxTxNv = jnp.einsum("btd,bnd->btn", q[:, :, a], k[:, :, kv]) / math.sqrt(Dh)
    valid_Bx1xNv = visual_valid_BxNv.astype(bool)[:, None, :]
    s_BxTxNv = jnp.where(valid_Bx1xNv, s_BxTxNv, -jnp.inf)
    any_valid_Bx1x1 = jnp.any(valid_Bx1xNv, axis=-1, keepdims=True)
    # Softmax of an all--inf row is NaN; give such rows a dummy 0 logit first.
    p_BxTxNv = jax.nn.softmax(jnp.where(any_valid_Bx1x1, s_BxTxNv, 0.0), axis=-1)
    p_BxTxNv = jnp.where(any_valid_Bx1x1, p_BxTxNv, 0.0)
    heads.append(jnp.einsum("btn,bnd->btd", p_BxTxNv, v[:, :, kv]))
  return jnp.stack(heads, axis=2).astype(q_BxTxHqxDh.dtype)
