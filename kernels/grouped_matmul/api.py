"""Dispatch for the grouped matmul: a kernel per lowering target, XLA's ragged dot, the twin.

    out_MxN = grouped_matmul(lhs_MxK, rhs_GxKxN, group_sizes_G)

Rows sorted by group: group g holds the next group_sizes[g] rows and is
multiplied by rhs[g]; rows past Σ sizes come out zero (`jax.lax.ragged_dot`'s
contract). The MoE FFN runs its routed experts as three of these.

`implementation=None` picks by the platform the program is lowered for
(`jax.lax.platform_dependent`), not by the process that traces it: megablox's
Mosaic kernel in a program compiled for TPU (a CPU host compiling for a TPU
topology gets it too), the Pallas Triton kernels of triton_gpu.py in a program
compiled for a GPU (XLA:GPU computes `ragged_dot` densely: G times the work),
and XLA's `ragged_dot` on CPU. float64 operands (which no kernel multiplies), and
on GPU widths the Triton tiles do not divide, take `ragged_dot`. "megablox",
"triton", "ragged_dot" and "reference" (the per-group loop of reference.py, G
times the work: the tests' twin) name one; the kernels run compiled on their own
platform and interpreted on any other (`interpret=None`).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp

from kernels.grouped_matmul import megablox_tpu, triton_gpu
from kernels.grouped_matmul.reference import grouped_matmul_reference

Implementation = Literal["megablox", "triton", "ragged_dot", "reference"]
IMPLEMENTATIONS = ("megablox", "triton", "ragged_dot", "reference")


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
    implementation: None (by lowering platform), "megablox", "triton",
      "ragged_dot" or "reference".
    interpret: run the kernel in interpret mode; None = everywhere but on its own
      platform (TPU for megablox, GPU for triton).
  """
  _check(lhs_MxK, rhs_GxKxN, group_sizes_G)
  if implementation is not None and implementation not in IMPLEMENTATIONS:
    raise ValueError(f"grouped_matmul: implementation={implementation!r} is not one of "
                     f"{IMPLEMENTATIONS}.")
  sizes_G = group_sizes_G.astype(jnp.int32)
  if implementation == "reference":
    return grouped_matmul_reference(lhs_MxK, rhs_GxKxN, sizes_G)
  if implementation == "triton":
    return _triton(lhs_MxK, rhs_GxKxN, sizes_G, interpret)
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
  on_gpu = (_triton_compiled if triton_gpu.supported(lhs_MxK.dtype, *rhs_GxKxN.shape[1:])
            else _ragged_dot)
  return jax.lax.platform_dependent(
      lhs_MxK, rhs_GxKxN, sizes_G,
      tpu=functools.partial(megablox_tpu.grouped_matmul_megablox, interpret=bool(interpret)),
      cuda=on_gpu, default=_ragged_dot)


def _triton_compiled(lhs_MxK, rhs_GxKxN, sizes_G):
  return triton_gpu.grouped_matmul_triton(lhs_MxK, rhs_GxKxN.astype(lhs_MxK.dtype), sizes_G,
                                          False)


def _triton(lhs_MxK, rhs_GxKxN, sizes_G, interpret):
  """The Triton kernels by name: compiled on a GPU, interpreted elsewhere (None)."""
  K, N = rhs_GxKxN.shape[1:]
  if not triton_gpu.supported(lhs_MxK.dtype, K, N):
    raise ValueError(f"grouped_matmul: the Triton kernels multiply float32, bfloat16 and "
                     f"float16 with K and N multiples of 16, not {lhs_MxK.dtype} with "
                     f"K={K}, N={N}.")
  rhs = rhs_GxKxN.astype(lhs_MxK.dtype)
  if interpret is None:
    interpreted = functools.partial(triton_gpu.grouped_matmul_triton, interpret=True)
    return jax.lax.platform_dependent(lhs_MxK, rhs, sizes_G, cuda=_triton_compiled,
                                      default=interpreted)
  return triton_gpu.grouped_matmul_triton(lhs_MxK, rhs, sizes_G, bool(interpret))
