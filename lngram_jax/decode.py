"""Token-by-token decoding of one Lngram v2 layer (DESIGN.md §2 "Decode").

The layer at step t needs, besides h_t:
  * the codes of the (max order - 1) previous positions per route, to address
    the n-grams ending at t, and whether each of them is a real token of t's
    segment (otherwise windows through it are invalid and read zero);
  * the (k-1)·dilation previous conv inputs RMSNorm_c(ṽ), already zeroed where
    they are padding or belong to an earlier segment (a conv tap never reads
    across a segment).
Decoding continues the segment of the last prompt token, so "same segment" is
settled once at prefill and a boolean per history slot is enough.

The step reuses the layer's public pieces and the functional core (router
logits, `ngram_rows` on the short window, `gather_rows`, query, readout, and
`short_conv` on the short window), so it reproduces the parallel forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.config import LngramConfig
from lngram_jax.conv import short_conv
from lngram_jax.lookup import gather_rows
from lngram_jax.norms import rms_norm


@struct.dataclass
class LngramDecodeState:
  """Per-layer decode state; H = max order - 1, C = (k-1)·dilation.

  codes_BxHxR: codes of the H previous positions, oldest first.
  codes_ok_BxH: whether that position is a real token of the current segment.
  conv_BxCxD: the C previous conv inputs, oldest first, zero where not ok.
  """

  codes_BxHxR: jnp.ndarray
  codes_ok_BxH: jnp.ndarray
  conv_BxCxD: jnp.ndarray


def init_decode_state(config: LngramConfig, batch: int, dtype=None) -> LngramDecodeState:
  """An empty history: every slot is 'before the sequence'."""
  c = config
  dtype = c.dtype if dtype is None else dtype
  H, C = c.max_order - 1, c.conv_context
  return LngramDecodeState(
      codes_BxHxR=jnp.zeros((batch, H, c.routes), jnp.int32),
      codes_ok_BxH=jnp.zeros((batch, H), bool),
      conv_BxCxD=jnp.zeros((batch, C, c.d_model), dtype),
  )


def _conv_input(layer, o_BxTxHqxDh):
  """ṽ = o W_O and the conv input RMSNorm_c(ṽ), as in LngramV2.output."""
  c = layer.config
  B, T = o_BxTxHqxDh.shape[:2]
  v_BxTxD = o_BxTxHqxDh.reshape(B, T, -1) @ layer.w_o[...].astype(c.dtype)
  return v_BxTxD, rms_norm(v_BxTxD, layer.conv_norm[...], eps=c.eps)


def _take_history(x_BxTx, lengths_B, size: int):
  """x at positions lengths-size .. lengths-1 (clipped) and their in-range mask."""
  T = x_BxTx.shape[1]
  pos_BxH = lengths_B[:, None] - size + jnp.arange(size, dtype=jnp.int32)
  idx_BxH = jnp.clip(pos_BxH, 0, T - 1)
  idx = idx_BxH.reshape(idx_BxH.shape + (1,) * (x_BxTx.ndim - 2))
  return jnp.take_along_axis(x_BxTx, idx, axis=1), pos_BxH >= 0


def prefill_decode_state(layer, h_BxTxD, *, lengths=None, segment_ids=None, valid=None):
  """The parallel forward over a (right-padded) prompt, and the decode state.

  Args:
    layer: an `LngramV2`.
    h_BxTxD: the layer's input over the prompt.
    lengths: int [B], the real tokens per row (default T, or the count of
      `valid`); decoding continues after position lengths-1 in its segment.
    segment_ids, valid: as for the layer's forward (`valid` defaults to
      t < lengths).

  Returns:
    y_BxTxD (equal to `layer(h, segment_ids=, valid=)`) and an
    `LngramDecodeState` for the step at position `lengths`.
  """
  c = layer.config
  B, T = h_BxTxD.shape[:2]
  t_T = jnp.arange(T, dtype=jnp.int32)
  if lengths is None:
    lengths = jnp.full((B,), T, jnp.int32) if valid is None else jnp.sum(valid, axis=1)
  lengths_B = jnp.asarray(lengths, jnp.int32)
  if valid is None:
    valid = t_T[None, :] < lengths_B[:, None]
  h_BxTxD = h_BxTxD.astype(c.dtype)
  logits_BxTxRxM = layer.router_logits(h_BxTxD)
  x_BxTxRxD = layer.route_tokens(logits_BxTxRxM, segment_ids=segment_ids, valid=valid)
  o_BxTxHqxDh, _ = layer.readout(layer.query(h_BxTxD), x_BxTxRxD)
  y_BxTxD = layer.output(o_BxTxHqxDh, segment_ids=segment_ids, valid=valid)

  # A history slot is usable if it is a real token of the last token's segment.
  ok_BxT = valid.astype(bool)
  if segment_ids is not None:
    last_seg_Bx1, _ = _take_history(segment_ids, lengths_B, 1)
    ok_BxT = ok_BxT & (segment_ids == last_seg_Bx1)
  H, C = c.max_order - 1, c.conv_context
  codes_BxHxR, in_range_BxH = _take_history(codes_from_logits(logits_BxTxRxM), lengths_B, H)
  ok_BxH, _ = _take_history(ok_BxT, lengths_B, H)
  _, conv_in_BxTxD = _conv_input(layer, o_BxTxHqxDh)
  conv_BxCxD, conv_in_range_BxC = _take_history(conv_in_BxTxD, lengths_B, C)
  conv_ok_BxC, _ = _take_history(ok_BxT, lengths_B, C)
  conv_ok_BxC = conv_ok_BxC & conv_in_range_BxC
  state = LngramDecodeState(
      codes_BxHxR=codes_BxHxR,
      codes_ok_BxH=ok_BxH & in_range_BxH,
      conv_BxCxD=conv_BxCxD * conv_ok_BxC[:, :, None].astype(conv_BxCxD.dtype),
  )
  return y_BxTxD, state


def lngram_decode_step(layer, h_Bx1xD, state: LngramDecodeState):
  """One position per row: (y_Bx1xD, new state). The token itself is valid.

  Each order n looks up the window (H-n+1 history slots + this token) with the
  same `ngram_rows` as the parallel path; the conv runs `short_conv` over the
  C stored inputs + this one and keeps the last output.
  """
  c = layer.config
  B = h_Bx1xD.shape[0]
  if h_Bx1xD.shape[1:] != (1, c.d_model):
    raise ValueError(f"h must have shape [B, 1, {c.d_model}]; got {tuple(h_Bx1xD.shape)}.")
  h_Bx1xD = h_Bx1xD.astype(c.dtype)
  logits_Bx1xRxM = layer.router_logits(h_Bx1xD)
  codes_Bx1xR = codes_from_logits(logits_Bx1xRxM)
  window_BxWxR = jnp.concatenate([state.codes_BxHxR, codes_Bx1xR], axis=1)
  window_ok_BxW = jnp.concatenate([state.codes_ok_BxH, jnp.ones((B, 1), bool)], axis=1)
  W = window_BxWxR.shape[1]
  mems = []
  for n, table in zip(c.orders, layer.tables, strict=True):
    # The window of order n is the last n slots; earlier ones are "before" it.
    rows_BxNxR, ok_BxN = ngram_rows(window_BxWxR[:, W - n:], order=n, bits=c.bits,
                                    valid=window_ok_BxW[:, W - n:])
    mems.append(gather_rows(table[...], rows_BxNxR[:, -1:], ok_BxN[:, -1:]))
  x_Bx1xRxD = jnp.concatenate(mems, axis=-1).astype(c.dtype)
  o_Bx1xHqxDh, _ = layer.readout(layer.query(h_Bx1xD), x_Bx1xRxD)
  v_Bx1xD, conv_in_Bx1xD = _conv_input(layer, o_Bx1xHqxDh)
  conv_window_Bx1pCxD = jnp.concatenate(
      [state.conv_BxCxD, conv_in_Bx1xD.astype(state.conv_BxCxD.dtype)], axis=1)
  conv_out_Bx1xD = short_conv(conv_window_Bx1pCxD, layer.conv_kernel[...].astype(c.dtype),
                              dilation=c.dilation)[:, -1:]
  y_Bx1xD = v_Bx1xD + jax.nn.silu(conv_out_Bx1xD)
  new_state = LngramDecodeState(
      codes_BxHxR=window_BxWxR[:, 1:],
      codes_ok_BxH=window_ok_BxW[:, 1:],
      conv_BxCxD=conv_window_Bx1pCxD[:, 1:],
  )
  return y_Bx1xD, new_state
