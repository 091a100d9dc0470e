"""The sink readout as Pallas kernels for TPU (Mosaic lowering).

Layout, after the official TPU flash attention: the grid is (token blocks,
route blocks) with the route axis "arbitrary" (sequential), the online-softmax
state lives in VMEM scratch and is initialised at the first route block to
(max = b0, sum = 1, acc = 0), the sink counted once. A token block is a static
loop over `block_n` tokens, each doing 2-D matmuls on the MXU. Statistics are
kept replicated over the 128 lanes ([Hq, 128]), as the official kernel does,
so that no sublane-to-lane relayout is needed; lse leaves the kernel in that
form and the wrapper keeps lane 0.

A ragged last route block (R not a multiple of `block_r`) is read past the
end of the array: those rows are zeroed and their scores masked. A ragged last
token block needs nothing: tokens are independent, and Pallas drops the
out-of-bounds rows of the output blocks.

Backward: per (token block, route block) it recomputes p from lse, writes that
block's dmem once, and accumulates dq in scratch over the route axis. As in
the Triton kernel, delta = Σ_D out·dout is computed in the kernel from the
`out` and `dout` tiles (resident across the route axis) instead of a separate
preprocess pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.out_shapes import like
from kernels.sink_readout.common import MASK_VALUE

LANES = 128
_NT = (((1,), (1,)), ((), ()))  # a·bᵀ
_TN = (((0,), (0,)), ((), ()))  # aᵀ·b


def _dot(a, b, dims=(((1,), (0,)), ((), ()))):
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _route_masks(j, block_r, routes):
  """(row, column) forms of `route index < R` for the route block j, or None."""
  if routes % block_r == 0:
    return None, None
  first = j * block_r
  rows_Rx1 = first + lax.broadcasted_iota(jnp.int32, (block_r, 1), 0) < routes
  cols_1xR = first + lax.broadcasted_iota(jnp.int32, (1, block_r), 1) < routes
  return rows_Rx1, cols_1xR


def _load_mem(mem_ref, t, rows_Rx1):
  mem_RxDr = mem_ref[t]
  if rows_Rx1 is not None:  # rows past R hold garbage (possibly NaN): zero them
    mem_RxDr = jnp.where(rows_Rx1, mem_RxDr, jnp.zeros_like(mem_RxDr))
  return mem_RxDr


def _forward_kernel(sink_ref, q_ref, mem_ref, out_ref, lse_ref, m_scr, l_scr, acc_scr, *,
                    scale, routes, block_n, block_r):
  """sink_ref: [Hq, LANES], b0 repeated (an input, so b0 may be a traced value)."""
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _init():
    for t in range(block_n):
      m_scr[t] = sink_ref[...]
    l_scr[...] = jnp.ones(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  rows_Rx1, cols_1xR = _route_masks(j, block_r, routes)
  for t in range(block_n):
    mem_RxDr = _load_mem(mem_ref, t, rows_Rx1)
    s_HxR = _dot(q_ref[t], mem_RxDr, _NT) * scale
    if cols_1xR is not None:
      s_HxR = jnp.where(cols_1xR, s_HxR, MASK_VALUE)
    m_prev = m_scr[t]  # [Hq, LANES], every lane equal
    m_next = jnp.maximum(m_prev, jnp.max(s_HxR, axis=1, keepdims=True))
    correction = jnp.exp(m_prev - m_next)
    p_HxR = jnp.exp(s_HxR - m_next[:, :1])
    l_scr[t] = correction * l_scr[t] + jnp.sum(p_HxR, axis=1, keepdims=True)
    m_scr[t] = m_next
    acc_scr[t] = (acc_scr[t] * correction[:, :1]
                  + _dot(p_HxR.astype(mem_RxDr.dtype), mem_RxDr))

  @pl.when(j == pl.num_programs(1) - 1)
  def _finish():
    for t in range(block_n):
      l_HxL = l_scr[t]  # >= 1: the largest term of the sum is exp(0)
      out_ref[t] = (acc_scr[t] / l_HxL[:, :1]).astype(out_ref.dtype)
      lse_ref[t] = m_scr[t] + jnp.log(l_HxL)


def _backward_kernel(q_ref, mem_ref, out_ref, lse_ref, dout_ref, dlse_ref, dq_ref, dmem_ref,
                     dq_scr, *, scale, routes, block_n, block_r):
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _init():
    dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

  rows_Rx1, cols_1xR = _route_masks(j, block_r, routes)
  for t in range(block_n):
    q_HxDr, dout_HxDr = q_ref[t], dout_ref[t]
    delta_Hx1 = jnp.sum(out_ref[t].astype(jnp.float32) * dout_HxDr.astype(jnp.float32),
                        axis=1, keepdims=True)
    shift_Hx1 = dlse_ref[t][:, :1] - delta_Hx1  # ds = p·(dp - delta + dlse)
    mem_RxDr = _load_mem(mem_ref, t, rows_Rx1)
    s_HxR = _dot(q_HxDr, mem_RxDr, _NT) * scale
    p_HxR = jnp.exp(s_HxR - lse_ref[t][:, :1])
    if cols_1xR is not None:
      p_HxR = jnp.where(cols_1xR, p_HxR, 0.0)
    ds_HxR = p_HxR * (_dot(dout_HxDr, mem_RxDr, _NT) + shift_Hx1)
    dmem_RxDr = (_dot(p_HxR.astype(dout_HxDr.dtype), dout_HxDr, _TN)
                + scale * _dot(ds_HxR.astype(q_HxDr.dtype), q_HxDr, _TN))
    dmem_ref[t] = dmem_RxDr.astype(dmem_ref.dtype)
    dq_scr[t] += _dot(ds_HxR.astype(mem_RxDr.dtype), mem_RxDr)

  @pl.when(j == pl.num_programs(1) - 1)
  def _finish():
    dq_ref[...] = (scale * dq_scr[...]).astype(dq_ref.dtype)


def _specs(BT, Hq, R, Dr, block_n, block_r):
  block_r = min(block_r, R)
  grid = (pl.cdiv(BT, block_n), pl.cdiv(R, block_r))
  heads = pl.BlockSpec((block_n, Hq, Dr), lambda i, j: (i, 0, 0))
  routes = pl.BlockSpec((block_n, block_r, Dr), lambda i, j: (i, j, 0))
  stats = pl.BlockSpec((block_n, Hq, LANES), lambda i, j: (i, 0, 0))
  return grid, block_r, heads, routes, stats


def _lanes(x_BTxHq):
  return jnp.broadcast_to(x_BTxHq.astype(jnp.float32)[..., None], (*x_BTxHq.shape, LANES))


_PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


@functools.partial(jax.jit, static_argnames=("scale", "block_n", "block_r", "interpret"))
def forward(q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, scale, block_n, block_r, interpret=False):
  """(out_BTxHqxDr, lse_BTxHq) by the Mosaic forward kernel. No input checks here.

  sink_logit may be a Python float or a traced float32 scalar.
  """
  BT, Hq, Dr = q_BTxHqxDr.shape
  R = mem_BTxRxDr.shape[1]
  grid, block_r, heads, routes, stats = _specs(BT, Hq, R, Dr, block_n, block_r)
  kernel = functools.partial(
      _forward_kernel, scale=float(scale), routes=R, block_n=block_n, block_r=block_r)
  sink_HqxL = jnp.full((Hq, LANES), sink_logit, jnp.float32)
  out, lse_BTxHqxL = pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[pl.BlockSpec((Hq, LANES), lambda i, j: (0, 0)), heads, routes],
      out_specs=[heads, stats],
      out_shape=[like(q_BTxHqxDr, q_BTxHqxDr.shape, q_BTxHqxDr.dtype),
                 like(q_BTxHqxDr, (BT, Hq, LANES), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((block_n, Hq, LANES), jnp.float32),
                      pltpu.VMEM((block_n, Hq, LANES), jnp.float32),
                      pltpu.VMEM((block_n, Hq, Dr), jnp.float32)],
      compiler_params=_PARAMS,
      interpret=interpret,
      name="sink_readout_fwd",
  )(sink_HqxL, q_BTxHqxDr, mem_BTxRxDr)
  return out, lse_BTxHqxL[..., 0]


@functools.partial(jax.jit, static_argnames=("scale", "block_n", "block_r", "interpret"))
def backward(q_BTxHqxDr, mem_BTxRxDr, out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr, dlse_BTxHq, *,
             scale, block_n, block_r, interpret=False):
  """(dq_BTxHqxDr, dmem_BTxRxDr) by the Mosaic backward kernel."""
  BT, Hq, Dr = q_BTxHqxDr.shape
  R = mem_BTxRxDr.shape[1]
  grid, block_r, heads, routes, stats = _specs(BT, Hq, R, Dr, block_n, block_r)
  kernel = functools.partial(
      _backward_kernel, scale=float(scale), routes=R, block_n=block_n, block_r=block_r)
  return pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[heads, routes, heads, stats, heads, stats],
      out_specs=[heads, routes],
      out_shape=[like(q_BTxHqxDr, q_BTxHqxDr.shape, q_BTxHqxDr.dtype),
                 like(mem_BTxRxDr, mem_BTxRxDr.shape, mem_BTxRxDr.dtype)],
      scratch_shapes=[pltpu.VMEM((block_n, Hq, Dr), jnp.float32)],
      compiler_params=_PARAMS,
      interpret=interpret,
      name="sink_readout_bwd",
  )(q_BTxHqxDr, mem_BTxRxDr, out_BTxHqxDr, _lanes(lse_BTxHq), dout_BTxHqxDr, _lanes(dlse_BTxHq))
