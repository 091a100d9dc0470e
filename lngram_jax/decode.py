"""Token-by-token decoding of one Lngram v2 layer (DESIGN.md §2, decode).

The layer at step t needs, besides h_t:
  * the codes of the (max order - 1) previous positions per route, to address
    the n-grams ending at t, and whether each of them is a real token of t's
    segment (otherwise windows through it are invalid and read zero);
  * the (W-1)·dilation previous conv inputs RMSNorm_c(ṽ), already zeroed where
    they are padding or belong to an earlier segment (a conv tap never reads
    across a segment).
Decoding continues the segment of the last prompt token, so "same segment" is
settled once at prefill and a boolean per history slot is enough.

Prefill is the layer's own forward; the step runs the same `core.forward`
with two pieces of its own: a lookup over the short window (history codes +
this token, `ngram_rows` and `gather_rows` as in the parallel path) and a conv
over the stored inputs + this one. So decoding reproduces the parallel forward.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from lngram_jax import core
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.config import LngramConfig
from lngram_jax.conv import short_conv
from lngram_jax.lookup import gather_rows


@struct.dataclass
class LngramDecodeState:
  """Per-layer decode state; H = max order - 1, S = (W-1)·dilation conv steps.

  codes_BxHxR: codes of the H previous positions, oldest first.
  codes_ok_BxH: whether that position is a real token of the current segment.
  conv_BxSxD: the S previous conv inputs, oldest first, zero where not ok.
  """

  codes_BxHxR: jnp.ndarray
  codes_ok_BxH: jnp.ndarray
  conv_BxSxD: jnp.ndarray


def init_decode_state(config: LngramConfig, batch: int, dtype=None) -> LngramDecodeState:
  """An empty history: every slot is 'before the sequence'."""
  c = config
  dtype = c.dtype if dtype is None else dtype
  H, S = c.max_order - 1, c.conv_context
  return LngramDecodeState(
      codes_BxHxR=jnp.zeros((batch, H, c.routes), jnp.int32),
      codes_ok_BxH=jnp.zeros((batch, H), bool),
      conv_BxSxD=jnp.zeros((batch, S, c.d_model), dtype),
  )


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
  y_BxTxD, trace = core.forward(layer.param_arrays(), c, h_BxTxD, segment_ids=segment_ids,
                                valid=valid)

  # A history slot is usable if it is a real token of the last token's segment.
  ok_BxT = valid.astype(bool)
  if segment_ids is not None:
    last_seg_Bx1, _ = _take_history(segment_ids, lengths_B, 1)
    ok_BxT = ok_BxT & (segment_ids == last_seg_Bx1)
  H, S = c.max_order - 1, c.conv_context
  codes_BxHxR, in_range_BxH = _take_history(
      codes_from_logits(trace.logits_BxTxRxM), lengths_B, H)
  ok_BxH, _ = _take_history(ok_BxT, lengths_B, H)
  conv_BxSxD, conv_in_range_BxS = _take_history(trace.conv_in_BxTxD, lengths_B, S)
  conv_ok_BxS, _ = _take_history(ok_BxT, lengths_B, S)
  conv_ok_BxS = conv_ok_BxS & conv_in_range_BxS
  state = LngramDecodeState(
      codes_BxHxR=codes_BxHxR,
      codes_ok_BxH=ok_BxH & in_range_BxH,
      conv_BxSxD=conv_BxSxD * conv_ok_BxS[:, :, None].astype(conv_BxSxD.dtype),
  )
  return y_BxTxD, state


def lngram_decode_step(layer, h_Bx1xD, state: LngramDecodeState):
  """One position per row: (y_Bx1xD, new state). The token itself is valid.

  `core.forward` with the window pieces: each order n looks up the window
  (H-n+1 history slots + this token) with the same `ngram_rows` as the
  parallel path; the conv runs `short_conv` over the S stored inputs + this
  one and keeps the last output.
  """
  c = layer.config
  B = h_Bx1xD.shape[0]
  if h_Bx1xD.shape[1:] != (1, c.d_model):
    raise ValueError(f"h must have shape [B, 1, {c.d_model}]; got {tuple(h_Bx1xD.shape)}.")
  window_ok_BxH1 = jnp.concatenate([state.codes_ok_BxH, jnp.ones((B, 1), bool)], axis=1)

  def window_codes(logits_Bx1xRxM):
    return jnp.concatenate([state.codes_BxHxR, codes_from_logits(logits_Bx1xRxM)], axis=1)

  def lookup(table_ExDm, logits_Bx1xRxM, order):
    # The window of order n is the last n slots; earlier ones are "before" it.
    rows_BxnxR, ok_Bxn = ngram_rows(window_codes(logits_Bx1xRxM)[:, -order:], order=order,
                                    bits=c.bits, valid=window_ok_BxH1[:, -order:])
    return gather_rows(table_ExDm, rows_BxnxR[:, -1:], ok_Bxn[:, -1:])

  def conv(conv_in_Bx1xD, kernel_WxD, *, dilation):
    window_BxS1xD = jnp.concatenate(
        [state.conv_BxSxD, conv_in_Bx1xD.astype(state.conv_BxSxD.dtype)], axis=1)
    return short_conv(window_BxS1xD, kernel_WxD, dilation=dilation)[:, -1:]

  y_Bx1xD, trace = core.forward(layer.param_arrays(), c, h_Bx1xD, lookup=lookup, conv=conv)
  new_state = LngramDecodeState(
      codes_BxHxR=window_codes(trace.logits_BxTxRxM)[:, 1:],
      codes_ok_BxH=window_ok_BxH1[:, 1:],
      conv_BxSxD=jnp.concatenate(
          [state.conv_BxSxD, trace.conv_in_BxTxD.astype(state.conv_BxSxD.dtype)], axis=1)[:, 1:],
  )
  return y_Bx1xD, new_state
