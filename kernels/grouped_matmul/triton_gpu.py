"""GPU: the grouped matmul as Pallas Triton kernels (gmm, and the tgmm of its backward).

XLA:GPU (jax 0.10.2 and 0.11.2) lowers `jax.lax.ragged_dot` densely: every row is
multiplied by every group's matrix, masked (a [M, G·K] operand: G times the work
and the memory). These kernels visit only the groups a tile of rows holds:

  gmm   out[M, N] = lhs[M, K] @ rhs[g] for each row's group g (rhs [G, K, N], or
        [G, N, K] with `transpose_rhs`, the backward's lhs cotangent). The grid runs
        over tiles of `block_m` rows × `block_n` columns; a program loops over the
        groups its rows touch (first..last, computed in XLA from the group sizes) and,
        per group, over K in steps of `block_k`, with the rows of other groups masked
        to zero on load, so the groups' products sum into one accumulator. Rows past
        the last group belong to no group and come out zero.
  tgmm  drhs[G, K, N] = Σ_{rows r of g} lhs[r]ᵀ dout[r]: the grid runs over (group,
        K tile, N tile); a program walks its group's rows `block_m` at a time.

Accumulation is float32; outputs take lhs's (gmm) or the given dtype (tgmm). Rows are
padded (in XLA) so that every tile a program loads lies inside its array: Triton
masks out-of-range addresses itself, but interpret mode clamps a slice that runs
past the end (`dynamic_slice`), which would shift the rows under the mask. K and N
must be multiples of their blocks (`supported`): the MoE's widths are.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.out_shapes import like, vary_like

_NT = (((1,), (1,)), ((), ()))  # a·bᵀ
_TN = (((0,), (0,)), ((), ()))  # aᵀ·b

BLOCK_M = 64
MAX_BLOCK = 64       # K and N tiles: the largest power of 2 <= this dividing the width
MIN_BLOCK = 16       # tl.dot's smallest side
NUM_WARPS = 4
NUM_STAGES = 2


def _dot(a, b, dims=None):
  if dims is None:
    return jnp.dot(a, b, preferred_element_type=jnp.float32)
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def block_for(width: int) -> int | None:
  """The K or N tile of a width: the largest power of 2 in [16, 64] dividing it."""
  b = MAX_BLOCK
  while b >= MIN_BLOCK:
    if width % b == 0:
      return b
    b //= 2
  return None


def supported(dtype, k: int, n: int) -> bool:
  """float32, bfloat16 or float16 operands whose K and N take whole tiles."""
  floats = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return jnp.dtype(dtype) in floats and block_for(k) is not None and block_for(n) is not None


def compiler_params():
  return plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def _groups(group_sizes_G):
  """(starts_G, ends_G) of the groups' rows, int32."""
  ends_G = jnp.cumsum(group_sizes_G).astype(jnp.int32)
  return ends_G - group_sizes_G.astype(jnp.int32), ends_G


def _tile_groups(starts_G, ends_G, tiles: int, block_m: int):
  """(first_T, last_T): the groups whose rows meet each row tile (last < first: none)."""
  total = ends_G[-1]
  begin_T = jnp.arange(tiles, dtype=jnp.int32) * block_m
  end_T = jnp.minimum(begin_T + block_m, total) - 1
  first_T = jnp.searchsorted(ends_G, begin_T, side="right").astype(jnp.int32)
  last_T = jnp.searchsorted(ends_G, end_T, side="right").astype(jnp.int32)
  last_T = jnp.where(begin_T < total, last_T, first_T - 1)
  del starts_G
  return first_T, last_T


