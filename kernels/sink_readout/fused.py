"""The Lngram readout with the table lookup and the memory norm fused into the kernel.

    o, lse = fused_readout(q, logits, tables, mem_norm, w_k, w_v, orders=..., ...)

equals, in values and in every gradient (tables, router logits through the
counterfactual surrogate, memory-norm scale, W_K, W_V, q, b0),

    x = concat_n ngram_lookup(E_n, logits, ...)            [B, T, R, D]
    o, lse = absorbed_readout(q, rms_norm(x.astype(dtype), mem_norm), W_K, W_V)

(`fused_readout_reference`, which is what `LngramV2` computes), but the route
tokens x and x̂ are never written to HBM: the kernel gathers the table rows
itself (`fused_triton.py`). The backward kernel writes the cotangent of each
order's retrieved vector, g_n = ∂L/∂m^(n) [B, T, R, d_m]; from it XLA forms
the table cotangent (scatter-add) and the router's surrogate gradient with the
same functions `ngram_lookup`'s own custom_vjp uses, so the surrogate path is
unchanged.

GPU (Triton) and CPU (the Triton kernels in interpret mode) only: there is no
Mosaic (TPU) version of the fused gather.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from kernels.sink_readout import fused_triton
from kernels.sink_readout.common import BlockSizes, check_triton_blocks, sink_logit_cotangent
from lngram_jax import checks
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.config import SURROGATES
from lngram_jax.lookup import ngram_lookup, surrogate_logit_grad, table_cotangent
from lngram_jax.norms import rms_norm
from lngram_jax.readout import absorb_query, absorbed_readout, project_values


@dataclasses.dataclass(frozen=True)
class _Static:
  """Everything compiled into the fused op (hashable: a custom_vjp nondiff arg)."""

  orders: tuple[int, ...]
  bits: int
  surrogate: str
  tau: float
  surrogate_scale: float
  scale: float
  eps: float
  blocks: BlockSizes
  interpret: bool


def fused_readout_reference(q_BxTxHqxDh, logits_BxTxRxM, tables, mem_norm_D, w_k_DxHkvxDh,
                            w_v_DxHkvxDh, *, orders, bits, sink_logit, dtype, eps=1e-6,
                            segment_ids=None, valid=None, surrogate="onebit", tau=1.0,
                            surrogate_scale=1.0, return_lse=False):
  """The unfused twin: lookup (surrogate vjp), concat, RMSNorm, absorbed readout."""
  mems = [ngram_lookup(table, logits_BxTxRxM, order=n, bits=bits, segment_ids=segment_ids,
                       valid=valid, surrogate=surrogate, tau=tau, scale=surrogate_scale)
          for n, table in zip(orders, tables, strict=True)]
  x_BxTxRxD = jnp.concatenate(mems, axis=-1).astype(dtype)
  mem_hat = rms_norm(x_BxTxRxD, mem_norm_D, eps=eps)
  return absorbed_readout(q_BxTxHqxDh, mem_hat, w_k_DxHkvxDh, w_v_DxHkvxDh,
                          sink_logit=sink_logit, return_lse=return_lse)


def fused_readout(q_BxTxHqxDh, logits_BxTxRxM, tables, mem_norm_D, w_k_DxHkvxDh, w_v_DxHkvxDh,
                  *, orders, bits, sink_logit, dtype, eps=1e-6, segment_ids=None, valid=None,
                  surrogate="onebit", tau=1.0, surrogate_scale=1.0, return_lse=False,
                  block_sizes: BlockSizes | None = None, interpret: bool | None = None):
  """`fused_readout_reference` with the lookup, norm and sink attention in one kernel.

  Args:
    q_BxTxHqxDh: queries (after RMSNorm_q and W_Q).
    logits_BxTxRxM: router logits z (codes are z > 0).
    tables: one [R·K^n, d_m] table per order, orders ascending.
    mem_norm_D: the memory RMSNorm scale, D = |orders|·d_m.
    w_k_DxHkvxDh, w_v_DxHkvxDh: the K and V projections.
    orders, bits, segment_ids, valid, surrogate, tau, surrogate_scale: as in
      `ngram_lookup`.
    sink_logit: b0 (a float or a traced float32 scalar).
    dtype: the activation dtype the route tokens are rounded to.
    eps: the memory RMSNorm epsilon.
    block_sizes, interpret: kernel options (interpret None = only on CPU).

  Returns:
    o_BxTxHqxDh in q's dtype and, with `return_lse`, lse_BxTxHq (float32).
  """
  orders, tables = tuple(int(n) for n in orders), tuple(tables)
  if len(tables) != len(orders):
    raise ValueError(f"fused_readout: {len(tables)} tables for orders={orders}.")
  if surrogate not in SURROGATES:
    raise ValueError(f"fused_readout: surrogate={surrogate!r} is not one of {SURROGATES}.")
  checks.check_rank("logits", logits_BxTxRxM, 4, "[B, T, R, M]")
  B, T, R, M = logits_BxTxRxM.shape
  Dm = tables[0].shape[1]
  for n, table in zip(orders, tables, strict=True):
    if table.shape != (R * 2 ** (bits * n), Dm):
      raise ValueError(f"fused_readout: table of order {n} has shape {table.shape}; need "
                       f"(R*K^n, d_m) = ({R * 2 ** (bits * n)}, {Dm}).")
  D = len(orders) * Dm
  if mem_norm_D.shape != (D,) or w_k_DxHkvxDh.shape[0] != D:
    raise ValueError(f"fused_readout: mem_norm {mem_norm_D.shape} and w_k "
                     f"{w_k_DxHkvxDh.shape} must have D = |orders|*d_m = {D}.")
  if jax.default_backend() == "tpu":
    raise NotImplementedError(
        "fused_readout has a Triton (GPU) kernel only; on TPU use readout='pallas'.")
  blocks = BlockSizes.get_default("triton", D) if block_sizes is None else block_sizes
  check_triton_blocks(blocks.block_n, blocks.block_r)
  check_triton_blocks(blocks.bwd_n, blocks.bwd_r)
  static = _Static(
      orders=orders, bits=int(bits), surrogate=surrogate, tau=float(tau),
      surrogate_scale=float(surrogate_scale), scale=1.0 / math.sqrt(q_BxTxHqxDh.shape[-1]),
      eps=float(eps), blocks=blocks,
      interpret=jax.default_backend() == "cpu" if interpret is None else bool(interpret))

  codes_BxTxR = codes_from_logits(logits_BxTxRxM)
  rows, valids = zip(*[ngram_rows(codes_BxTxR, order=n, bits=bits, segment_ids=segment_ids,
                                  valid=valid) for n in orders], strict=True)
  q_abs_BxTxHqxD = absorb_query(q_BxTxHqxDh, w_k_DxHkvxDh).astype(dtype)
  u_BxTxHqxD, lse_BxTxHq = _fused_core(
      static, q_abs_BxTxHqxD, tables, logits_BxTxRxM, mem_norm_D,
      jnp.asarray(sink_logit, jnp.float32), codes_BxTxR, tuple(rows), tuple(valids))
  o_BxTxHqxDh = project_values(u_BxTxHqxD, w_v_DxHkvxDh).astype(q_BxTxHqxDh.dtype)
  if return_lse:
    return o_BxTxHqxDh, lse_BxTxHq
  return o_BxTxHqxDh


def _kernel_rows(rows, valids):
  """Per order [N, R] int32 rows with -1 at invalid windows (the kernel reads zero)."""
  return [jnp.where(v[:, :, None], r, -1).reshape(-1, r.shape[-1])
          for r, v in zip(rows, valids, strict=True)]


def _kernel_options(static, backward=False):
  b = static.blocks
  return dict(scale=static.scale, eps=static.eps, block_n=b.bwd_n if backward else b.block_n,
              block_r=b.bwd_r if backward else b.block_r, num_warps=b.num_warps,
              num_stages=b.num_stages, interpret=static.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_core(static, q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids):
  del logits, codes
  B, T, Hq, D = q_abs.shape
  out, lse = fused_triton.forward(q_abs.reshape(B * T, Hq, D), tables,
                                  _kernel_rows(rows, valids), mem_norm, sink_logit,
                                  **_kernel_options(static))
  return out.reshape(B, T, Hq, D), lse.reshape(B, T, Hq)


def _fused_core_fwd(static, q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids):
  out, lse = _fused_core(static, q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids)
  residuals = (q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids, out, lse)
  return (out, lse), residuals


def _fused_core_bwd(static, residuals, cotangents):
  q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids, out, lse = residuals
  dout, dlse = cotangents
  B, T, Hq, D = q_abs.shape
  N = B * T
  dq, dxs, d_norm = fused_triton.backward(
      q_abs.reshape(N, Hq, D), tables, _kernel_rows(rows, valids), mem_norm,
      out.reshape(N, Hq, D), lse.reshape(N, Hq), dout.reshape(N, Hq, D),
      dlse.reshape(N, Hq), **_kernel_options(static, backward=True))
  # From here on exactly `ngram_lookup`'s backward, per order, on g = ∂L/∂m^(n).
  d_tables, d_logits = [], jnp.zeros(logits.shape, jnp.float32)
  for n, table, rows_BxTxR, valid_BxT, dx in zip(static.orders, tables, rows, valids, dxs,
                                                  strict=True):
    acc = jnp.promote_types(table.dtype, jnp.float32)
    g_BxTxRxDm = dx.reshape(*rows_BxTxR.shape, -1).astype(acc) * valid_BxT[
        :, :, None, None].astype(acc)
    d_tables.append(table_cotangent(table, rows_BxTxR, g_BxTxRxDm))
    d_logits += surrogate_logit_grad(
        table, logits, codes, rows_BxTxR, g_BxTxRxDm, order=n, bits=static.bits,
        surrogate=static.surrogate, tau=static.tau, scale=static.surrogate_scale)
  d_sink = sink_logit_cotangent(sink_logit, out, lse, dout, dlse)
  return (dq.reshape(q_abs.shape), tuple(d_tables), d_logits.astype(logits.dtype),
          d_norm.astype(mem_norm.dtype), d_sink, None, None, None)


_fused_core.defvjp(_fused_core_fwd, _fused_core_bwd)
