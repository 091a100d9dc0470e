"""The rolling decode history of an n-gram memory branch (DESIGN.md §2.10).

Lngram v2 (`decode.py`) and the Lngram v1 and Engram arms keep the same kind
of state per layer: the H = max order - 1 previous slots (v2 and v1: codes
[B, H, R]; Engram: canonical ids [B, H]), whether each is a real token of
the current segment, and the S = (W-1)·dilation previous conv inputs, zero
where they are not. This module writes that state once:

  prompt_lengths   validated lengths [B] and the token mask of a right-padded prompt;
  prefill_history  the state at each row's length after the parallel forward;
  step_window      the history + this token (what one decode step reads);
  conv_window      the stored conv inputs + this one (what the step's conv reads).

The next state of a step is each window without its oldest slot (`[:, 1:]`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lngram_jax import checks


def _concrete(x):
  """x as a numpy array, or None when it is traced (its values are unknown)."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def prompt_lengths(batch: int, length: int, lengths=None, valid=None, *, minimum: int = 0):
  """(lengths_B int32, valid_BxT bool) of a right-padded prompt of [batch, length].

  lengths: the real tokens per row, integers in [minimum, length] (default:
    the count of `valid`, or `length`). Floats, bools, a wrong shape and, when
    the values are concrete, values out of range are refused: a length past
    the prompt would take the history from clipped positions.
  valid: the token mask [B, T] (default t < lengths); bool or 0/1.
  """
  if valid is not None:
    valid = checks.check_valid("valid", valid, (batch, length))
  if lengths is None:
    if valid is None:
      return jnp.full((batch,), length, jnp.int32), jnp.ones((batch, length), bool)
    return jnp.sum(valid, axis=1, dtype=jnp.int32), valid
  if not hasattr(lengths, "dtype"):
    lengths = np.asarray(lengths)
  values = _concrete(lengths)
  if lengths.dtype == bool or not jnp.issubdtype(lengths.dtype, jnp.integer):
    shown = "" if values is None else f"={values.tolist()}"
    raise TypeError(f"lengths{shown} must be integers; got dtype {lengths.dtype}.")
  if tuple(lengths.shape) != (batch,):
    raise ValueError(f"lengths must have shape ({batch},) ([B]); got {tuple(lengths.shape)}.")
  if values is not None and values.size and (
      values.min() < minimum or values.max() > length):
    raise ValueError(f"lengths={values.tolist()} must be in [{minimum}, T={length}] "
                     "(the real tokens of each prompt row).")
  lengths_B = jnp.asarray(lengths, jnp.int32)
  if valid is None:
    valid = jnp.arange(length, dtype=jnp.int32)[None, :] < lengths_B[:, None]
  return lengths_B, valid


def take_last(x_BxTx, lengths_B, size: int):
  """x at positions lengths-size .. lengths-1 (clipped) and whether each is >= 0."""
  T = x_BxTx.shape[1]
  pos_BxH = lengths_B[:, None] - size + jnp.arange(size, dtype=jnp.int32)
  idx_BxH = jnp.clip(pos_BxH, 0, T - 1)
  idx = idx_BxH.reshape(idx_BxH.shape + (1,) * (x_BxTx.ndim - 2))
  return jnp.take_along_axis(x_BxTx, idx, axis=1), pos_BxH >= 0


def prefill_history(slots_BxTx, conv_in_BxTxD, lengths_B, valid_BxT, *, history: int,
                    conv_context: int, segment_ids=None):
  """The decode state after a right-padded prompt: (slots_BxHx, slots_ok_BxH, conv_BxSxD).

  slots_BxTx: what each position leaves in the history (codes [B, T, R] or
    ids [B, T]); conv_in_BxTxD: the conv inputs of the parallel forward.
  A slot is usable if it is a real token of the last token's segment; the
  conv inputs of the others are selected to zero (not multiplied: a NaN at
  a padding position must not enter the next step's taps).
  """
  ok_BxT = valid_BxT.astype(bool)
  if segment_ids is not None:
    last_seg_Bx1, _ = take_last(segment_ids, lengths_B, 1)
    ok_BxT = ok_BxT & (segment_ids == last_seg_Bx1)
  slots_BxHx, in_range_BxH = take_last(slots_BxTx, lengths_B, history)
  ok_BxH, _ = take_last(ok_BxT, lengths_B, history)
  conv_BxSxD, conv_in_range_BxS = take_last(conv_in_BxTxD, lengths_B, conv_context)
  conv_ok_BxS, _ = take_last(ok_BxT, lengths_B, conv_context)
  conv_ok_BxS = conv_ok_BxS & conv_in_range_BxS
  conv_BxSxD = jnp.where(conv_ok_BxS[:, :, None], conv_BxSxD, 0).astype(conv_in_BxTxD.dtype)
  return slots_BxHx, ok_BxH & in_range_BxH, conv_BxSxD


def step_window(slots_BxHx, slots_ok_BxH, new_Bx1x):
  """(window [B, H+1, ...], ok [B, H+1]): the history, then this token (valid)."""
  B = slots_ok_BxH.shape[0]
  window = jnp.concatenate([slots_BxHx, new_Bx1x.astype(slots_BxHx.dtype)], axis=1)
  ok = jnp.concatenate([slots_ok_BxH, jnp.ones((B, 1), bool)], axis=1)
  return window, ok


def conv_window(conv_BxSxD, conv_in_Bx1xD):
  """[B, S+1, D]: the stored conv inputs followed by this step's, in the state's dtype."""
  return jnp.concatenate([conv_BxSxD, conv_in_Bx1xD.astype(conv_BxSxD.dtype)], axis=1)


def check_state_batch(name: str, batch: int, *arrays) -> None:
  """Every array of a decode state has the step's batch as its first dim."""
  for x in arrays:
    if x.shape[0] != batch:
      raise ValueError(f"{name}: the decode state has batch {x.shape[0]} but the input "
                       f"has B={batch}; build the state for this batch.")