def _gmm_kernel(first_ref, last_ref, starts_ref, ends_ref, lhs_ref, rhs_ref, out_ref, *,
                k, block_m, block_k, block_n, transpose_rhs):
  i, j = pl.program_id(0), pl.program_id(1)
  rows_M = i * block_m + jnp.arange(block_m)
  row_tile, col_tile = pl.ds(i * block_m, block_m), pl.ds(j * block_n, block_n)

  def group(g, acc_MxN):
    mine_M = (rows_M >= starts_ref[g]) & (rows_M < ends_ref[g])

    def k_step(kk, acc_MxN):
      k_tile = pl.ds(kk * block_k, block_k)
      a_MxK = plgpu.load(lhs_ref.at[row_tile, k_tile], mask=mine_M[:, None], other=0.0)
      if transpose_rhs:   # rhs [G, N, K]
        return acc_MxN + _dot(a_MxK, rhs_ref[g, col_tile, k_tile], _NT)
      return acc_MxN + _dot(a_MxK, rhs_ref[g, k_tile, col_tile])

    return lax.fori_loop(0, k // block_k, k_step, acc_MxN)

  acc_MxN = lax.fori_loop(first_ref[i], last_ref[i] + 1, group,
                          jnp.zeros((block_m, block_n), jnp.float32))
  out_ref[row_tile, col_tile] = acc_MxN.astype(out_ref.dtype)


def _tgmm_kernel(starts_ref, ends_ref, lhs_ref, dout_ref, out_ref, *, block_m, block_k,
                 block_n):
  g, kt, nt = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  start, end = starts_ref[g], ends_ref[g]
  k_tile, n_tile = pl.ds(kt * block_k, block_k), pl.ds(nt * block_n, block_n)

  def row_step(s, acc_KxN):
    first = start + s * block_m
    mine_M = first + jnp.arange(block_m) < end
    rows = pl.ds(first, block_m)
    a_MxK = plgpu.load(lhs_ref.at[rows, k_tile], mask=mine_M[:, None], other=0.0)
    d_MxN = plgpu.load(dout_ref.at[rows, n_tile], mask=mine_M[:, None], other=0.0)
    return acc_KxN + _dot(a_MxK, d_MxN, _TN)

  steps = (end - start + block_m - 1) // block_m
  acc_KxN = lax.fori_loop(0, steps, row_step, jnp.zeros((block_k, block_n), jnp.float32))
  out_ref[g, k_tile, n_tile] = acc_KxN.astype(out_ref.dtype)


def _padded_rows(x_MxD, rows: int):
  return jnp.pad(x_MxD, ((0, rows - x_MxD.shape[0]), (0, 0)))


def gmm(lhs_MxK, rhs, group_sizes_G, *, transpose_rhs: bool = False,
        interpret: bool = False, block_m: int = BLOCK_M):
  """[M, N] in lhs's dtype (module docstring). rhs: [G, K, N], or [G, N, K] when
  `transpose_rhs`; same dtype as lhs."""
  M, K = lhs_MxK.shape
  N = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  block_k, block_n = block_for(K), block_for(N)
  tiles = pl.cdiv(M, block_m)
  starts_G, ends_G = _groups(group_sizes_G)
  first_T, last_T = _tile_groups(starts_G, ends_G, tiles, block_m)
  meta = [vary_like(x, lhs_MxK, rhs) for x in (first_T, last_T, starts_G, ends_G)]
  lhs = _padded_rows(vary_like(lhs_MxK, rhs), tiles * block_m)
  kernel = functools.partial(_gmm_kernel, k=K, block_m=block_m, block_k=block_k,
                             block_n=block_n, transpose_rhs=transpose_rhs)
  out = pl.pallas_call(
      kernel, grid=(tiles, N // block_n),
      out_shape=like(lhs, (tiles * block_m, N), lhs_MxK.dtype),
      compiler_params=compiler_params(), interpret=interpret, name="grouped_matmul_gmm",
  )(*meta, lhs, vary_like(rhs, lhs_MxK))
  return out[:M]


def tgmm(lhs_MxK, dout_MxN, group_sizes_G, out_dtype, *, interpret: bool = False,
         block_m: int = BLOCK_M):
  """[G, K, N]: each group's lhs rows, transposed, times its dout rows."""
  M, K = lhs_MxK.shape
  N = dout_MxN.shape[1]
  G = group_sizes_G.shape[0]
  block_k, block_n = block_for(K), block_for(N)
  starts_G, ends_G = _groups(group_sizes_G)
  rows = (pl.cdiv(M, block_m) + 1) * block_m   # a group's last step may start at row M - 1
  lhs = _padded_rows(vary_like(lhs_MxK, dout_MxN), rows)
  dout = _padded_rows(vary_like(dout_MxN, lhs_MxK), rows)
  meta = [vary_like(x, lhs) for x in (starts_G, ends_G)]
  kernel = functools.partial(_tgmm_kernel, block_m=block_m, block_k=block_k, block_n=block_n)
  return pl.pallas_call(
      kernel, grid=(G, K // block_k, N // block_n),
      out_shape=like(lhs, (G, K, N), out_dtype),
      compiler_params=compiler_params(), interpret=interpret, name="grouped_matmul_tgmm",
  )(*meta, lhs, dout)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def grouped_matmul_triton(lhs_MxK, rhs_GxKxN, group_sizes_G, interpret=False):
  """[M, N] in lhs's dtype; rhs in lhs's dtype; rows past Σ sizes are zero."""
  return gmm(lhs_MxK, rhs_GxKxN, group_sizes_G, interpret=interpret)


def _forward(lhs_MxK, rhs_GxKxN, group_sizes_G, interpret):
  out = gmm(lhs_MxK, rhs_GxKxN, group_sizes_G, interpret=interpret)
  return out, (lhs_MxK, rhs_GxKxN, group_sizes_G)


def _backward(interpret, residuals, dout_MxN):
  lhs_MxK, rhs_GxKxN, group_sizes_G = residuals
  dout_MxN = dout_MxN.astype(lhs_MxK.dtype)
  dlhs_MxK = gmm(dout_MxN, rhs_GxKxN, group_sizes_G, transpose_rhs=True, interpret=interpret)
  drhs_GxKxN = tgmm(lhs_MxK, dout_MxN, group_sizes_G, rhs_GxKxN.dtype, interpret=interpret)
  return dlhs_MxK, drhs_GxKxN, np.zeros(group_sizes_G.shape, jax.dtypes.float0)


grouped_matmul_triton.defvjp(_forward, _backward)
