"""The slow, obviously-correct twin of the grouped matmul: one dense product per group.

    out[m] = lhs[m] @ rhs[g]   for the group g whose rows hold m
             0                 for rows past the last group

Groups take consecutive rows in order: group g holds rows
Σ_{g'<g} sizes[g'] .. Σ_{g'≤g} sizes[g'] − 1. Every group's product is computed
over every row and kept where the row is the group's (G times the work).
"""

from __future__ import annotations

import jax.numpy as jnp


def grouped_matmul_reference(lhs_MxK, rhs_GxKxN, group_sizes_G):
  """[M, N] in lhs's dtype (module docstring)."""
  M = lhs_MxK.shape[0]
  G, _, N = rhs_GxKxN.shape
  ends_G = jnp.cumsum(group_sizes_G)
  starts_G = ends_G - group_sizes_G
  row_M = jnp.arange(M)
  out_MxN = jnp.zeros((M, N), lhs_MxK.dtype)
  for g in range(G):
    mine_M = (row_M >= starts_G[g]) & (row_M < ends_G[g])
    out_MxN = jnp.where(mine_M[:, None], lhs_MxK @ rhs_GxKxN[g].astype(lhs_MxK.dtype), out_MxN)
  return out_MxN
