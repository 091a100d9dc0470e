"""The contract of causal attention over packed segments, in XLA.

    o = attention_reference(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids_BxT, valid_BxT)

Query t of row b attends to key s of that row iff s <= t,
segment_ids[b, s] == segment_ids[b, t] and key s is valid (either may be None:
one segment, every token valid). Query head h reads KV head h // G (G = Hq / Hkv).
Scores q·k / √Dh and the softmax in float32 (float64 for float64 inputs); the
output in q's dtype. This is the decoder's mask (`experiments.models.attention.
causal_mask`) exactly, padding queries included.

The kernels take one int array: `segments_with_padding` gives padding tokens
segment -1, so the equality alone keeps every real query off them. Outputs at
real tokens are the same; a padding query there reads the padding keys before
it, where the mask above lets it read its segment's valid keys. Padding outputs
are the caller's to ignore (they reach no real token and no loss).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def segments_with_padding(batch_time: tuple[int, int], segment_ids=None, valid=None):
  """int32 [B, T] segment ids in which padding (`valid` False) is segment -1: the mask
  "same segment and key valid" as one equality (real segment ids are >= 0)."""
  seg_BxT = (jnp.zeros(batch_time, jnp.int32) if segment_ids is None
             else jnp.asarray(segment_ids, jnp.int32))
  if valid is not None:
    seg_BxT = jnp.where(jnp.asarray(valid).astype(bool), seg_BxT, -1)
  return seg_BxT


def attention_reference(q_BxTxHqxDh, k_BxTxHkvxDh, v_BxTxHkvxDh, segment_ids_BxT=None,
                        valid_BxT=None):
  """Causal grouped-query attention within segments (module docstring): [B, T, Hq, Dh]."""
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  Hkv = k_BxTxHkvxDh.shape[2]
  acc = jnp.promote_types(q_BxTxHqxDh.dtype, jnp.float32)
  q_BxTxHkvxGxDh = q_BxTxHqxDh.reshape(B, T, Hkv, Hq // Hkv, Dh)
  s_BxHkvxGxTxT = jnp.einsum("btkgh,bskh->bkgts", q_BxTxHkvxGxDh, k_BxTxHkvxDh,
                             preferred_element_type=acc) / math.sqrt(Dh)
  t_T = jnp.arange(T)
  mask_BxTxT = jnp.broadcast_to((t_T[:, None] >= t_T[None, :])[None], (B, T, T))
  if segment_ids_BxT is not None:
    mask_BxTxT = mask_BxTxT & (segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :])
  if valid_BxT is not None:
    mask_BxTxT = mask_BxTxT & jnp.asarray(valid_BxT).astype(bool)[:, None, :]
  s_BxHkvxGxTxT = jnp.where(mask_BxTxT[:, None, None], s_BxHkvxGxTxT, jnp.finfo(acc).min)
  p_BxHkvxGxTxT = jax.nn.softmax(s_BxHkvxGxTxT, axis=-1)
  o_BxTxHkvxGxDh = jnp.einsum("bkgts,bskh->btkgh", p_BxHkvxGxTxT.astype(v_BxTxHkvxDh.dtype),
                              v_BxTxHkvxDh, preferred_element_type=acc)
  return o_BxTxHkvxGxDh.reshape(B, T, Hq, Dh).astype(q_BxTxHqxDh.dtype)
