"""Context parallelism: time split over the `seq` mesh axis, halos by `ppermute`.

A position needs the codes of the n-1 previous positions to address its
n-gram, and in training their logits too (the surrogate's P(c|z) and its
gradient land on those positions); the short conv reads (W-1)·dilation
previous inputs. Each shard therefore prepends the last `halo` steps of its
left neighbour's block, computes on [halo + T/seq] steps and drops the halo.

The first shard receives no neighbour: its halo is marked as padding (`valid`
False), so a window that would reach before the sequence is invalid exactly as
in the unsharded layer, and the conv's halo holds zeros, its left zero padding.
Gradients need no extra code: the transpose of `ppermute` sends the halo's
cotangents (surrogate contributions of windows that straddle two shards) back
to the left neighbour, where they add into its own positions.

Only one neighbour is asked, so each shard must hold at least `halo` steps
(checked by `check_layout`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lngram_jax.conv import short_conv


def left_halo(x_BxTx, size: int, *, axis_name: str, fill=0):
  """[B, size, ...]: the last `size` steps of the left neighbour's block.

  The first shard along `axis_name` gets `fill`.
  """
  if size > x_BxTx.shape[1]:
    raise ValueError(
        f"left_halo: halo of {size} steps from a block of {x_BxTx.shape[1]} steps.")
  shards = jax.lax.axis_size(axis_name)
  tail = x_BxTx[:, x_BxTx.shape[1] - size:]
  received = jax.lax.ppermute(tail, axis_name, perm=[(i, i + 1) for i in range(shards - 1)])
  first = jax.lax.axis_index(axis_name) == 0
  return jnp.where(first, jnp.full_like(received, fill), received)


def extend_left(x_BxTx, size: int, *, axis_name: str, fill=0):
  """[B, size + T, ...]: `x` with its left halo prepended (no-op for size 0)."""
  if size == 0:
    return x_BxTx
  halo = left_halo(x_BxTx, size, axis_name=axis_name, fill=fill)
  return jnp.concatenate([halo, x_BxTx], axis=1)


def extend_tokens(logits_BxTxRxM, *, halo: int, axis_name: str, segment_ids=None,
                  valid=None):
  """Router logits, segment ids and token mask with `halo` previous steps.

  Returns (logits, segment_ids or None, valid), each [B, halo + T, ...]. `valid`
  is always returned: it is what makes the first shard's halo padding.
  """
  # ones_like keeps the block's varying-axes type, which ppermute needs.
  valid_BxT = jnp.ones_like(logits_BxTxRxM[:, :, 0, 0], dtype=bool)
  if valid is not None:
    valid_BxT = valid_BxT & valid.astype(bool)
  logits_ext = extend_left(logits_BxTxRxM, halo, axis_name=axis_name)
  valid_ext = extend_left(valid_BxT, halo, axis_name=axis_name, fill=False)
  segment_ext = None
  if segment_ids is not None:
    segment_ext = extend_left(segment_ids, halo, axis_name=axis_name, fill=-1)
  return logits_ext, segment_ext, valid_ext


def short_conv_with_halo(x_BxTxD, kernel_WxD, *, dilation: int, axis_name: str,
                         segment_ids=None):
  """`short_conv` of a time block, reading (W-1)·dilation steps of the left shard.

  The conv piece of the sharded layer's `core.forward`.
  """
  halo = (kernel_WxD.shape[0] - 1) * dilation
  x_ext = extend_left(x_BxTxD, halo, axis_name=axis_name)
  segment_ext = None
  if segment_ids is not None:
    segment_ext = extend_left(segment_ids, halo, axis_name=axis_name, fill=-1)
  y_ext = short_conv(x_ext, kernel_WxD, dilation=dilation, segment_ids=segment_ext)
  return y_ext[:, halo:]
