"""XLA reference of the flip-scores op: the obviously-correct twin of the kernel.

For N rows ids of a table E [V, D] and N cotangents g [N, D]:

    scores[i, 0]     = ⟨g_i, E[row_i]⟩,
    scores[i, 1 + k] = ⟨g_i, E[row_i XOR 2^flips[k]]⟩,
    d_table          = Σ_i onehot(row_i) ⊗ g_i   (a scatter-add),

with row_i = -1 marking a row that reads and adds nothing (its scores are 0).
Products and sums are in `acc_dtype(E, g)`: float32 for float32 and narrower
inputs, float64 for float64 ones.
"""

from __future__ import annotations

import jax.numpy as jnp


def acc_dtype(table_dtype, g_dtype):
  """The accumulation dtype: at least float32, never below either input."""
  return jnp.promote_types(jnp.promote_types(table_dtype, g_dtype), jnp.float32)


def flip_scores_reference(table_VxD, rows_N, g_NxD, *, flips: tuple[int, ...],
                          with_table_grad: bool = True):
  """(scores_NxK with K = 1 + len(flips), d_table_VxD or None), both in `acc_dtype`."""
  acc = acc_dtype(table_VxD.dtype, g_NxD.dtype)
  ok_N = rows_N >= 0
  safe_N = jnp.where(ok_N, rows_N, 0)
  g_NxD = jnp.where(ok_N[:, None], g_NxD.astype(acc), 0)
  cand_NxK = jnp.stack([safe_N] + [safe_N ^ (1 << bit) for bit in flips], axis=1)
  rows_NxKxD = jnp.take(table_VxD, cand_NxK, axis=0).astype(acc)
  scores_NxK = jnp.einsum("nkd,nd->nk", rows_NxKxD, g_NxD)
  if not with_table_grad:
    return scores_NxK, None
  d_table_VxD = jnp.zeros(table_VxD.shape, acc).at[safe_N].add(g_NxD)
  return scores_NxK, d_table_VxD
