"""The TPU grouped matmul: megablox's Mosaic kernel (`gmm`, with its `tgmm` backward).

megablox needs the rows in whole tiles and leaves rows past the last group
unwritten; here the rows are padded to a tile, rows past the groups are zero
on the way in and on the way out (so their cotangents are zero too), and the
tiles are chosen per product: the backward products swap the roles of K and
N, so the tile sizes are a function of the shapes (megablox's `LutFn`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import gmm

MAX_TILE = 512   # rows and columns of one tile (multiples of 128, or the whole dim)


def row_tile(m: int) -> int:
  """The row tile for m rows: 128 up to MAX_TILE."""
  return min(MAX_TILE, 128 * -(-m // 128))


def _col_tile(d: int) -> int:
  return d if d <= MAX_TILE else MAX_TILE


def tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
  """(tm, tk, tn) for an [m, k] @ [k, n] group product."""
  return row_tile(m), _col_tile(k), _col_tile(n)


def supported(dtype) -> bool:
  """megablox multiplies float32 and bfloat16."""
  return jnp.dtype(dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def grouped_matmul_megablox(lhs_MxK, rhs_GxKxN, group_sizes_G, *, interpret: bool = False):
  """[M, N] in lhs's dtype; rows past Σ sizes are zero."""
  M = lhs_MxK.shape[0]
  pad = -M % row_tile(M)
  total = jnp.sum(group_sizes_G)
  inside_M = jnp.arange(M + pad) < total
  lhs = jnp.where(inside_M[:, None], jnp.pad(lhs_MxK, ((0, pad), (0, 0))), 0)
  out = gmm(lhs, rhs_GxKxN.astype(lhs.dtype), group_sizes_G.astype(jnp.int32), lhs.dtype,
            tiling, None, None, False, interpret)
  return jnp.where(inside_M[:, None], out, 0)[:M]
