"""Dispatch for the grouped matmul: a kernel per lowering target, XLA's ragged dot, the twin.

    out_MxN = grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G)

Rows sorted by group: group g holds the next group_sizes[g] rows and is
multiplied by rhs[g]; rows past Σ sizes come out zero (`jax.lax.ragged_dot`'s
contract). The MoE FFN runs its routed experts as three of these.

`implementation=None` picks by the platform the program is lowered for
(`jax.lax.platform_dependent`), not by the process that traces it: megablox's
Mosaic kernel in a program compiled for TPU (a CPU host compiling for a TPU
topology gets it too), and XLA's `ragged_dot` elsewhere (GPU and CPU). float64
operands (which no kernel multiplies) always take `ragged_dot`. "megablox",
"ragged_dot" and "reference" (the per-group loop of reference.py, G times the
work: the tests' twin) name one; megablox runs compiled on TPU and interpreted
on any other platform (`interpret=None`).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from kernels.grouped_matmul import megablox_tpu
from kernels.grouped_matmul.reference import grouped_matmul_reference

Implementation = Literal["megablox", "ragged_dot", "reference"]
IMPLEMENTATIONS = ("megablox", "ragged_dot", "reference")


def _ragged_dot(lhs_MxK, rhs_GxKxN, group_sizes_G):
  return jax.lax.ragged_dot(lhs_MxK, rhs_GxKxN.astype(lhs_MxK.dtype), group_sizes_G)


def _check(lhs_MxK, rhs_GxKxN, group_sizes_G):
  if lhs_MxK.ndim != 2 or rhs_GxKxN.ndim != 3 or lhs_MxK.shape[1] != rhs_GxKxN.shape[1]:
    raise ValueError(f"grouped_matmul: lhs {lhs_MxK.shape} and rhs {rhs_GxKxN.shape} must be "
                     "[M, K] and [G, K, N].")
  if group_sizes_G.shape != (rhs_GxKxN.shape[0],) or not jnp.issubdtype(
      group_sizes_G.dtype, jnp.integer):
    raise ValueError(f"grouped_matmul: group_sizes {group_sizes_G.shape} {group_sizes_G.dtype} "
                     f"must be [G] = [{rhs_GxKxN.shape[0]}] integers.")


def grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G, *,
                   implementation: Implementation | None = None,
                   interpret: bool | None = None):
  """[M, N] in lhs's dtype: each group's rows of lhs times its rhs (module docstring).

  Args:
    lhs_MxK: rows sorted by group.
    rhs_GxKxN: one matrix per group (cast to lhs's dtype).
    group_sizes_G: rows per group (integers, Σ ≤ M).
    implementation: None (by lowering platform), "megablox", "ragged_dot" or
      "reference".
    interpret: run megablox in interpret mode; None = everywhere but on TPU.
  """
  _check(lhs_MxK, rhs_GxKxN, group_sizes_G)
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(f"grouped_matmul: implementation={implementation!r} is not one of "
                     f"{IMPLEMENTATIONS}.")
  sizes_G = group_sizes_G.astype(jnp.int32)
  if implementation == "reference":
    return grouped_matmul_reference(lhs_MxK, rhs_GxKxN, sizes_G)
  kernel_fits = megablox_tpu.supported(lhs_MxK.dtype)
  if implementation == "ragged_dot" or (implementation is None and not kernel_fits):
    return _ragged_dot(lhs_MxK, rhs_GxKxN, sizes_G)
  if implementation == "megablox":
    if not kernel_fits:
      raise ValueError(f"grouped_matmul: megablox multiplies float32 and bfloat16, not "
                       f"{lhs_MxK.dtype}.")
    if interpret is None:
      return jax.lax.platform_dependent(
          lhs_MxK, rhs_GxKxN, sizes_G,
          tpu=functools.partial(megablox_tpu.grouped_matmul_megablox, interpret=False),
          default=functools.partial(megablox_tpu.grouped_matmul_megablox, interpret=True))
    return megablox_tpu.grouped_matmul_megablox(lhs_MxK, rhs_GxKxN, sizes_G,
                                                interpret=interpret)
  return jax.lax.platform_dependent(
      lhs_MxK, rhs_GxKxN, sizes_G,
      tpu=functools.partial(megablox_tpu.grouped_matmul_megablox, interpret=bool(interpret)),
      default=_ragged_dot)
