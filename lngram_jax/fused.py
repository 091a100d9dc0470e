"""The Lngram readout with the table lookup and the memory norm fused into one kernel.

    o, lse = fused_readout(q, logits, params, FusedSpec(config), segment_ids=, valid=)

equals, in values and in every gradient (tables, router logits through the
counterfactual surrogate, memory-norm scale, w_kv, q, b0), the unfused core

    x = concat_n ngram_lookup(E_n, logits, ...)            [B, T, R, Dr]
    o, lse = absorbed_readout(q, RMSNorm_m(x), W_K, W_V)

(`unfused_readout`: `core.read_memory` with the plain pieces, all XLA), but the
route tokens x and x̂ are never written to HBM: the generic kernel
`kernels.sink_readout.fused_triton` gathers the table rows itself. Its
backward writes the cotangent of each order's retrieved vector,
g_n = ∂L/∂m^(n) [B, T, R, Dm]; from it XLA forms the table cotangent
(scatter-add) and the router's surrogate gradient with the same functions
`ngram_lookup`'s own custom_vjp uses, so the surrogate path is unchanged.

This file is the Lngram glue (rows from codes, the custom_vjp, the surrogate);
the kernel knows only row ids, tables, a norm scale and queries. The kernel is
Triton (compiled on GPU, interpreted on CPU); there is no Mosaic version of the
gather, so a program lowered for TPU runs the unfused pieces with the Mosaic
sink-readout kernel (`pallas_readout`) instead: the choice is made per lowering
platform (`jax.lax.platform_dependent`), so a CPU host compiling for a TPU
topology gets the TPU form.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from kernels.sink_readout import BlockSizes, fused_triton
from kernels.sink_readout.common import check_triton_blocks, sink_logit_cotangent
from lngram_jax import checks, core
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.config import LngramConfig
from lngram_jax.lookup import (
    check_surrogate_impl,
    resolve_surrogate_impl,
    surrogate_logit_grad,
    table_cotangent,
)
from lngram_jax.readout import absorb_query, absorbed_readout, project_values
from lngram_jax.surrogate_pallas import onebit_cotangents


@dataclasses.dataclass(frozen=True)
class FusedSpec:
  """Everything compiled into the fused op (hashable: a custom_vjp nondiff arg).

  config: the layer's config (orders, bits, surrogate, dtype, eps, heads).
  block_sizes: kernel tiles; None = `BlockSizes.get_default("triton", Dr)`.
  interpret: run the kernels in interpret mode; None = everywhere but on a GPU (chosen
    per lowering platform by `fused_readout`).
  surrogate_impl: the lookup backward's `surrogate_impl` (DESIGN.md §2.7), "auto" by
    default; `fused_read` passes the layer's.
  """

  config: LngramConfig
  block_sizes: BlockSizes | None = None
  interpret: bool | None = None
  surrogate_impl: str = "auto"

  def __post_init__(self):
    check_surrogate_impl(self.surrogate_impl)

  @property
  def blocks(self) -> BlockSizes:
    if self.block_sizes is not None:
      return self.block_sizes
    return BlockSizes.get_default("triton", self.config.route_dim)

  @property
  def run_interpreted(self) -> bool:
    """Interpret mode as given; unresolved (None), as an eager call on this process's
    backend would run (`fused_readout` resolves it per lowering platform)."""
    return jax.default_backend() == "cpu" if self.interpret is None else bool(self.interpret)

  def kernel_options(self) -> dict:
    c = self.config
    return dict(scale=1.0 / math.sqrt(c.head_dim), eps=float(c.eps), blocks=self.blocks,
                interpret=self.run_interpreted)


def unfused_readout(q_BxTxHqxDh, logits_BxTxRxM, p: core.LngramParams,
                    config: LngramConfig, *, sink_logit=None, segment_ids=None, valid=None,
                    surrogate_impl: str = "auto"):
  """The same op unfused, (o, lse): lookup (surrogate vjp), concat, RMSNorm, absorbed."""
  lookup = core.plain_lookup(config, segment_ids=segment_ids, valid=valid,
                             surrogate_impl=surrogate_impl)
  return core.read_memory(p, config, q_BxTxHqxDh, logits_BxTxRxM, lookup=lookup,
                          readout=functools.partial(absorbed_readout, return_lse=True),
                          sink_logit=sink_logit)


def fused_readout(q_BxTxHqxDh, logits_BxTxRxM, p: core.LngramParams, spec: FusedSpec, *,
                  sink_logit=None, segment_ids=None, valid=None):
  """`unfused_readout` with the lookup, norm and sink attention in one kernel.

  Args:
    q_BxTxHqxDh: queries (after RMSNorm_q and W_Q).
    logits_BxTxRxM: router logits z (codes are z > 0).
    p: the layer's arrays; the kernel reads `tables`, `mem_norm`, `w_kv`.
    spec: the config and kernel options.
    sink_logit: b0 (a float or a traced scalar); None = the config's.
    segment_ids, valid: as in `ngram_lookup`.

  Returns:
    o_BxTxHqxDh in q's dtype and lse_BxTxHq (float32).
  """
  c = spec.config
  checks.check_rank("logits", logits_BxTxRxM, 4, "[B, T, R, M]")
  B, T, R, M = logits_BxTxRxM.shape
  tables = tuple(p.tables)
  if len(tables) != len(c.orders):
    raise ValueError(f"fused_readout: {len(tables)} tables for orders={c.orders}.")
  for n, table in zip(c.orders, tables, strict=True):
    if table.shape != (R * 2 ** (c.bits * n), c.mem_dim):
      raise ValueError(f"fused_readout: table of order {n} has shape {table.shape}; need "
                       f"(R*C^n, Dm) = ({R * 2 ** (c.bits * n)}, {c.mem_dim}).")
  if spec.blocks.layout != "per_token":
    # The fused kernel walks its tokens one by one; a token-block tile would be ignored.
    raise ValueError(f"fused_readout: block_sizes.layout={spec.blocks.layout!r}; the fused "
                     "kernel has the 'per_token' layout only (readout='pallas' takes both).")
  check_triton_blocks(spec.blocks.block_n, spec.blocks.block_r)
  check_triton_blocks(spec.blocks.bwd_n, spec.blocks.bwd_r)
  sink_logit = jnp.asarray(c.sink_logit if sink_logit is None else sink_logit, jnp.float32)

  def fused(native: bool):
    interpret = (not native) if spec.interpret is None else spec.interpret
    resolved = dataclasses.replace(spec, interpret=interpret)

    def run(q_BxTxHqxDh, logits_BxTxRxM, p, sink_logit):
      return _fused(q_BxTxHqxDh, logits_BxTxRxM, p, resolved, sink_logit=sink_logit,
                    segment_ids=segment_ids, valid=valid)
    return run

  def unfused_tpu(q_BxTxHqxDh, logits_BxTxRxM, p, sink_logit):
    from lngram_jax.pallas import pallas_readout  # the Mosaic kernel under a TPU lowering
    # The lookup's backward takes the spec's surrogate_impl, as the fused one does.
    lookup = core.plain_lookup(c, segment_ids=segment_ids, valid=valid,
                               surrogate_impl=spec.surrogate_impl)
    return core.read_memory(p, c, q_BxTxHqxDh, logits_BxTxRxM, lookup=lookup,
                            readout=functools.partial(pallas_readout, return_lse=True),
                            sink_logit=sink_logit)

  on_gpu = fused(True)   # one branch object: platform_dependent joins cuda and rocm
  return jax.lax.platform_dependent(q_BxTxHqxDh, logits_BxTxRxM, p, sink_logit,
                                    tpu=unfused_tpu, cuda=on_gpu, rocm=on_gpu,
                                    default=fused(False))


def _fused(q_BxTxHqxDh, logits_BxTxRxM, p: core.LngramParams, spec: FusedSpec, *,
           sink_logit, segment_ids, valid):
  """The fused kernel's (o, lse) (`fused_readout`'s non-TPU branch)."""
  c = spec.config
  B, T, R, M = logits_BxTxRxM.shape
  tables = tuple(p.tables)
  codes_BxTxR = codes_from_logits(logits_BxTxRxM)
  rows, valids = zip(*[ngram_rows(codes_BxTxR, order=n, bits=c.bits, segment_ids=segment_ids,
                                  valid=valid) for n in c.orders], strict=True)
  w_k, w_v = core.kv_weights(p, c)
  q_abs_BxTxHqxDr = absorb_query(q_BxTxHqxDh, w_k).astype(c.dtype)
  u_BxTxHqxDr, lse_BxTxHq = _fused_core(
      spec, q_abs_BxTxHqxDr, tables, logits_BxTxRxM, p.mem_norm, sink_logit, codes_BxTxR,
      tuple(rows), tuple(valids))
  o_BxTxHqxDh = project_values(u_BxTxHqxDr, w_v).astype(q_BxTxHqxDh.dtype)
  return o_BxTxHqxDh, lse_BxTxHq


def fused_read(p: core.LngramParams, config: LngramConfig, q_BxTxHqxDh, logits_BxTxRxM, *,
               segment_ids=None, valid=None, surrogate_impl: str = "auto"):
  """The core's `read` piece for `readout="pallas_fused"`: (o, lse).

  surrogate_impl: the lookup backward's implementation (`ngram_lookup`'s argument).
  """
  spec = FusedSpec(config, surrogate_impl=surrogate_impl)
  return fused_readout(q_BxTxHqxDh, logits_BxTxRxM, p, spec, segment_ids=segment_ids,
                       valid=valid)


def _kernel_rows(rows, valids):
  """Per order [BT, R] int32 rows with -1 at invalid windows (the kernel reads zero)."""
  return [jnp.where(v[:, :, None], r, -1).reshape(-1, r.shape[-1])
          for r, v in zip(rows, valids, strict=True)]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_core(spec, q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids):
  del logits, codes
  B, T, Hq, Dr = q_abs.shape
  out, lse = fused_triton.forward(q_abs.reshape(B * T, Hq, Dr), tables,
                                  _kernel_rows(rows, valids), mem_norm, sink_logit,
                                  **spec.kernel_options())
  return out.reshape(B, T, Hq, Dr), lse.reshape(B, T, Hq)


def _fused_core_fwd(spec, q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids):
  out, lse = _fused_core(spec, q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids)
  residuals = (q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids, out, lse)
  return (out, lse), residuals


def _fused_core_bwd(spec, residuals, cotangents):
  q_abs, tables, logits, mem_norm, sink_logit, codes, rows, valids, out, lse = residuals
  c = spec.config
  dout, dlse = cotangents
  B, T, Hq, Dr = q_abs.shape
  BT = B * T
  dq, dxs, d_norm = fused_triton.backward(
      q_abs.reshape(BT, Hq, Dr), tables, _kernel_rows(rows, valids), mem_norm,
      out.reshape(BT, Hq, Dr), lse.reshape(BT, Hq), dout.reshape(BT, Hq, Dr),
      dlse.reshape(BT, Hq), **spec.kernel_options())
  # From here on exactly `ngram_lookup`'s backward, per order, on g = ∂L/∂m^(n).
  d_tables = []
  d_logits = jnp.zeros(logits.shape, jnp.promote_types(logits.dtype, jnp.float32))
  impl = spec.surrogate_impl
  for n, table, rows_BxTxR, valid_BxT, dx in zip(c.orders, tables, rows, valids, dxs,
                                                  strict=True):
    if resolve_surrogate_impl(impl, c.surrogate) == "triton":  # both in one kernel
      d_table, d_z = onebit_cotangents(
          table, logits, rows_BxTxR, dx.reshape(*rows_BxTxR.shape, -1), order=n, bits=c.bits,
          tau=c.surrogate_tau, scale=c.surrogate_scale, valid_BxT=valid_BxT,
          interpret=spec.interpret)
      d_tables.append(d_table)
      d_logits += d_z
      continue
    acc = jnp.promote_types(table.dtype, jnp.float32)
    g_BxTxRxDm = dx.reshape(*rows_BxTxR.shape, -1).astype(acc) * valid_BxT[
        :, :, None, None].astype(acc)
    d_tables.append(table_cotangent(table, rows_BxTxR, g_BxTxRxDm))
    d_logits += surrogate_logit_grad(
        table, logits, codes, rows_BxTxR, g_BxTxRxDm, order=n, bits=c.bits,
        surrogate=c.surrogate, tau=c.surrogate_tau, scale=c.surrogate_scale, impl=impl)
  d_sink = sink_logit_cotangent(sink_logit, out, lse, dout, dlse)
  return (dq.reshape(q_abs.shape), tuple(d_tables), d_logits.astype(logits.dtype),
          d_norm.astype(mem_norm.dtype), d_sink, None, None, None)


_fused_core.defvjp(_fused_core_fwd, _fused_core_bwd)
