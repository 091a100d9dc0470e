"""The one-bit surrogate's backward and the table gradient in one Pallas kernel.

`ngram_lookup(surrogate_impl="triton")` (DESIGN.md §2.7), one-bit surrogate
only. Its slow twins are the `blocks` and `gather` paths of the lookup; the
maths is theirs. Per window (b, t, r) of one order n the window reads the hard
row and its n·M one-bit neighbours: flipping bit j of slot u moves the row by
±2^j·C^u = ±2^(u·M + j), and since route r owns the aligned range
[r·C^n, (r+1)·C^n), that neighbour is row XOR 2^(u·M + j), always inside the
route (§2.2). The kernel (`kernels.flip_scores`) takes the window's cotangent
g once and, in the same program,

  - reduces g against the hard row and each neighbour: the scores ⟨g, E[row]⟩
    and ⟨g, E[row XOR 2^k]⟩ of `surrogate_blocks`' one-bit form;
  - adds g onto the table gradient at the hard row (float32 atomics; the
    neighbours are constants and get nothing).

Only the [B·T·R, 1 + n·M] scores leave the kernel; the surrogate maths on them,
τp(1-p)·(1-2b)(⟨g, E_flip⟩ - ⟨g, E_hard⟩) per bit, and the sum of every
window's slots into the positions they cover run in XLA exactly as in `blocks`
(`surrogate_blocks.onebit_from_scores`). Invalid windows pass row id -1 and
read and add nothing (the XLA paths read inside the table against g = 0).

The kernel is Triton: compiled in a program lowered for a GPU, interpreted on
CPU. There is no Mosaic version: a program lowered for TPU computes the same
cotangents with the XLA `blocks` path (`surrogate_logit_grad_blocks` and the
lookup's scatter-add). The choice is made per lowering platform
(`jax.lax.platform_dependent`), not by the process that traces the program.

Shapes (DESIGN.md §1): BTR the windows flattened over (b, t, r); n the slots of
an order-n window.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp

from kernels.flip_scores import acc_dtype
from lngram_jax.addressing import shift_left, shift_right
from lngram_jax.surrogate_blocks import (
    onebit_from_scores,
    surrogate_logit_grad_blocks,
    table_cotangent,
)


def onebit_cotangents(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, *, order: int,
                      bits: int, tau: float, scale: float, valid_BxT=None,
                      with_table_grad: bool = True, interpret: bool | None = None):
  """(d_table_ExDm or None, d_logits_BxTxRxM) of one order's one-bit lookup backward.

  Args:
    table_ExDm, logits_BxTxRxM, rows_BxTxR: the lookup's table, router logits
      and hard rows.
    g_BxTxRxDm: the cotangent of the rows read (any float dtype: the kernel
      accumulates in float32 or wider); zero at invalid windows unless
      `valid_BxT` is given (then they are never read).
    order, bits, tau, scale: n, M, τ and λ.
    valid_BxT: which windows are valid; None = all (invalid ones must then have
      g = 0, and read inside the table: they add exactly zero).
    with_table_grad: also return the table gradient (the scatter-add of g onto
      the rows read, float32 or wider, cast to the table's dtype).
    interpret: run the kernel in interpret mode; None = everywhere but on a GPU.

  Returns:
    d_table in the table's dtype (None without `with_table_grad`) and d_logits
    in the accumulation dtype.
  """
  options = dict(order=order, bits=bits, tau=tau, scale=scale,
                 with_table_grad=with_table_grad)

  def kernel_branch(native: bool):
    run_interpreted = (not native) if interpret is None else bool(interpret)
    return lambda *arrays: _kernel_cotangents(*arrays, interpret=run_interpreted, **options)

  def xla_branch(*arrays):
    return _xla_cotangents(*arrays, **options)

  if valid_BxT is None:
    valid_BxT = jnp.ones(rows_BxTxR.shape[:2], bool)
  on_gpu = kernel_branch(True)   # one branch object: platform_dependent joins cuda and rocm
  return jax.lax.platform_dependent(
      table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, valid_BxT,
      cuda=on_gpu, rocm=on_gpu, tpu=xla_branch, default=kernel_branch(False))


def _xla_cotangents(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, valid_BxT, *,
                    order, bits, tau, scale, with_table_grad):
  """`onebit_cotangents` without the kernel: the lookup's `blocks` backward."""
  acc = acc_dtype(table_ExDm.dtype, g_BxTxRxDm.dtype)
  g_BxTxRxDm = jnp.where(valid_BxT[:, :, None, None], g_BxTxRxDm.astype(acc), 0)
  d_table = table_cotangent(table_ExDm, rows_BxTxR, g_BxTxRxDm) if with_table_grad else None
  d_logits = surrogate_logit_grad_blocks(
      table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, order=order, bits=bits,
      surrogate="onebit", tau=tau, scale=scale)
  return d_table, d_logits


def _kernel_cotangents(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, valid_BxT, *,
                       order, bits, tau, scale, with_table_grad, interpret):
  """`onebit_cotangents` by the flip-scores kernel."""
  kernel = importlib.import_module("kernels.flip_scores.triton_gpu")  # Pallas on first use
  acc = acc_dtype(table_ExDm.dtype, g_BxTxRxDm.dtype)
  z_BxTxRxM = logits_BxTxRxM.astype(acc)
  B, T, R, M = z_BxTxRxM.shape
  n, Dm = order, table_ExDm.shape[1]
  rows_BTR = rows_BxTxR.reshape(-1)
  ids_BTR = jnp.where(valid_BxT[:, :, None], rows_BxTxR, -1).reshape(-1)
  # Bit u·M + j of a row id is bit j of slot u: the order of `_onebit_rows`.
  scores_BTRxcand, d_table = kernel.flip_scores(
      table_ExDm, ids_BTR, g_BxTxRxDm.reshape(-1, Dm), flips=tuple(range(n * bits)),
      with_table_grad=with_table_grad, interpret=bool(interpret))
  # From here on `surrogate_blocks.surrogate_logit_grad_blocks`' one-bit tail.
  z_at_BTRxnxM = jnp.stack([shift_right(z_BxTxRxM, n - 1 - u) for u in range(n)],
                           axis=3).reshape(-1, n, M)
  contrib_BTRxnxM = onebit_from_scores(scores_BTRxcand, rows_BTR, z_at_BTRxnxM, bits=bits,
                                        tau=tau)
  contrib_BxTxRxnxM = contrib_BTRxnxM.reshape(B, T, R, n, M)
  d_z = jnp.zeros_like(z_BxTxRxM)
  for u in range(n):
    # The window ending at t wrote slot u's gradient for position t - (n-1-u).
    d_z += shift_left(contrib_BxTxRxnxM[:, :, :, u], n - 1 - u)
  if d_table is not None:
    d_table = d_table.astype(table_ExDm.dtype)
  return d_table, scale * d_z
