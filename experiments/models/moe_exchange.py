"""Rows to the devices of a mesh axis and back: the all-to-all of expert parallelism.

    out = ragged_exchange(rows_SxD, out_RxD, input_offsets_n, send_sizes_n,
                          output_offsets_n, recv_sizes_n, axis_name="expert")

has the contract of `jax.lax.ragged_all_to_all` (inside `jax.shard_map` over
`axis_name`, n devices): this device sends rows input_offsets[j] ..
input_offsets[j] + send_sizes[j] − 1 to device j, where they land at
output_offsets[j] of j's output; it receives recv_sizes[i] rows from device i.
Rows of `out` that nobody writes keep their values.

Which collective does it is chosen by the platform the program is lowered for
(`jax.lax.platform_dependent`): TPU and GPU programs hold XLA's ragged
all-to-all, which moves exactly the rows sent. XLA:CPU has no ragged
all-to-all (jax 0.10.2 and 0.11.2: "not supported by XLA:CPU"), so a CPU
program emulates it with a dense `all_to_all` of fixed-size blocks: each
device sends every other device a block of S rows (S = rows of the operand,
the most it can send), the receiver copies each block's first recv_sizes[i]
rows to their offset. Same result, n·S rows of traffic: what a CPU mesh of
host devices (the tests) can afford. `dense_ragged_all_to_all` is that
emulation, usable on every platform.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.out_shapes import vary_like


def exclusive_cumsum(x, axis: int = -1):
  """0, x0, x0 + x1, ... along `axis`."""
  return jnp.cumsum(x, axis=axis) - x


def dense_ragged_all_to_all(operand_SxD, output_RxD, input_offsets_n, send_sizes_n,
                            output_offsets_n, recv_sizes_n, *, axis_name: str):
  """`jax.lax.ragged_all_to_all` from one dense `all_to_all` of [n, S, D] blocks.

  Differentiable like any gather and all_to_all (the transpose of an all_to_all
  is the reverse all_to_all).
  """
  S = operand_SxD.shape[0]
  R = output_RxD.shape[0]
  n = input_offsets_n.shape[0]
  pos_S = jnp.arange(S)
  # Block j: the rows for device j, from its offset, zero past its size.
  idx_nxS = jnp.clip(input_offsets_n[:, None] + pos_S[None, :], 0, S - 1)
  keep_nxS = pos_S[None, :] < send_sizes_n[:, None]
  blocks_nxSxD = jnp.where(keep_nxS[..., None], operand_SxD[idx_nxS], 0)
  got_nxSxD = jax.lax.all_to_all(blocks_nxSxD, axis_name, 0, 0, tiled=True)
  # Where each sender put its rows in this device's output: its output_offsets[me].
  at_n = jax.lax.all_to_all(output_offsets_n, axis_name, 0, 0, tiled=True)
  pos_R = jnp.arange(R)
  out_RxD = output_RxD
  for i in range(n):   # n is the (small, static) axis size
    rel_R = pos_R - at_n[i]
    mine_R = (rel_R >= 0) & (rel_R < recv_sizes_n[i])
    out_RxD = jnp.where(mine_R[:, None], got_nxSxD[i][jnp.clip(rel_R, 0, S - 1)], out_RxD)
  return out_RxD


def ragged_exchange(operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n,
                    recv_sizes_n, *, axis_name: str):
  """`ragged_all_to_all`, or its dense emulation in a CPU program (module docstring)."""
  # The output buffer varies over the axes the operand does (the ragged collective's
  # result takes the buffer's type; both platforms' results must agree).
  output_RxD = vary_like(output_RxD, operand_SxD)

  def ragged(*a):
    return jax.lax.ragged_all_to_all(*a, axis_name=axis_name)

  def dense(*a):
    return dense_ragged_all_to_all(*a, axis_name=axis_name)

  return jax.lax.platform_dependent(
      operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n, recv_sizes_n,
      cpu=dense, default=ragged)
