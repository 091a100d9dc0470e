"""The sink readout for GPU (Triton) with a token block in every dot: small R.

`triton_gpu` walks a program's tokens one after another, one
[Hp, Dp]·[Dp, block_r] dot per token and route block. At R = 64 that dot is
16 x 256 x 64: the program's fixed cost (loads of q, the softmax epilogue,
the stores of out and lse, each a short dependent chain) dominates, and the
forward runs at ~4x the memory floor against ~1.6x at R = 121 and 512
(BENCHMARKS.md, "Pallas sink readout").

Layout (`BlockSizes(layout="token_block")`): a program owns `block_n` tokens
and handles them together. Their heads are stacked on the M side of one dot
and their route blocks on the N side,

    q2   [block_n·Hp, Dp]       rows (token t, head h) at t·Hp + h,
    mem2 [block_n·block_r, Dp]  rows (token t, route r) at t·block_r + r,
    s    = scale·q2·mem2ᵀ       [block_n·Hp, block_n·block_r],

so s is block diagonal: the (t, t') tile is token t's heads against token t''s
routes, and only t = t' is a score. The off-diagonal tiles (and routes past R)
are masked to MASK_VALUE before the online softmax, so their p is exactly 0
and p·mem2 sums each token's own routes only; in the backward pᵀ·dout and
dsᵀ·q2 likewise give each token's dmem rows its own heads only. The loads are
3-D tiles [block_n, Hp, Dp] and [block_n, block_r, Dp] reshaped to 2-D (all
sides are powers of 2, so the reshape is free). Pallas' Triton lowering has
no batched dot, which would avoid the waste.

Cost: the dots do block_n times the useful multiply-adds (the readout is
memory bound: at R = 64, D = 256, block_n = 2 the extra work is ~9 GFLOP
over 8192 tokens), in exchange for block_n times fewer programs and M, N
block_n times larger. Everything else (the sink as the softmax's initial state
(max = b0, sum = 1, acc = 0), float32 statistics, masked loads and stores of
padded heads, features, routes and tokens, delta in the backward's prologue,
dmem written once per tile) is as in `triton_gpu`, whose module docstring
gives the backward's maths.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.sink_readout.common import MASK_VALUE
from kernels.sink_readout.triton_gpu import _NT, _TN, _dot, launch_backward, launch_forward


class _Block:
  """Masks of one program's token block, stacked as in the module docstring."""

  def __init__(self, *, n_tokens, heads, routes, dim, padded_heads, padded_dim, block_n,
               block_r):
    self.shape_q = (block_n, padded_heads, padded_dim)
    self.rows = block_n * padded_heads
    self.block_r, self.routes = block_r, routes
    token_ok_N = pl.program_id(0) * block_n + jnp.arange(block_n) < n_tokens
    head_ok_H = jnp.arange(padded_heads) < heads
    self.feat_ok_D = jnp.arange(padded_dim) < dim
    self.stat_ok_NxH = token_ok_N[:, None] & head_ok_H[None, :]
    self.tile_ok_NxHxD = self.stat_ok_NxH[:, :, None] & self.feat_ok_D[None, None, :]
    self.token_ok_N = token_ok_N
    # Which (token, head) row meets which (token, route) column of s.
    self.row_token = jnp.arange(self.rows) // padded_heads
    self.col_token = jnp.arange(block_n * block_r) // block_r
    self.col_route = jnp.arange(block_n * block_r) % block_r
    self.head_ok_rows = jnp.arange(self.rows) % padded_heads < heads

  def load_heads(self, ref):
    """A [block_n, Hp, Dp] tile as q2 [block_n·Hp, Dp]."""
    return plgpu.load(ref, mask=self.tile_ok_NxHxD, other=0.0).reshape(self.rows, -1)

  def load_stats(self, ref):
    return plgpu.load(ref, mask=self.stat_ok_NxH, other=0.0).reshape(self.rows)

  def store_heads(self, ref, x_rowsxD):
    plgpu.store(ref, x_rowsxD.reshape(self.shape_q).astype(ref.dtype), mask=self.tile_ok_NxHxD)

  def store_stats(self, ref, x_rows):
    plgpu.store(ref, x_rows.reshape(self.shape_q[:2]), mask=self.stat_ok_NxH)

  def route_tile(self, j):
    """The rows of route block j: its slice, the 3-D load mask, and where s is a score."""
    rows = pl.ds(j * self.block_r, self.block_r)
    route_ok_R = j * self.block_r + jnp.arange(self.block_r) < self.routes
    mem_ok = (self.token_ok_N[:, None, None] & route_ok_R[None, :, None]
              & self.feat_ok_D[None, None, :])
    col_ok = j * self.block_r + self.col_route < self.routes
    score_ok = (self.row_token[:, None] == self.col_token[None, :]) & col_ok[None, :]
    return rows, mem_ok, score_ok

  def load_routes(self, ref, mem_ok):
    return plgpu.load(ref, mask=mem_ok, other=0.0).reshape(
        self.shape_q[0] * self.block_r, -1)


