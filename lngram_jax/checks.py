"""Input checks that fail at trace time, before any compilation."""

from __future__ import annotations

import jax.numpy as jnp


def check_rank(name: str, x, rank: int, shape_doc: str) -> None:
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


def check_layer_inputs(d_model: int, h_BxTxD, segment_ids=None, valid=None) -> None:
  """The inputs of one Lngram layer call (plain or sharded)."""
  check_rank("h", h_BxTxD, 3, "[B, T, d]")
  check_float("h", h_BxTxD)
  if h_BxTxD.shape[-1] != d_model:
    raise ValueError(f"h last dim {h_BxTxD.shape[-1]} != d_model={d_model}.")
  B, T = h_BxTxD.shape[:2]
  check_mask("segment_ids", segment_ids, (B, T))
  check_mask("valid", valid, (B, T))
  if segment_ids is not None:
    check_int("segment_ids", segment_ids)
