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

GPU (Triton) and CPU (interpret mode) only: there is no Mosaic (TPU) kernel.

Shapes (DESIGN.md §1): BTR the windows flattened over (b, t, r); n the slots of
an order-n window.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp

from kernels.flip_scores import acc_dtype
from lngram_jax.addressing import shift_left, shift_right
from lngram_jax.surrogate_blocks import onebit_from_scores


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
    interpret: run the kernel in interpret mode; None = only on CPU.

  Returns:
    d_table in the table's dtype (None without `with_table_grad`) and d_logits
    in the accumulation dtype.
  """
  if jax.default_backend() == "tpu":
    raise NotImplementedError(
        "surrogate_impl='triton' has a GPU (Triton) kernel only; on TPU use 'blocks'.")
  kernel = importlib.import_module("kernels.flip_scores.triton_gpu")  # Pallas on first use
  acc = acc_dtype(table_ExDm.dtype, g_BxTxRxDm.dtype)
  z_BxTxRxM = logits_BxTxRxM.astype(acc)
  B, T, R, M = z_BxTxRxM.shape
  n, Dm = order, table_ExDm.shape[1]
  rows_BTR = rows_BxTxR.reshape(-1)
  ids_BTR = rows_BTR if valid_BxT is None else jnp.where(
      valid_BxT[:, :, None], rows_BxTxR, -1).reshape(-1)
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
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