def _forward_kernel(sink_ref, q_ref, mem_ref, out_ref, lse_ref, *, scale, n_tokens, heads,
                    routes, dim, block_n, block_r):
  """One program: `block_n` tokens. q, out: [block_n, Hp, Dp]; mem: [block_n, Rp, Dp].

  sink_ref: [block_n·Hp], b0 repeated (an input, so b0 may be a traced value).
  """
  padded_heads, padded_dim = q_ref.shape[1:]
  blk = _Block(n_tokens=n_tokens, heads=heads, routes=routes, dim=dim,
               padded_heads=padded_heads, padded_dim=padded_dim, block_n=block_n,
               block_r=block_r)
  q2 = blk.load_heads(q_ref)

  def route_block(j, state):
    m_M, l_M, acc_MxD = state
    rows, mem_ok, score_ok = blk.route_tile(j)
    mem2 = blk.load_routes(mem_ref.at[:, rows, :], mem_ok)
    s_MxC = jnp.where(score_ok, _dot(q2, mem2, _NT) * scale, MASK_VALUE)
    m_new = jnp.maximum(m_M, jnp.max(s_MxC, axis=1))
    correction = jnp.exp(m_M - m_new)
    p_MxC = jnp.exp(s_MxC - m_new[:, None])  # exactly 0 off the token's own routes
    l_new = l_M * correction + jnp.sum(p_MxC, axis=1)
    acc_new = acc_MxD * correction[:, None] + _dot(p_MxC.astype(mem2.dtype), mem2)
    return m_new, l_new, acc_new

  init = (sink_ref[...], jnp.ones((blk.rows,), jnp.float32),
          jnp.zeros((blk.rows, padded_dim), jnp.float32))
  m_M, l_M, acc_MxD = lax.fori_loop(0, pl.cdiv(routes, block_r), route_block, init)
  blk.store_heads(out_ref, acc_MxD / l_M[:, None])  # l >= 1, as in triton_gpu
  blk.store_stats(lse_ref, m_M + jnp.log(l_M))


def _backward_kernel(q_ref, mem_ref, out_ref, lse_ref, dout_ref, dlse_ref, dq_ref, dmem_ref,
                     *, scale, n_tokens, heads, routes, dim, block_n, block_r):
  padded_heads, padded_dim = q_ref.shape[1:]
  blk = _Block(n_tokens=n_tokens, heads=heads, routes=routes, dim=dim,
               padded_heads=padded_heads, padded_dim=padded_dim, block_n=block_n,
               block_r=block_r)
  q2, dout2 = blk.load_heads(q_ref), blk.load_heads(dout_ref)
  out2 = blk.load_heads(out_ref)
  lse_M, dlse_M = blk.load_stats(lse_ref), blk.load_stats(dlse_ref)
  delta_M = jnp.sum(out2.astype(jnp.float32) * dout2.astype(jnp.float32), axis=1)
  shift_M = dlse_M - delta_M

  def route_block(j, dq_MxD):
    rows, mem_ok, score_ok = blk.route_tile(j)
    mem2 = blk.load_routes(mem_ref.at[:, rows, :], mem_ok)
    s_MxC = _dot(q2, mem2, _NT) * scale
    # Padded heads have q = 0 and lse = 0, so their p would be 1: mask them too.
    p_MxC = jnp.where(score_ok & blk.head_ok_rows[:, None], jnp.exp(s_MxC - lse_M[:, None]),
                      0.0)
    ds_MxC = p_MxC * (_dot(dout2, mem2, _NT) + shift_M[:, None])
    dmem2 = (_dot(p_MxC.astype(dout2.dtype), dout2, _TN)
             + scale * _dot(ds_MxC.astype(q2.dtype), q2, _TN))
    plgpu.store(dmem_ref.at[:, rows, :],
                dmem2.reshape(block_n, block_r, padded_dim).astype(dmem_ref.dtype),
                mask=mem_ok)
    return dq_MxD + _dot(ds_MxC.astype(mem2.dtype), mem2)

  dq_MxD = lax.fori_loop(0, pl.cdiv(routes, block_r), route_block,
                         jnp.zeros((blk.rows, padded_dim), jnp.float32))
  blk.store_heads(dq_ref, scale * dq_MxD)


@functools.partial(jax.jit, static_argnames=(
    "scale", "block_n", "block_r", "num_warps", "num_stages", "interpret"))
def forward(q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, scale, block_n, block_r,
            num_warps=None, num_stages=2, interpret=False):
  """(out_BTxHqxDr, lse_BTxHq), as `triton_gpu.forward` (block_n a power of 2 here: it is
  a tile side; the sink comes in one row per token of the block). No input checks here."""
  return launch_forward(_forward_kernel, "sink_readout_token_block_fwd", q_BTxHqxDr,
                        mem_BTxRxDr, sink_logit=sink_logit, sink_rows=block_n, scale=scale,
                        block_n=block_n, block_r=block_r, num_warps=num_warps,
                        num_stages=num_stages, interpret=interpret)


@functools.partial(jax.jit, static_argnames=(
    "scale", "block_n", "block_r", "num_warps", "num_stages", "interpret"))
def backward(q_BTxHqxDr, mem_BTxRxDr, out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr, dlse_BTxHq, *,
             scale, block_n, block_r, num_warps=None, num_stages=2, interpret=False):
  """(dq_BTxHqxDr, dmem_BTxRxDr), as `triton_gpu.backward`."""
  return launch_backward(_backward_kernel, "sink_readout_token_block_bwd", q_BTxHqxDr,
                         mem_BTxRxDr, out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr, dlse_BTxHq,
                         scale=scale, block_n=block_n, block_r=block_r,
                         num_warps=num_warps, num_stages=num_stages, interpret=interpret)
