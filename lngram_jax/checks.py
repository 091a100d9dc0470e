"""Input checks that fail at trace time, before any compilation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def check_array(name: str, x) -> None:
  """An array (jax or numpy), not a python list or scalar: its shape is read next."""
  if not (hasattr(x, "shape") and hasattr(x, "dtype")):
    raise TypeError(f"{name} must be an array (jax or numpy); got {type(x).__name__}.")


def check_rank(name: str, x, rank: int, shape_doc: str) -> None:
  check_array(name, x)
  if x.ndim != rank:
    raise ValueError(
        f"{name} must have rank {rank} ({shape_doc}); got shape {tuple(x.shape)}.")


def check_float(name: str, x) -> None:
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be a floating array; got dtype {x.dtype}.")


def check_int(name: str, x) -> None:
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"{name} must be an integer array; got dtype {x.dtype}.")


def check_mask(name: str, mask, shape: tuple[int, ...]) -> None:
  """Segment ids (int) or validity masks (bool) of shape [B, T]."""
  if mask is None:
    return
  if tuple(mask.shape) != tuple(shape):
    raise ValueError(
        f"{name} must have shape {tuple(shape)} ([B, T]); got {tuple(mask.shape)}.")


def check_valid(name: str, valid, shape: tuple[int, ...]):
  """A token mask of `shape` as bool: bool itself, or numbers that are all 0 or 1.

  A mask selects; it never scales. An int mask holding a 2 is refused when its
  values are known (traced masks are cast, nonzero = valid).
  """
  check_array(name, valid)
  check_mask(name, valid, shape)
  if valid.dtype == jnp.bool_:
    return valid
  if not (jnp.issubdtype(valid.dtype, jnp.integer) or jnp.issubdtype(valid.dtype, jnp.floating)):
    raise TypeError(f"{name} must be bool (or 0/1 numbers); got dtype {valid.dtype}.")
  try:
    values = np.asarray(valid)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    values = None
  if values is not None:
    bad = values[(values != 0) & (values != 1)]
    if bad.size:
      raise ValueError(f"{name} must be bool or hold only 0 and 1; it holds "
                       f"{np.unique(bad)[:5].tolist()} (dtype {valid.dtype}).")
  return valid != 0


def check_nonempty(name: str, x, doc: str = "B, T") -> None:
  """No zero-sized leading dims: an empty batch or sequence is a caller's mistake."""
  dims = doc.split(", ")
  for label, size in zip(dims, x.shape[:len(dims)], strict=True):
    if size < 1:
      raise ValueError(f"{name} has shape {tuple(x.shape)}: {label}={size} must be >= 1.")


def check_layer_inputs(d_model: int, h_BxTxD, segment_ids=None, valid=None) -> None:
  """The inputs of one Lngram layer call (plain, sharded or decode)."""
  check_rank("h", h_BxTxD, 3, "[B, T, d]")
  check_float("h", h_BxTxD)
  if h_BxTxD.shape[-1] != d_model:
    raise ValueError(f"h last dim {h_BxTxD.shape[-1]} != d_model={d_model}.")
  check_nonempty("h", h_BxTxD)
  B, T = h_BxTxD.shape[:2]
  if segment_ids is not None:
    check_array("segment_ids", segment_ids)
  check_mask("segment_ids", segment_ids, (B, T))
  if valid is not None:
    check_valid("valid", valid, (B, T))
  if segment_ids is not None:
    check_int("segment_ids", segment_ids)
