"""Flip scores and the table scatter-add in one Pallas kernel for GPU (Triton lowering).

The op of `reference.flip_scores_reference`: per row id i, the scores of g_i
against the row E[row_i] and against each row whose id differs from it in one
bit (row_i XOR 2^k, k in `flips`), and the scatter-add of g_i onto the table
gradient at row_i. Counterfactual rows get no gradient.

Layout: the grid runs over blocks of `block_w` row ids. A program loads its
ids and its [block_w, D] cotangent tile once, then for the row and each flip
gathers a [block_w, D] tile of the table (a pointer gather, as in
`kernels.sink_readout.fused_triton`) and reduces it against g while g is in
registers: the cotangent is read from HBM once for all 1 + |flips| rows and the
table add, where an XLA backward reads it once per gather and once more for
the scatter. Scores leave as one [block_w, K] tile per program.

Table gradient: the same rows are hit by many programs, in no fixed order, so
the program adds g to `d_table` with float32 (float64) atomics
(`plgpu.atomic_add`) into a zero buffer passed in and aliased to the output.
A sorted / segmented reduction would be deterministic but needs a sort of all
N ids and a second pass; the XLA scatter-add it replaces is itself atomic on
GPU. The sum is therefore exact up to the order of float additions, which
varies run to run on a GPU (interpret mode on CPU runs the programs in order).

Triton wants power-of-2 tiles: the feature axis is padded to `triton_pad(D)`
and every load, store and atomic is masked; ids past N and ids of -1 read
nothing and add nothing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.flip_scores.reference import acc_dtype
from kernels.out_shapes import like
from kernels.sink_readout.common import next_power_of_2, triton_pad

DEFAULT_BLOCK_W = 32  # untuned: [32, 128] float32 tiles, 4 warps


def _kernel(rows_ref, g_ref, table_ref, *refs, n_rows, dim, flips, block_w, acc,
            with_table_grad, interpret):
  scores_ref = refs[-2] if with_table_grad else refs[-1]
  cols = triton_pad(dim)
  n_scores = scores_ref.shape[1]
  first = pl.program_id(0) * block_w
  in_range_W = first + jnp.arange(block_w) < n_rows
  rows_W = plgpu.load(rows_ref.at[pl.ds(0, block_w)], mask=in_range_W, other=-1)
  ok_W = in_range_W & (rows_W >= 0)
  col_C = jnp.arange(cols)
  tile_ok = ok_W[:, None] & (col_C < dim)[None, :]
  g_WxC = plgpu.load(g_ref.at[pl.ds(0, block_w), pl.ds(0, cols)], mask=tile_ok,
                     other=0.0).astype(acc)
  safe_W = jnp.where(ok_W, rows_W, 0)
  slot_K = jnp.arange(n_scores)
  scores_WxK = jnp.zeros((block_w, n_scores), acc)
  for k, bit in enumerate((None,) + tuple(flips)):
    cand_W = safe_W if bit is None else jnp.bitwise_xor(safe_W, jnp.int32(1 << bit))
    e_WxC = plgpu.load(table_ref.at[cand_W[:, None], col_C[None, :]], mask=tile_ok,
                       other=0.0).astype(acc)
    s_W = jnp.sum(e_WxC * g_WxC, axis=1)
    scores_WxK = jnp.where(slot_K[None, :] == k, s_W[:, None], scores_WxK)
  plgpu.store(scores_ref.at[pl.ds(0, block_w), pl.ds(0, n_scores)], scores_WxK,
              mask=in_range_W[:, None] & (slot_K < 1 + len(flips))[None, :])
  if with_table_grad:
    _add_rows(refs[-1], rows_ref, g_ref, first=first, n_rows=n_rows, dim=dim, cols=cols,
              acc=acc, interpret=interpret)


def _add_rows(d_table_ref, rows_ref, g_ref, *, first, n_rows, dim, cols, acc, interpret):
  """d_table[row_w] += g_w, one atomic [D] row at a time.

  One row per atomic, not one [block_w, D] tile: interpret mode applies a tile
  atomic as a gather-then-set, which drops all but one of duplicate ids, and
  takes no mask. The row and its g are reloaded (cached since the loads above).
  On GPU the mask skips ids of -1 and padded features; interpret mode adds their
  g = 0 to row 0 instead, and indexes exactly D features (it has no power-of-2 rule).
  """
  col_ok = jnp.arange(cols) < dim

  def one(w, carry):
    in_range = first + w < n_rows
    row = plgpu.load(rows_ref.at[w], mask=in_range, other=-1)
    ok = in_range & (row >= 0)
    g_C = plgpu.load(g_ref.at[w, pl.ds(0, cols)], mask=col_ok & ok, other=0.0).astype(acc)
    row = jnp.where(ok, row, 0)
    zero = jnp.zeros((), row.dtype)  # index types must agree (x64 would make 0 an int64)
    if interpret:
      plgpu.atomic_add(d_table_ref, (row, pl.ds(zero, dim)), g_C[:dim])
    else:
      plgpu.atomic_add(d_table_ref, (row, pl.ds(zero, cols)), g_C, mask=col_ok & ok)
    return carry

  jax.lax.fori_loop(0, rows_ref.shape[0], one, None)


@functools.partial(jax.jit, static_argnames=("flips", "with_table_grad", "block_w",
                                             "num_warps", "interpret"))
def flip_scores(table_VxD, rows_N, g_NxD, *, flips: tuple[int, ...],
                with_table_grad: bool = True, block_w: int = DEFAULT_BLOCK_W,
                num_warps: int = 4, interpret: bool = False):
  """(scores_NxK, d_table_VxD or None) of `flip_scores_reference`, in one kernel.

  Args:
    table_VxD: the table (any float dtype; float64 only where the backend has it).
    rows_N: int32 row ids, -1 = read and add nothing. Every id XOR 2^k must lie
      inside the table (the caller's contract; n-gram ids stay in their route).
    g_NxD: cotangents, one per id.
    flips: the bit positions k, compiled in.
    with_table_grad: also scatter-add g onto a float32 (or wider) table gradient.
    block_w: ids per program, a power of 2.
    interpret: run in interpret mode (CPU).
  """
  V, D = table_VxD.shape
  (N,) = rows_N.shape
  if g_NxD.shape != (N, D):
    raise ValueError(f"flip_scores: g {tuple(g_NxD.shape)} must be (N, D) = {(N, D)}.")
  if block_w != next_power_of_2(block_w):
    raise ValueError(f"flip_scores: {block_w=} must be a power of 2.")
  if any(not 0 <= bit < 31 for bit in flips):
    raise ValueError(f"flip_scores: {flips=} must be bit positions in [0, 31).")
  acc = acc_dtype(table_VxD.dtype, g_NxD.dtype)
  cols, k_pad = triton_pad(D), next_power_of_2(1 + len(flips))
  whole = pl.BlockSpec((V, D), lambda i: (0, 0))
  in_specs = [pl.BlockSpec((block_w,), lambda i: (i,)),
              pl.BlockSpec((block_w, cols), lambda i: (i, 0)), whole]
  out_specs = [pl.BlockSpec((block_w, k_pad), lambda i: (i, 0))]
  out_shape = [like(g_NxD, (N, 1 + len(flips)), acc)]
  args = [rows_N.astype(jnp.int32), g_NxD, table_VxD]
  aliases = {}
  if with_table_grad:  # atomics add into a zero buffer that becomes the output
    in_specs.append(whole)
    out_specs.append(whole)
    out_shape.append(like(g_NxD, (V, D), acc))
    args.append(jnp.zeros((V, D), acc))
    aliases = {3: 1}
  kernel = functools.partial(_kernel, n_rows=N, dim=D, flips=tuple(flips), block_w=block_w,
                             acc=acc, with_table_grad=with_table_grad,
                             interpret=interpret)
  outs = pl.pallas_call(
      kernel,
      grid=(pl.cdiv(N, block_w),),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      input_output_aliases=aliases,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
      interpret=interpret,
      name="flip_scores",
  )(*args)
  return outs[0], (outs[1] if with_table_grad else None)
