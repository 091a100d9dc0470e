"""The sink readout as Pallas kernels for GPU (Triton lowering).

Layout: the grid runs over blocks of `block_n` tokens; a program walks its
tokens one after another and, per token, the route blocks of `block_r` rows
with an online softmax whose state starts at (max = b0, sum = 1, acc = 0): the
sink is counted once, before any route. Scores and statistics are float32.

Triton wants every loaded tile to have a power-of-2 size and tl.dot wants
every side >= 16, so the head and feature axes are padded to such tiles
(`triton_pad`) and every load and store is masked: padded heads, features,
routes past R and tokens past BT are never read from or written to HBM.

Backward (per token, given dout and dlse):
    p = exp(s - lse),  dp = dout·memᵀ,  delta = Σ_D out·dout,
    ds = p·(dp - delta + dlse),
    dq = scale·ds·mem,  dmem = pᵀ·dout + scale·dsᵀ·q.
The official flash-attention backward computes delta in a separate
preprocess pass because many programs share one query row. Here one program
owns all routes of its tokens, so delta is computed in the kernel's prologue
from the `out` and `dout` tiles it loads anyway, and dq and dmem come out of
the same route loop: each dmem tile is written exactly once, no atomics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.out_shapes import like
from kernels.sink_readout.common import MASK_VALUE, triton_pad

_NT = (((1,), (1,)), ((), ()))  # a·bᵀ
_TN = (((0,), (0,)), ((), ()))  # aᵀ·b


def _dot(a, b, dims=None):
  if dims is None:
    return jnp.dot(a, b, preferred_element_type=jnp.float32)
  return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _tile_masks(*, heads, dim, padded_heads, padded_dim):
  """Which rows (heads) and columns (features) of a padded [Hp, Dp] tile are real."""
  head_ok = jnp.arange(padded_heads) < heads
  feat_ok = jnp.arange(padded_dim) < dim
  return head_ok, feat_ok, head_ok[:, None] & feat_ok[None, :]


def _forward_kernel(sink_ref, q_ref, mem_ref, out_ref, lse_ref, *, scale, n_tokens,
                    heads, routes, dim, block_n, block_r):
  """One program: `block_n` tokens. q, out: [block_n, Hp, Dp]; mem: [block_n, Rp, Dp].

  sink_ref: [Hp], b0 repeated (an input, so b0 may be a traced value).
  """
  padded_heads, padded_dim = q_ref.shape[1:]
  first = pl.program_id(0) * block_n
  head_ok, feat_ok, tile_ok = _tile_masks(
      heads=heads, dim=dim, padded_heads=padded_heads, padded_dim=padded_dim)

  def token(t, carry):
    token_ok = first + t < n_tokens
    q_HxDr = plgpu.load(q_ref.at[t], mask=tile_ok & token_ok, other=0.0)

    def route_block(j, state):
      m_H, l_H, acc_HxDr = state
      row_ok = j * block_r + jnp.arange(block_r) < routes
      mem_RxDr = plgpu.load(mem_ref.at[t, pl.ds(j * block_r, block_r), :],
                           mask=row_ok[:, None] & feat_ok[None, :] & token_ok, other=0.0)
      s_HxR = _dot(q_HxDr, mem_RxDr, _NT) * scale
      s_HxR = jnp.where(row_ok[None, :], s_HxR, MASK_VALUE)
      m_new = jnp.maximum(m_H, jnp.max(s_HxR, axis=1))
      correction = jnp.exp(m_H - m_new)
      p_HxR = jnp.exp(s_HxR - m_new[:, None])
      l_new = l_H * correction + jnp.sum(p_HxR, axis=1)
      acc_new = acc_HxDr * correction[:, None] + _dot(p_HxR.astype(mem_RxDr.dtype), mem_RxDr)
      return m_new, l_new, acc_new

    init = (sink_ref[...],
            jnp.ones((padded_heads,), jnp.float32),
            jnp.zeros((padded_heads, padded_dim), jnp.float32))
    m_H, l_H, acc_HxDr = lax.fori_loop(0, pl.cdiv(routes, block_r), route_block, init)
    # l >= 1: the largest term of the sum (sink or route) is exp(0).
    plgpu.store(out_ref.at[t], (acc_HxDr / l_H[:, None]).astype(out_ref.dtype),
                mask=tile_ok & token_ok)
    plgpu.store(lse_ref.at[t], m_H + jnp.log(l_H), mask=head_ok & token_ok)
    return carry

  lax.fori_loop(0, block_n, token, None)


def _backward_kernel(q_ref, mem_ref, out_ref, lse_ref, dout_ref, dlse_ref, dq_ref, dmem_ref,
                     *, scale, n_tokens, heads, routes, dim, block_n, block_r):
  padded_heads, padded_dim = q_ref.shape[1:]
  first = pl.program_id(0) * block_n
  head_ok, feat_ok, tile_ok = _tile_masks(
      heads=heads, dim=dim, padded_heads=padded_heads, padded_dim=padded_dim)

  def token(t, carry):
    token_ok = first + t < n_tokens
    q_HxDr = plgpu.load(q_ref.at[t], mask=tile_ok & token_ok, other=0.0)
    dout_HxDr = plgpu.load(dout_ref.at[t], mask=tile_ok & token_ok, other=0.0)
    out_HxDr = plgpu.load(out_ref.at[t], mask=tile_ok & token_ok, other=0.0)
    lse_H = plgpu.load(lse_ref.at[t], mask=head_ok & token_ok, other=0.0)
    dlse_H = plgpu.load(dlse_ref.at[t], mask=head_ok & token_ok, other=0.0)
    # ds = p·(dp - delta + dlse): fold the per-head constants once.
    delta_H = jnp.sum(out_HxDr.astype(jnp.float32) * dout_HxDr.astype(jnp.float32), axis=1)
    shift_H = dlse_H - delta_H

    def route_block(j, dq_HxDr):
      row_ok = j * block_r + jnp.arange(block_r) < routes
      mem_tile_ok = row_ok[:, None] & feat_ok[None, :] & token_ok
      mem_rows = pl.ds(j * block_r, block_r)
      mem_RxDr = plgpu.load(mem_ref.at[t, mem_rows, :], mask=mem_tile_ok, other=0.0)
      s_HxR = _dot(q_HxDr, mem_RxDr, _NT) * scale
      p_HxR = jnp.exp(s_HxR - lse_H[:, None])
      p_HxR = jnp.where(head_ok[:, None] & row_ok[None, :], p_HxR, 0.0)
      dp_HxR = _dot(dout_HxDr, mem_RxDr, _NT)
      ds_HxR = p_HxR * (dp_HxR + shift_H[:, None])
      dmem_RxDr = (_dot(p_HxR.astype(dout_HxDr.dtype), dout_HxDr, _TN)
                  + scale * _dot(ds_HxR.astype(q_HxDr.dtype), q_HxDr, _TN))
      plgpu.store(dmem_ref.at[t, mem_rows, :], dmem_RxDr.astype(dmem_ref.dtype),
                  mask=mem_tile_ok)
      return dq_HxDr + _dot(ds_HxR.astype(mem_RxDr.dtype), mem_RxDr)

    dq_HxDr = lax.fori_loop(0, pl.cdiv(routes, block_r), route_block,
                           jnp.zeros((padded_heads, padded_dim), jnp.float32))
    plgpu.store(dq_ref.at[t], (scale * dq_HxDr).astype(dq_ref.dtype), mask=tile_ok & token_ok)
    return carry

  lax.fori_loop(0, block_n, token, None)


def compiler_params(num_warps, num_stages, padded_dim):
  """Triton's launch parameters; num_warps None: 4 up to 256 padded features, else 8."""
  if num_warps is None:
    num_warps = 4 if padded_dim <= 256 else 8
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def tile_specs(BT, Hq, R, Dr, block_n, block_r):
  """Block specs over token blocks; tiles padded for Triton, masked in the kernel.
  (grid, heads, routes, stats, padded heads, padded features)."""
  hp, dp = triton_pad(Hq), triton_pad(Dr)
  rp = pl.cdiv(R, block_r) * block_r
  heads = pl.BlockSpec((block_n, hp, dp), lambda i: (i, 0, 0))
  routes = pl.BlockSpec((block_n, rp, dp), lambda i: (i, 0, 0))
  stats = pl.BlockSpec((block_n, hp), lambda i: (i, 0))
  return (pl.cdiv(BT, block_n),), heads, routes, stats, hp, dp


