"""Decode state of the whole LM: per-layer KV caches and Lngram decode states.

Rows decode independently: row b writes its next token at cache slot
`index_B[b]` with RoPE position `position_B[b]`, and attends to the slots
marked in `key_ok_BxS` (real tokens of the segment being continued). Prompts
are right-padded; padding slots stay unmarked and are overwritten by the
generated tokens in order, so rows of different prompt lengths share one
cache. Writes past the last slot are dropped by XLA: callers size the cache
(prompt + new tokens <= slots); `generate` checks this.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from lngram_jax.decode import (
    LngramDecodeState,
    init_decode_state,
    lngram_decode_step,
    prefill_decode_state,
)


@struct.dataclass
class LayerCache:
  """k, v: [B, S, K, Dh]; lngram: the layer's Lngram state or None."""

  k_BxSxKxDh: jnp.ndarray
  v_BxSxKxDh: jnp.ndarray
  lngram: LngramDecodeState | None


@struct.dataclass
class DecodeCache:
  """layers: one LayerCache per block; index_B: next slot; position_B: next
  RoPE position; key_ok_BxS: slots the next query may attend to."""

  layers: tuple[LayerCache, ...]
  index_B: jnp.ndarray
  position_B: jnp.ndarray
  key_ok_BxS: jnp.ndarray

  @property
  def max_len(self) -> int:
    return self.key_ok_BxS.shape[1]


def init_cache(model, batch: int, max_len: int) -> DecodeCache:
  c = model.config
  if max_len < 1:
    raise ValueError(f"init_cache: max_len={max_len} must be >= 1.")
  kv_shape = (batch, max_len, c.n_kv_heads, c.head_dim)
  layers = tuple(
      LayerCache(
          k_BxSxKxDh=jnp.zeros(kv_shape, c.dtype),
          v_BxSxKxDh=jnp.zeros(kv_shape, c.dtype),
          # The Lngram state keeps the branch's own dtype (it may differ from
          # the backbone's), as prefill does.
          lngram=None if block.lngram is None else init_decode_state(
              block.lngram.config, batch),
      )
      for block in model.blocks)
  return DecodeCache(
      layers=layers,
      index_B=jnp.zeros((batch,), jnp.int32),
      position_B=jnp.zeros((batch,), jnp.int32),
      key_ok_BxS=jnp.zeros((batch, max_len), bool),
  )


def prefill(model, tokens_BxT, *, lengths=None, segment_ids=None, cache_len=None):
  """Parallel forward over right-padded prompts that also fills the cache.

  Logits at t < lengths[b] equal `model(tokens, segment_ids=, valid=t < lengths)`.
  The cache continues each row after its last real token, in that token's
  segment, at the position after it.
  """
  from experiments.models.lm import default_positions

  c = model.config
  B, T = tokens_BxT.shape
  cache_len = c.max_len if cache_len is None else cache_len
  if T > cache_len:
    raise ValueError(f"prefill: prompt length T={T} exceeds cache_len={cache_len}.")
  lengths_B = (jnp.full((B,), T, jnp.int32) if lengths is None
               else jnp.asarray(lengths, jnp.int32))
  t_T = jnp.arange(T, dtype=jnp.int32)
  valid_BxT = t_T[None, :] < lengths_B[:, None]
  positions_BxT = default_positions((B, T), segment_ids, None)
  last_B = jnp.clip(lengths_B - 1, 0, T - 1)
  rows_B = jnp.arange(B)
  key_ok_BxT = valid_BxT
  if segment_ids is not None:
    key_ok_BxT = key_ok_BxT & (segment_ids == segment_ids[rows_B, last_B][:, None])

  x_BxTxD = model.embed(tokens_BxT)
  layers = []
  for block in model.blocks:
    lngram_state = None
    if block.lngram is not None:
      y_BxTxD, lngram_state = prefill_decode_state(
          block.lngram, x_BxTxD, lengths=lengths_B, segment_ids=segment_ids,
          valid=valid_BxT)
      x_BxTxD = x_BxTxD + y_BxTxD.astype(x_BxTxD.dtype)
    attn_BxTxD, (k_BxTxKxDh, v_BxTxKxDh) = block.attn(
        block.attn_norm(x_BxTxD), positions_BxT, segment_ids=segment_ids,
        valid=valid_BxT, return_kv=True)
    x_BxTxD = x_BxTxD + attn_BxTxD
    x_BxTxD = x_BxTxD + block.mlp(block.mlp_norm(x_BxTxD))
    pad = ((0, 0), (0, cache_len - T), (0, 0), (0, 0))
    layers.append(LayerCache(
        k_BxSxKxDh=jnp.pad(k_BxTxKxDh.astype(c.dtype), pad),
        v_BxSxKxDh=jnp.pad(v_BxTxKxDh.astype(c.dtype), pad),
        lngram=lngram_state))
  logits_BxTxV = model.logits(x_BxTxD)
  cache = DecodeCache(
      layers=tuple(layers),
      index_B=lengths_B,
      position_B=positions_BxT[rows_B, last_B] + 1,
      key_ok_BxS=jnp.pad(key_ok_BxT, ((0, 0), (0, cache_len - T))),
  )
  return logits_BxTxV, cache


def decode_step(model, tokens_Bx1, cache: DecodeCache):
  """One token per row through every block; (logits_BxV, next cache)."""
  B = tokens_Bx1.shape[0]
  if tokens_Bx1.shape != (B, 1):
    raise ValueError(f"decode_step: tokens must be [B, 1]; got {tuple(tokens_Bx1.shape)}.")
  rows_B = jnp.arange(B)
  key_ok_BxS = cache.key_ok_BxS.at[rows_B, cache.index_B].set(True)
  positions_Bx1 = cache.position_B[:, None]
  x_Bx1xD = model.embed(tokens_Bx1)
  layers = []
  for block, layer_cache in zip(model.blocks, cache.layers, strict=True):
    lngram_state = layer_cache.lngram
    if block.lngram is not None:
      y_Bx1xD, lngram_state = lngram_decode_step(block.lngram, x_Bx1xD, lngram_state)
      x_Bx1xD = x_Bx1xD + y_Bx1xD.astype(x_Bx1xD.dtype)
    attn_Bx1xD, k_cache, v_cache = block.attn.decode(
        block.attn_norm(x_Bx1xD), positions_Bx1, layer_cache.k_BxSxKxDh,
        layer_cache.v_BxSxKxDh, index_B=cache.index_B, key_ok_BxS=key_ok_BxS)
    x_Bx1xD = x_Bx1xD + attn_Bx1xD
    x_Bx1xD = x_Bx1xD + block.mlp(block.mlp_norm(x_Bx1xD))
    layers.append(LayerCache(k_BxSxKxDh=k_cache, v_BxSxKxDh=v_cache, lngram=lngram_state))
  logits_BxV = model.logits(x_Bx1xD)[:, 0]
  new_cache = DecodeCache(layers=tuple(layers), index_B=cache.index_B + 1,
                          position_B=cache.position_B + 1, key_ok_BxS=key_ok_BxS)
  return logits_BxV, new_cache
