"""Fused lookup + RMSNorm + sink readout as Pallas kernels for GPU (Triton lowering).

Per token, per route block, for each order o the kernel gathers the table rows
E_o[rows_o] itself (a pointer gather: the table ref indexed by a vector of row
ids, which Triton lowers; `jnp.take` in a kernel would not lower), rounds them
to the activation dtype as the unfused layer does, normalises the route tokens
x = concat_o E_o[rows_o] with RMSNorm (float32 statistics over all Dr = O·Dm
features), and runs the online sink softmax of `triton_gpu` on x̂. The route
token x and its normalised x̂ never exist in HBM.

Rows are passed per order with -1 marking an invalid window: such a route
token is zero (it stays in the softmax with k = v = 0, as in the unfused layer).
Features are handled per order, [Hq, Dm] and [block_r, Dm] tiles, so no
concatenation or slicing of tiles is needed inside the kernel.

Backward (per token, route block): recompute x, x̂; p, dp, ds as in
`triton_gpu`; dx̂ = pᵀ·dout + scale·dsᵀ·q; through the RMSNorm,
    dγ += Σ_rows dx̂ ⊙ x·r,   dx = r·(γ⊙dx̂) - x·r³·Σ_D(x⊙γ⊙dx̂)/Dr,
with r = rsqrt(mean(x²) + eps). dx is written per order ([BT, R, Dm] in the
activation dtype): it is the cotangent of each order's retrieved vector,
which the table scatter-add and the router's surrogate gradient consume
(`lngram_jax.fused`). dγ leaves as one partial sum per program.

The kernels are generic: row ids, tables, a norm scale and queries; what the
rows mean (n-gram addresses) and the gradients behind them live in the model
package. `fused_reference` is the XLA twin of the forward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.out_shapes import like
from kernels.sink_readout.common import MASK_VALUE, BlockSizes, triton_pad
from kernels.sink_readout.triton_gpu import _NT, _TN, _dot, compiler_params


class _Tiles:
  """Static sizes and masks shared by the forward and backward kernels."""

  def __init__(self, *, heads, padded_heads, mem_dim, n_orders, routes, block_r):
    self.mem_dim, self.n_orders, self.routes, self.block_r = mem_dim, n_orders, routes, block_r
    self.dim = n_orders * mem_dim
    self.cols = triton_pad(mem_dim)
    self.head_ok = jnp.arange(padded_heads) < heads
    self.col_ok = jnp.arange(self.cols) < mem_dim
    self.tile_ok = self.head_ok[:, None] & self.col_ok[None, :]

  def features(self, o):
    """Columns of order o inside the Dr features (padded tile, masked)."""
    return pl.ds(o * self.mem_dim, self.cols)

  def load_heads(self, ref, t, o, token_ok):
    return plgpu.load(ref.at[t, :, self.features(o)], mask=self.tile_ok & token_ok, other=0.0)

  def route_tokens(self, table_refs, rows_refs, t, j, token_ok, act_dtype):
    """Which rows of the block are real, and x_o per order (float32 values of act_dtype)."""
    row_ok = (j * self.block_r + jnp.arange(self.block_r) < self.routes) & token_ok
    xs = []
    for table_ref, rows_ref in zip(table_refs, rows_refs, strict=True):
      rows_R = plgpu.load(rows_ref.at[t, pl.ds(j * self.block_r, self.block_r)],
                          mask=row_ok, other=-1)
      ok = (row_ok & (rows_R >= 0))[:, None] & self.col_ok[None, :]
      x_RxC = plgpu.load(table_ref.at[rows_R[:, None], jnp.arange(self.cols)[None, :]],
                         mask=ok, other=0.0)
      xs.append(x_RxC.astype(act_dtype).astype(jnp.float32))
    return row_ok, xs

  def normalise(self, xs, gammas, eps, act_dtype):
    """r = rsqrt(mean_D x² + eps) per row and x̂_o = (x_o·r·γ_o) in act_dtype."""
    sum_sq_R = sum(jnp.sum(x * x, axis=1) for x in xs)
    inv_R = lax.rsqrt(sum_sq_R / self.dim + eps)
    xhat = [(x * inv_R[:, None] * g[None, :]).astype(act_dtype) for x, g in zip(xs, gammas,
                                                                                 strict=True)]
    return inv_R, xhat

  def gammas(self, norm_ref):
    return [plgpu.load(norm_ref.at[self.features(o)], mask=self.col_ok, other=0.0)
            for o in range(self.n_orders)]


def _forward_kernel(sink_ref, q_ref, norm_ref, *refs, scale, eps, n_tokens, heads, routes,
                    mem_dim, n_orders, block_n, block_r, act_dtype):
  table_refs, rows_refs = refs[:n_orders], refs[n_orders:2 * n_orders]
  out_ref, lse_ref = refs[2 * n_orders:]
  padded_heads = sink_ref.shape[0]
  tiles = _Tiles(heads=heads, padded_heads=padded_heads, mem_dim=mem_dim, n_orders=n_orders,
                 routes=routes, block_r=block_r)
  gammas = tiles.gammas(norm_ref)
  first = pl.program_id(0) * block_n

  def token(t, carry):
    token_ok = first + t < n_tokens
    qs = [tiles.load_heads(q_ref, t, o, token_ok) for o in range(n_orders)]

    def route_block(j, state):
      m_H, l_H, accs = state
      row_ok, xs = tiles.route_tokens(table_refs, rows_refs, t, j, token_ok, act_dtype)
      _, xhat = tiles.normalise(xs, gammas, eps, act_dtype)
      s_HxR = sum(_dot(q, x, _NT) for q, x in zip(qs, xhat, strict=True)) * scale
      s_HxR = jnp.where(row_ok[None, :], s_HxR, MASK_VALUE)
      m_new = jnp.maximum(m_H, jnp.max(s_HxR, axis=1))
      correction = jnp.exp(m_H - m_new)
      p_HxR = jnp.exp(s_HxR - m_new[:, None])
      l_new = l_H * correction + jnp.sum(p_HxR, axis=1)
      p_HxR = p_HxR.astype(act_dtype)
      accs = tuple(acc * correction[:, None] + _dot(p_HxR, x)
                   for acc, x in zip(accs, xhat, strict=True))
      return m_new, l_new, accs

    init = (sink_ref[...], jnp.ones((padded_heads,), jnp.float32),
            tuple(jnp.zeros((padded_heads, tiles.cols), jnp.float32) for _ in range(n_orders)))
    m_H, l_H, accs = lax.fori_loop(0, pl.cdiv(routes, block_r), route_block, init)
    for o, acc in enumerate(accs):
      plgpu.store(out_ref.at[t, :, tiles.features(o)],
                  (acc / l_H[:, None]).astype(out_ref.dtype), mask=tiles.tile_ok & token_ok)
    plgpu.store(lse_ref.at[t], m_H + jnp.log(l_H), mask=tiles.head_ok & token_ok)
    return carry

  lax.fori_loop(0, block_n, token, None)


def _backward_kernel(q_ref, norm_ref, out_ref, lse_ref, dout_ref, dlse_ref, *refs, scale, eps,
                     n_tokens, heads, routes, mem_dim, n_orders, block_n, block_r, act_dtype):
  table_refs, rows_refs = refs[:n_orders], refs[n_orders:2 * n_orders]
  dq_ref, dnorm_ref = refs[2 * n_orders], refs[-1]
  dx_refs = refs[2 * n_orders + 1:-1]
  padded_heads = lse_ref.shape[1]
  tiles = _Tiles(heads=heads, padded_heads=padded_heads, mem_dim=mem_dim, n_orders=n_orders,
                 routes=routes, block_r=block_r)
  gammas = tiles.gammas(norm_ref)
  first = pl.program_id(0) * block_n

  def token(t, dgammas):
    token_ok = first + t < n_tokens
    head_mask = tiles.head_ok & token_ok
    qs = [tiles.load_heads(q_ref, t, o, token_ok) for o in range(n_orders)]
    douts = [tiles.load_heads(dout_ref, t, o, token_ok) for o in range(n_orders)]
    delta_H = sum(jnp.sum(tiles.load_heads(out_ref, t, o, token_ok).astype(jnp.float32)
                          * d.astype(jnp.float32), axis=1) for o, d in enumerate(douts))
    lse_H = plgpu.load(lse_ref.at[t], mask=head_mask, other=0.0)
    shift_H = plgpu.load(dlse_ref.at[t], mask=head_mask, other=0.0) - delta_H

    def route_block(j, state):
      dqs, dgammas = state
      row_ok, xs = tiles.route_tokens(table_refs, rows_refs, t, j, token_ok, act_dtype)
      inv_R, xhat = tiles.normalise(xs, gammas, eps, act_dtype)
      s_HxR = sum(_dot(q, x, _NT) for q, x in zip(qs, xhat, strict=True)) * scale
      p_HxR = jnp.exp(s_HxR - lse_H[:, None])
      p_HxR = jnp.where(tiles.head_ok[:, None] & row_ok[None, :], p_HxR, 0.0)
      dp_HxR = sum(_dot(d, x, _NT) for d, x in zip(douts, xhat, strict=True))
      ds_HxR = p_HxR * (dp_HxR + shift_H[:, None])
      p_act, ds_act = p_HxR.astype(act_dtype), ds_HxR.astype(act_dtype)
      dqs = tuple(dq + _dot(ds_act, x) for dq, x in zip(dqs, xhat, strict=True))
      # dx̂ rounds to the activation dtype, as x̂'s cotangent does in the unfused layer.
      dxhat = [(_dot(p_act, d, _TN) + scale * _dot(ds_act, q, _TN)
                ).astype(act_dtype).astype(jnp.float32) for d, q in zip(douts, qs, strict=True)]
      dgammas = tuple(dg + jnp.sum(dxh * x * inv_R[:, None], axis=0)
                      for dg, dxh, x in zip(dgammas, dxhat, xs, strict=True))
      ys = [dxh * g[None, :] for dxh, g in zip(dxhat, gammas, strict=True)]
      xy_R = sum(jnp.sum(x * y, axis=1) for x, y in zip(xs, ys, strict=True))
      coef_R = inv_R * inv_R * inv_R * xy_R / tiles.dim
      rows = pl.ds(j * block_r, block_r)
      for dx_ref, x, y in zip(dx_refs, xs, ys, strict=True):
        dx_RxC = inv_R[:, None] * y - x * coef_R[:, None]
        plgpu.store(dx_ref.at[t, rows, pl.ds(0, tiles.cols)], dx_RxC.astype(dx_ref.dtype),
                    mask=row_ok[:, None] & tiles.col_ok[None, :])
      return dqs, dgammas

    zeros = tuple(jnp.zeros((padded_heads, tiles.cols), jnp.float32) for _ in range(n_orders))
    dqs, dgammas = lax.fori_loop(0, pl.cdiv(routes, block_r), route_block, (zeros, dgammas))
    for o, dq in enumerate(dqs):
      plgpu.store(dq_ref.at[t, :, tiles.features(o)], (scale * dq).astype(dq_ref.dtype),
                  mask=tiles.tile_ok & token_ok)
    return dgammas

  dgammas = lax.fori_loop(0, block_n, token, tuple(
      jnp.zeros((tiles.cols,), jnp.float32) for _ in range(n_orders)))
  for o, dg in enumerate(dgammas):
    plgpu.store(dnorm_ref.at[tiles.features(o)], dg, mask=tiles.col_ok)


def _specs(BT, Hq, R, Dm, n_orders, tables, block_n, block_r):
  hp, cp = triton_pad(Hq), triton_pad(Dm)
  dp = (n_orders - 1) * Dm + cp  # the last order's padded tile must fit the block
  rp = pl.cdiv(R, block_r) * block_r
  grid = (pl.cdiv(BT, block_n),)
  heads = pl.BlockSpec((block_n, hp, dp), lambda i: (i, 0, 0))
  stats = pl.BlockSpec((block_n, hp), lambda i: (i, 0))
  rows = pl.BlockSpec((block_n, rp), lambda i: (i, 0))
  norm = pl.BlockSpec((dp,), lambda i: (0,))
  whole = [pl.BlockSpec(t.shape, lambda i: (0, 0)) for t in tables]
  return grid, hp, cp, dp, heads, stats, rows, norm, whole


@functools.partial(jax.jit, static_argnames=("scale", "eps", "blocks", "interpret"))
def forward(q_BTxHqxDr, tables, rows, norm_scale_Dr, sink_logit, *, scale: float, eps: float,
            blocks: BlockSizes, interpret: bool = False):
  """(out_BTxHqxDr, lse_BTxHq) of the sink readout over x̂ = RMSNorm(concat_o E_o[rows_o]).

  Args:
    q_BTxHqxDr: queries in the route-token space (Dr = |tables|·Dm).
    tables: one [V_o, Dm] table per order (any row counts).
    rows: one int32 [BT, R] per table, -1 = an invalid window (reads zero).
    norm_scale_Dr: the RMSNorm scale γ.
    sink_logit: b0 (may be traced).
    scale, eps: score scale and RMSNorm epsilon (compiled in).
    blocks: tiles (`block_n`, `block_r`, `num_warps`, `num_stages`).
    interpret: run in interpret mode (CPU).
  """
  block_n, block_r = blocks.block_n, blocks.block_r
  num_warps, num_stages = blocks.num_warps, blocks.num_stages
  BT, Hq, Dr = q_BTxHqxDr.shape
  n_orders, R = len(tables), rows[0].shape[1]
  Dm = tables[0].shape[1]
  grid, hp, _, dp, heads, stats, row_spec, norm, whole = _specs(
      BT, Hq, R, Dm, n_orders, tables, block_n, block_r)
  kernel = functools.partial(
      _forward_kernel, scale=float(scale), eps=float(eps), n_tokens=BT, heads=Hq, routes=R,
      mem_dim=Dm, n_orders=n_orders, block_n=block_n, block_r=block_r,
      act_dtype=q_BTxHqxDr.dtype)
  return pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[pl.BlockSpec((hp,), lambda i: (0,)), heads, norm, *whole,
                *[row_spec] * n_orders],
      out_specs=[heads, stats],
      out_shape=[like(q_BTxHqxDr, q_BTxHqxDr.shape, q_BTxHqxDr.dtype),
                 like(q_BTxHqxDr, (BT, Hq), jnp.float32)],
      compiler_params=compiler_params(num_warps, num_stages, dp),
      interpret=interpret,
      name="fused_sink_readout_fwd",
  )(jnp.full((hp,), sink_logit, jnp.float32), q_BTxHqxDr, norm_scale_Dr.astype(jnp.float32),
    *tables, *rows)


@functools.partial(jax.jit, static_argnames=("scale", "eps", "blocks", "interpret"))
def backward(q_BTxHqxDr, tables, rows, norm_scale_Dr, out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr,
             dlse_BTxHq, *, scale: float, eps: float, blocks: BlockSizes, interpret: bool = False):
  """(dq_BTxHqxDr, [dx_BTxRxDm per order], d_norm_scale_Dr), with the backward tiles of `blocks`.

  dx is the cotangent of each order's gathered rows E_o[rows_o] (zero at -1 rows
  is the caller's to apply); the caller turns it into table gradients.
  """
  block_n, block_r = blocks.bwd_n, blocks.bwd_r
  num_warps, num_stages = blocks.num_warps, blocks.num_stages
  BT, Hq, Dr = q_BTxHqxDr.shape
  n_orders, R = len(tables), rows[0].shape[1]
  Dm = tables[0].shape[1]
  grid, hp, cp, dp, heads, stats, row_spec, norm, whole = _specs(
      BT, Hq, R, Dm, n_orders, tables, block_n, block_r)
  rp = row_spec.block_shape[1]
  kernel = functools.partial(
      _backward_kernel, scale=float(scale), eps=float(eps), n_tokens=BT, heads=Hq, routes=R,
      mem_dim=Dm, n_orders=n_orders, block_n=block_n, block_r=block_r,
      act_dtype=q_BTxHqxDr.dtype)
  dx_spec = pl.BlockSpec((block_n, rp, cp), lambda i: (i, 0, 0))
  outs = pl.pallas_call(
      kernel,
      grid=grid,
      in_specs=[heads, norm, heads, stats, heads, stats, *whole, *[row_spec] * n_orders],
      out_specs=[heads, *[dx_spec] * n_orders, pl.BlockSpec((None, dp), lambda i: (i, 0))],
      out_shape=[like(q_BTxHqxDr, q_BTxHqxDr.shape, q_BTxHqxDr.dtype),
                 *[like(q_BTxHqxDr, (BT, R, Dm), q_BTxHqxDr.dtype)] * n_orders,
                 like(q_BTxHqxDr, (grid[0], Dr), jnp.float32)],
      compiler_params=compiler_params(num_warps, num_stages, dp),
      interpret=interpret,
      name="fused_sink_readout_bwd",
  )(q_BTxHqxDr, norm_scale_Dr.astype(jnp.float32), out_BTxHqxDr, lse_BTxHq, dout_BTxHqxDr,
    dlse_BTxHq.astype(jnp.float32), *tables, *rows)
  dq, dxs, dnorm_partial = outs[0], outs[1:-1], outs[-1]
  return dq, list(dxs), jnp.sum(dnorm_partial, axis=0)