def _bind(kernel_fn, q_BTxHqxDr, mem_BTxRxDr, *, scale, block_n, block_r):
  BT, Hq, Dr = q_BTxHqxDr.shape
  return functools.partial(kernel_fn, scale=float(scale), n_tokens=BT, heads=Hq,
                           routes=mem_BTxRxDr.shape[1], dim=Dr, block_n=block_n,
                           block_r=block_r)


def launch_forward(kernel_fn, name, q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, sink_rows,
                   scale, block_n, block_r, num_warps, num_stages, interpret):
  """(out_BTxHqxDr, lse_BTxHq) of a forward kernel over `tile_specs`' grid. Its first
  input is the sink logit repeated over sink_rows x padded heads (float32)."""
  BT, Hq, Dr = q_BTxHqxDr.shape
  grid, heads, routes, stats, hp, dp = tile_specs(BT, Hq, mem_BTxRxDr.shape[1], Dr, block_n,
                                                  block_r)
  sink = jnp.full((sink_rows * hp,), sink_logit, jnp.float32)
  return pl.pallas_call(
      _bind(kernel_fn, q_BTxHqxDr, mem_BTxRxDr, scale=scale, block_n=block_n,
            block_r=block_r),
      grid=grid,
      in_specs=[pl.BlockSpec((sink_rows * hp,), lambda i: (0,)), heads, routes],
      out_specs=[heads, stats],
      out_shape=[like(q_BTxHqxDr, q_BTxHqxDr.shape, q_BTxHqxDr.dtype),
                 like(q_BTxHqxDr, (BT, Hq), jnp.float32)],
      compiler_params=compiler_params(num_warps, num_stages, dp),
      interpret=interpret,
      name=name,
  )(sink, q_BTxHqxDr, mem_BTxRxDr)


