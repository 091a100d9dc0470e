"""Multi-route discrete addressing and exact n-gram rows (paper §2.2-2.3).

Conventions (shared with the authors' code so checkpoints line up):
  * bit j of route r is logit channel r·M + j; b = z > 0; a = Σ_j b_j·2^j;
  * the n-gram ending at t has row r·C^n + Σ_i a[t-n+1+i]·C^i, the OLDEST
    symbol being the least-significant digit;
  * a window is invalid if it starts before the sequence, spans two packed
    segments, or touches a padding token; invalid windows read nothing.
"""

from __future__ import annotations

import jax.numpy as jnp

from lngram_jax import checks


def codes_from_logits(logits_BxTxRxM: jnp.ndarray) -> jnp.ndarray:
  """Hard codes a[b, t, r] = Σ_j [z_j > 0]·2^j, as int32 [B, T, R]."""
  checks.check_rank("logits", logits_BxTxRxM, 4, "[B, T, R, M]")
  checks.check_float("logits", logits_BxTxRxM)
  bits = logits_BxTxRxM.shape[-1]
  if bits > 30:
    raise ValueError(f"logits last dim M={bits} is too large for int32 codes.")
  weights_M = (2 ** jnp.arange(bits, dtype=jnp.int32))
  bits_BxTxRxM = (logits_BxTxRxM > 0).astype(jnp.int32)
  return jnp.sum(bits_BxTxRxM * weights_M, axis=-1, dtype=jnp.int32)


def shift_right(x_BxT, shift: int, fill=0):
  """x[:, t - shift] along axis 1, `fill` where t - shift < 0."""
  if shift == 0:
    return x_BxT
  T = x_BxT.shape[1]
  if shift >= T:
    return jnp.full_like(x_BxT, fill)
  pad = [(0, 0)] * x_BxT.ndim
  pad[1] = (shift, 0)
  return jnp.pad(x_BxT[:, : T - shift], pad, constant_values=fill)


def shift_left(x_BxT, shift: int, fill=0):
  """x[:, t + shift] along axis 1, `fill` where t + shift >= T."""
  if shift == 0:
    return x_BxT
  T = x_BxT.shape[1]
  if shift >= T:
    return jnp.full_like(x_BxT, fill)
  pad = [(0, 0)] * x_BxT.ndim
  pad[1] = (0, shift)
  return jnp.pad(x_BxT[:, shift:], pad, constant_values=fill)


def window_valid(
    batch_time: tuple[int, int],
    *,
    order: int,
    segment_ids=None,
    valid=None,
) -> jnp.ndarray:
  """valid_BxT[t]: the window [t-order+1, t] is whole, in one segment, unpadded."""
  B, T = batch_time
  checks.check_mask("segment_ids", segment_ids, (B, T))
  checks.check_mask("valid", valid, (B, T))
  ok_BxT = jnp.broadcast_to(jnp.arange(T) >= order - 1, (B, T))
  for back in range(1, order):
    if segment_ids is not None:
      ok_BxT &= shift_right(segment_ids, back, fill=-1) == segment_ids
  if valid is not None:
    valid = valid.astype(bool)
    for back in range(order):
      ok_BxT &= shift_right(valid, back, fill=False)
  return ok_BxT


def ngram_rows(
    codes_BxTxR: jnp.ndarray,
    *,
    order: int,
    bits: int,
    segment_ids=None,
    valid=None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Table rows of the n-grams ending at each position.

  Args:
    codes_BxTxR: int codes in [0, 2**bits).
    order: n.
    bits: M.
    segment_ids: optional int [B, T]; windows spanning two ids are invalid.
    valid: optional bool [B, T] token mask; windows touching padding are invalid.

  Returns:
    rows_BxTxR: int32 rows in [r·C^n, (r+1)·C^n). Invalid windows point at the
      route's first row (a safe index) and must be masked by the caller.
    valid_BxT: bool, whether the window is a real n-gram.
  """
  checks.check_rank("codes", codes_BxTxR, 3, "[B, T, R]")
  checks.check_int("codes", codes_BxTxR)
  if order < 1:
    raise ValueError(f"ngram_rows: order={order} must be >= 1.")
  B, T, R = codes_BxTxR.shape
  C = 2**bits
  if R * C**order > 2**31 - 1:
    raise ValueError(
        f"ngram_rows: R*C^n = {R}*{C}^{order} = {R * C**order} overflows int32.")
  codes_BxTxR = codes_BxTxR.astype(jnp.int32)
  local_BxTxR = jnp.zeros((B, T, R), jnp.int32)
  for slot in range(order):
    # Slot i holds the symbol at t-n+1+i and weighs C^i (oldest = least).
    local_BxTxR += shift_right(codes_BxTxR, order - 1 - slot) * (C**slot)
  valid_BxT = window_valid((B, T), order=order, segment_ids=segment_ids, valid=valid)
  local_BxTxR = jnp.where(valid_BxT[:, :, None], local_BxTxR, 0)
  route_base_R = jnp.arange(R, dtype=jnp.int32) * (C**order)
  return local_BxTxR + route_base_R, valid_BxT
