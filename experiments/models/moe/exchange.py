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

import functools

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


def inverse_permutation(order_R):
  """The permutation that undoes `order_R` (an [R] permutation of 0..R−1)."""
  R = order_R.shape[0]
  return jnp.zeros_like(order_R).at[order_R].set(jnp.arange(R, dtype=order_R.dtype),
                                                 unique_indices=True)


@jax.custom_vjp
def permute_rows(x_RxD, order_R):
  """x_RxD[order_R] for a permutation `order_R`, whose backward is the gather by the
  inverse permutation. jax transposes a gather into a scatter-add into a zero buffer;
  XLA:GPU hoisted those zero buffers (2.5 GiB each for Keye30B's received rows) out of
  every MoE layer's backward and kept them all live at once."""
  return x_RxD[order_R]


def _permute_rows_fwd(x_RxD, order_R):
  return x_RxD[order_R], order_R


def _permute_rows_bwd(order_R, t_RxD):
  return t_RxD[inverse_permutation(order_R)], None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def zeros_once_counted(shape, dtype, counts):
  """Zeros of `shape`, made only once `counts` (this layer's integer counts) are known:
  the minimum of counts and 0 is 0, but no compiler can fold it to a constant. A
  constant zero buffer per exchange is hoisted and merged instead: XLA:GPU filled all
  48 receive buffers of the 24-layer Table 4 MoE (384 MiB each at its worst-case size)
  in one fusion at the start of the step, 17.6 GiB live at once (BENCHMARKS.md, "What
  fills the peak")."""
  zero = jnp.minimum(jnp.min(counts), 0).astype(dtype)
  return jnp.broadcast_to(zero, shape)


def _exchange(operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n,
              recv_sizes_n, axis_name):
  """The platform's collective: XLA's ragged all-to-all, or the dense emulation on CPU."""
  def ragged(*a):
    return jax.lax.ragged_all_to_all(*a, axis_name=axis_name)

  def dense(*a):
    return dense_ragged_all_to_all(*a, axis_name=axis_name)

  return jax.lax.platform_dependent(
      operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n, recv_sizes_n,
      cpu=dense, default=ragged)


def _received_rows(R: int, offsets_n, recv_sizes_n):
  """[R] bool: the rows of this device's output that the exchange wrote."""
  pos_R = jnp.arange(R)
  mine_R = jnp.zeros((R,), bool)
  for i in range(offsets_n.shape[0]):   # n is the (small, static) axis size
    mine_R |= (pos_R >= offsets_n[i]) & (pos_R < offsets_n[i] + recv_sizes_n[i])
  return mine_R


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _exchange_vjp(operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n,
                  recv_sizes_n, axis_name):
  return _exchange(operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n,
                   recv_sizes_n, axis_name)


def _exchange_fwd(operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n,
                  recv_sizes_n, axis_name):
  out_RxD = _exchange(operand_SxD, output_RxD, input_offsets_n, send_sizes_n,
                      output_offsets_n, recv_sizes_n, axis_name)
  return out_RxD, (operand_SxD.shape, input_offsets_n, send_sizes_n, output_offsets_n,
                   recv_sizes_n)


def _exchange_bwd(axis_name, res, out_t_RxD):
  """The reverse exchange, as jax's own transpose of `ragged_all_to_all` computes it, with
  two buffers made differently. jax's rule (0.10.2, 0.11.2) receives into a constant zero
  buffer, which XLA hoists and merges across layers like the forward's (see
  `zeros_once_counted`): Keye30B's 48 layers on 64 GPUs held them all at once, 2.5 GiB
  each. And it masks the output's cotangent with an int32 mask broadcast to [R, D]; a
  bool [R] row mask does the same."""
  shape_SxD, input_offsets_n, send_sizes_n, output_offsets_n, recv_sizes_n = res
  # Where each sender's rows landed here, and where they came from in its operand.
  landed_n = jax.lax.all_to_all(output_offsets_n, axis_name, 0, 0, tiled=True)
  taken_n = jax.lax.all_to_all(input_offsets_n, axis_name, 0, 0, tiled=True)
  operand_t_SxD = _exchange(out_t_RxD, zeros_once_counted(shape_SxD, out_t_RxD.dtype,
                                                          recv_sizes_n),
                            landed_n, recv_sizes_n, taken_n, send_sizes_n, axis_name)
  written_R = _received_rows(out_t_RxD.shape[0], landed_n, recv_sizes_n)
  output_t_RxD = jnp.where(written_R[:, None], jnp.zeros((), out_t_RxD.dtype), out_t_RxD)
  return operand_t_SxD, output_t_RxD, None, None, None, None


_exchange_vjp.defvjp(_exchange_fwd, _exchange_bwd)


def ragged_exchange(operand_SxD, output_RxD, input_offsets_n, send_sizes_n, output_offsets_n,
                    recv_sizes_n, *, axis_name: str):
  """`ragged_all_to_all`, or its dense emulation in a CPU program (module docstring).

  Differentiated by `_exchange_bwd` (the reverse exchange); `dense_ragged_all_to_all`,
  differentiated by jax, is its reference twin."""
  # The output buffer varies over the axes the operand does (the ragged collective's
  # result takes the buffer's type; both platforms' results must agree).
  output_RxD = vary_like(output_RxD, operand_SxD)
  return _exchange_vjp(operand_SxD, output_RxD, input_offsets_n, send_sizes_n,
                       output_offsets_n, recv_sizes_n, axis_name)