def launch_backward(kernel_fn, name, q_BTxHqxDr, mem_BTxRxDr, out_BTxHqxDr, lse_BTxHq,
                    dout_BTxHqxDr, dlse_BTxHq, *, scale, block_n, block_r, num_warps,
                    num_stages, interpret):
  """(dq_BTxHqxDr, dmem_BTxRxDr) of a backward kernel over `tile_specs`' grid."""
  BT, Hq, Dr = q_BTxHqxDr.shape
  grid, heads, routes, stats, _, dp = tile_specs(BT, Hq, mem_BTxRxDr.shape[1], Dr, block_n,
                                                 block_r)
  return pl.pallas_call(
      _bind(kernel_fn, q_BTxHqxDr, mem_BTxRxDr, scale=scale, block_n=block_n,
            block_r=block_r),
      grid=grid,
      in_specs=[heads, routes, heads, stats, heads, stats],
      out_specs=[heads, routes],
      out_shape=[like(q_BTxHqxDr, q_BTxHqxDr.shape, q_BTxHqxDr.dtype),
                 like(mem_BTxRxDr, mem_BTxRxDr.shape, mem_BTxRxDr.dtype)],
      compiler_params=compiler_params(num_warps, num_stages, dp),
      interpret=interpret,
      name=name,
  )(q_BTxHqxDr, mem_BTxRxDr, out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr,
    dlse_BTxHq.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=(
    "scale", "block_n", "block_r", "num_warps", "num_stages", "interpret"))
def forward(q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, scale, block_n, block_r,
            num_warps=None, num_stages=2, interpret=False):
  """(out_BTxHqxDr, lse_BTxHq) by the Triton forward kernel. No input checks here.

  sink_logit may be a Python float or a traced float32 scalar.
  """
  return launch_forward(_forward_kernel, "sink_readout_fwd", q_BTxHqxDr, mem_BTxRxDr,
                        sink_logit=sink_logit, sink_rows=1, scale=scale, block_n=block_n,
                        block_r=block_r, num_warps=num_warps, num_stages=num_stages,
                        interpret=interpret)


@functools.partial(jax.jit, static_argnames=(
    "scale", "block_n", "block_r", "num_warps", "num_stages", "interpret"))
def backward(q_BTxHqxDr, mem_BTxRxDr, out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr, dlse_BTxHq, *,
             scale, block_n, block_r, num_warps=None, num_stages=2, interpret=False):
  """(dq_BTxHqxDr, dmem_BTxRxDr) by the Triton backward kernel."""
  return launch_backward(_backward_kernel, "sink_readout_bwd", q_BTxHqxDr, mem_BTxRxDr,
                         out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr, dlse_BTxHq, scale=scale,
                         block_n=block_n, block_r=block_r, num_warps=num_warps,
                         num_stages=num_stages, interpret=interpret)
