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
The history itself (taking it at each row's length, rolling it one step) is
`history.py`'s, shared with the Lngram v1 and Engram arms. Inputs are checked
as the layer checks them; lengths and states as `history.py` describes.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct

from lngram_jax import checks, core, history
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


def prefill_decode_state(layer, h_BxTxD, *, lengths=None, segment_ids=None, valid=None):
  """The parallel forward over a (right-padded) prompt, and the decode state.

  Args:
    layer: an `LngramV2`.
    h_BxTxD: the layer's input over the prompt (floating, checked as the
      layer checks it).
    lengths: int [B] in [0, T], the real tokens per row (default T, or the
      count of `valid`); decoding continues after position lengths-1 in its
      segment.
    segment_ids, valid: as for the layer's forward (`valid` defaults to
      t < lengths).

  Returns:
    y_BxTxD (equal to `layer(h, segment_ids=, valid=)`) and an
    `LngramDecodeState` for the step at position `lengths`.
  """
  c = layer.config
  checks.check_layer_inputs(c.d_model, h_BxTxD, segment_ids, valid)
  B, T = h_BxTxD.shape[:2]
  lengths_B, valid_BxT = history.prompt_lengths(B, T, lengths, valid)
  y_BxTxD, trace = core.forward(layer.param_arrays(), c, h_BxTxD, segment_ids=segment_ids,
                                valid=valid_BxT)
  codes_BxHxR, codes_ok_BxH, conv_BxSxD = history.prefill_history(
      codes_from_logits(trace.logits_BxTxRxM), trace.conv_in_BxTxD, lengths_B, valid_BxT,
      history=c.max_order - 1, conv_context=c.conv_context, segment_ids=segment_ids)
  return y_BxTxD, LngramDecodeState(codes_BxHxR=codes_BxHxR, codes_ok_BxH=codes_ok_BxH,
                                    conv_BxSxD=conv_BxSxD)


def check_state(config: LngramConfig, state: LngramDecodeState, batch: int,
                where: str = "lngram_decode_step") -> None:
  """The state was built for this layer's config and this batch.

  `config` may be any config with max_order, conv_context, routes and d_model
  (the Lngram v1 arm keeps this state too); `where` starts the messages.
  """
  if not isinstance(state, LngramDecodeState):
    raise TypeError(f"{where}: state must be an LngramDecodeState; got "
                    f"{type(state).__name__}.")
  history.check_state_batch(where, batch, state.codes_BxHxR, state.codes_ok_BxH,
                            state.conv_BxSxD)
  H, S, R, D = config.max_order - 1, config.conv_context, config.routes, config.d_model
  for name, got, want in (("codes_BxHxR", state.codes_BxHxR.shape[1:], (H, R)),
                          ("codes_ok_BxH", state.codes_ok_BxH.shape[1:], (H,)),
                          ("conv_BxSxD", state.conv_BxSxD.shape[1:], (S, D))):
    if tuple(got) != want:
      raise ValueError(f"{where}: state.{name} has shape [B, {', '.join(map(str, got))}]"
                       f" but this layer's config needs [B, {', '.join(map(str, want))}] "
                       f"(H = max order - 1 = {H}, S = conv context = {S}, R = {R}, D = {D}).")


def lngram_decode_step(layer, h_Bx1xD, state: LngramDecodeState):
  """One position per row: (y_Bx1xD, new state). The token itself is valid.

  `core.forward` with the window pieces: each order n looks up the window
  (H-n+1 history slots + this token) with the same `ngram_rows` as the
  parallel path; the conv runs `short_conv` over the S stored inputs + this
  one and keeps the last output.
  """
  c = layer.config
  checks.check_layer_inputs(c.d_model, h_Bx1xD)
  if h_Bx1xD.shape[1] != 1:
    raise ValueError(f"h must have shape [B, 1, {c.d_model}]; got {tuple(h_Bx1xD.shape)}.")
  check_state(c, state, h_Bx1xD.shape[0])

  def window(logits_Bx1xRxM):
    return history.step_window(state.codes_BxHxR, state.codes_ok_BxH,
                               codes_from_logits(logits_Bx1xRxM))

  def lookup(table_ExDm, logits_Bx1xRxM, order):
    # The window of order n is the last n slots; earlier ones are "before" it.
    window_codes, window_ok = window(logits_Bx1xRxM)   # [B, H+1, R], [B, H+1]
    rows_BxnxR, ok_Bxn = ngram_rows(window_codes[:, -order:], order=order, bits=c.bits,
                                    valid=window_ok[:, -order:])
    return gather_rows(table_ExDm, rows_BxnxR[:, -1:], ok_Bxn[:, -1:])

  def conv(conv_in_Bx1xD, kernel_WxD, *, dilation):
    conv_inputs = history.conv_window(state.conv_BxSxD, conv_in_Bx1xD)   # [B, S+1, D]
    return short_conv(conv_inputs, kernel_WxD, dilation=dilation)[:, -1:]

  y_Bx1xD, trace = core.forward(layer.param_arrays(), c, h_Bx1xD, lookup=lookup, conv=conv)
  window_codes, window_ok = window(trace.logits_BxTxRxM)
  new_state = LngramDecodeState(
      codes_BxHxR=window_codes[:, 1:], codes_ok_BxH=window_ok[:, 1:],
      conv_BxSxD=history.conv_window(state.conv_BxSxD, trace.conv_in_BxTxD)[:, 1:])
  return y_Bx1xD, new_state
