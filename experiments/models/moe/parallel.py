"""Expert parallelism: each token's slots travel by all-to-all to the device holding its expert.

On a training mesh the batch is split over data × fsdp × expert (rows) and seq
(time), so every device routes its own tokens; the layout rules
(experiments/models/layout.py) split the routed experts' weights over
`expert`: device j of an `expert` group holds experts j·L .. (j+1)·L − 1,
L = E / n. Under `jax.shard_map`, per device (N local tokens, S = N·K slots):

  1. sort the S slots by expert (stable): the slots for device j are one
     contiguous run, ordered by expert;
  2. all-gather the [n, L] counts of every device of the group (tiny), so each
     device knows every sender's sizes and offsets without further exchange;
  3. send each run to its device (`exchange.ragged_exchange`: XLA's ragged
     all-to-all on TPU and GPU); the receiver's buffer holds the senders' runs
     one after another, sender 0 first;
  4. sort the received rows by local expert (already sorted with one expert per
     device) and run the local experts' SwiGLU as grouped matmuls
     (`swiglu(rows, group_sizes, w_gate, w_up, w_down)`);
  5. the reverse exchange returns every row to the slot it came from, where it
     is weighted by its gate and summed into its token.

The receiving buffer has R rows. Dropless (capacity_factor 0, the default):
R = n·S, the most that can arrive (every sender's every slot for this device),
as in MaxText's dropless ragged dispatch. With a capacity factor c > 0:
R = ceil(c·S) rounded up to 8, and a device's senders fill it in order of
their index; rows past R are dropped (that slot adds nothing to its token:
the residual and the shared experts still carry it) and counted, and the
count of the step is logged (`moe/<layer>/dropped`).

Without an `expert` axis (or one of size 1) each device runs the one-device
grouped dispatch on its own tokens with every expert. The one-device dispatch
and the per-token loop (experiments/models/moe/reference.py) are the reference:
the tests compare values and gradients on a mesh of 4 host devices with uneven
loads, and the losses of training runs on data=4 and expert=4.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from experiments.models.layout import BATCH_AXES, check_expert_axis
from experiments.models.moe.exchange import (
    exclusive_cumsum,
    inverse_permutation,
    permute_rows,
    ragged_exchange,
    zeros_once_counted,
)


def buffer_rows(slots: int, n: int, capacity_factor: float) -> int:
  """Rows of a device's receiving buffer for `slots` local slots on an expert axis of n."""
  if capacity_factor <= 0:
    return n * slots
  return min(n * slots, 8 * math.ceil(math.ceil(capacity_factor * slots) / 8))


def _token_spec(mesh) -> P:
  rows = tuple(a for a in BATCH_AXES if a in mesh.shape)
  seq = "seq" if "seq" in mesh.shape else None
  return P(rows or None, seq, None)


def expert_parallel_experts(swiglu, grouped, mesh, x_BxTxD, experts_BxTxK, gates_BxTxK,
                            w_gate_ExDxH, w_up_ExDxH, w_down_ExHxD, *,
                            capacity_factor: float = 0.0):
  """(y [B, T, D], dropped slots int32 scalar) of every token on `mesh` (module docstring).

  `swiglu(rows_RxD, sizes_L, w_gate, w_up, w_down)` runs L experts over rows sorted
  by expert; `grouped(x_NxD, experts_NxK, gates_NxK, w_gate, w_up, w_down)` is the
  one-device dispatch (moe.py passes both: this module imports nothing from it).
  """
  E = w_gate_ExDxH.shape[0]
  check_expert_axis(E, mesh)
  n = int(mesh.shape["expert"]) if "expert" in mesh.axis_names else 1
  tok = _token_spec(mesh)
  w_spec = P("expert", None, None) if n > 1 else P()
  token_axes = tuple(a for a in (*BATCH_AXES, "seq") if a in mesh.axis_names)
  if n > 1:
    body = functools.partial(_exchange_body, swiglu=swiglu, n=n,
                             capacity_factor=capacity_factor, token_axes=token_axes)
  else:
    body = functools.partial(_local_body, grouped=grouped)
  # check_vma off: megablox's kernel (the TPU grouped matmul) declares no varying mesh
  # axes for its output. Without the check, shard_map's transpose sums each input's
  # cotangent over the axes its spec leaves out (the weights' over the token axes) and
  # splits each output's cotangent evenly over the axes its spec leaves out (`table`,
  # which holds copies of the tokens): the gradients the typed form would give.
  fn = jax.shard_map(body, mesh=mesh, in_specs=(tok, tok, tok, w_spec, w_spec, w_spec),
                     out_specs=(tok, P()), check_vma=False)
  return fn(x_BxTxD, experts_BxTxK, gates_BxTxK, w_gate_ExDxH, w_up_ExDxH, w_down_ExHxD)


def _local_body(x_BxTxD, experts_BxTxK, gates_BxTxK, *weights, grouped):
  b, t, D = x_BxTxD.shape
  K = experts_BxTxK.shape[-1]
  y_NxD = grouped(x_BxTxD.reshape(b * t, D), experts_BxTxK.reshape(b * t, K),
                  gates_BxTxK.reshape(b * t, K), *weights)
  return y_NxD.reshape(b, t, D), jnp.zeros((), jnp.int32)


def _exchange_body(x_BxTxD, experts_BxTxK, gates_BxTxK, w_gate_LxDxH, w_up_LxDxH, w_down_LxHxD,
                   *, swiglu, n, capacity_factor, token_axes):
  b, t, D = x_BxTxD.shape
  K = experts_BxTxK.shape[-1]
  L = w_gate_LxDxH.shape[0]
  N, S = b * t, b * t * K
  R = buffer_rows(S, n, capacity_factor)
  weights = (w_gate_LxDxH, w_up_LxDxH, w_down_LxHxD)
  x_NxD = x_BxTxD.reshape(N, D)
  me = jax.lax.axis_index("expert")

  # 1. This device's slots sorted by expert: runs per destination device.
  expert_S = experts_BxTxK.reshape(S)
  order_S = jnp.argsort(expert_S, stable=True)
  token_S = order_S // K
  counts_nxL = jnp.bincount(expert_S, length=n * L).reshape(n, L).astype(jnp.int32)

  # 2. Every sender's counts: [sender, receiver, local expert].
  counts_nxnxL = jax.lax.all_gather(counts_nxL, "expert")
  sent_nxn = counts_nxnxL.sum(-1)
  # Receiver j's buffer takes the senders in order; what overflows R is dropped.
  start_nxn = jnp.minimum(exclusive_cumsum(sent_nxn, axis=0), R)
  kept_nxn = jnp.minimum(sent_nxn, R - start_nxn)
  # Within a run (ordered by expert) the kept rows are a prefix.
  kept_nxnxL = jnp.clip(kept_nxn[..., None] - exclusive_cumsum(counts_nxnxL), 0, counts_nxnxL)
  run_start_nxn = exclusive_cumsum(sent_nxn, axis=1)   # run j's first row in sender i's slots

  # 3. Out to the experts' devices.
  rows_SxD = x_NxD[token_S]
  buf_RxD = ragged_exchange(
      rows_SxD, zeros_once_counted((R, D), x_NxD.dtype, sent_nxn), run_start_nxn[me], kept_nxn[me],
      start_nxn[me], kept_nxn[:, me], axis_name="expert")

  # 4. Received rows sorted by local expert; rows past what arrived sort last. With one
  # expert per device the buffer is already in that order (the runs arrive packed).
  arrived_nxL = kept_nxnxL[:, me, :]
  # The scope tells the plan's FLOP count (experiments/plan/jaxpr_flops.py) how many of
  # the R rows a balanced load fills: this device's own S.
  with jax.named_scope(f"routed_rows_{min(S, R)}"):
    if L == 1:
      back_RxD = swiglu(buf_RxD, arrived_nxL.sum(0), *weights)
    else:
      seg_end = jnp.cumsum(arrived_nxL.reshape(n * L))
      seg_R = jnp.searchsorted(seg_end, jnp.arange(R), side="right")
      local_R = jnp.where(seg_R < n * L, seg_R % L, L)
      order_R = jnp.argsort(local_R, stable=True)
      ys_RxD = swiglu(permute_rows(buf_RxD, order_R), arrived_nxL.sum(0), *weights)
      back_RxD = permute_rows(ys_RxD, inverse_permutation(order_R))

  # 5. Back to the slots they came from; gate; sum into tokens.
  returned_SxD = ragged_exchange(
      back_RxD, zeros_once_counted((S, D), back_RxD.dtype, sent_nxn), start_nxn[:, me],
      kept_nxn[:, me],
      run_start_nxn[:, me], kept_nxn[me], axis_name="expert")
  dest_S = jnp.repeat(jnp.arange(n), sent_nxn[me], total_repeat_length=S)
  kept_S = jnp.arange(S) - run_start_nxn[me][dest_S] < kept_nxn[me][dest_S]
  gates_S = jnp.where(kept_S, gates_BxTxK.reshape(S)[order_S], 0).astype(x_NxD.dtype)
  y_NxD = jnp.zeros((N, D), x_NxD.dtype).at[token_S].add(returned_SxD * gates_S[:, None])
  dropped = jax.lax.psum(S - kept_nxn[me].sum(), token_axes)
  return y_NxD.reshape(b, t, D), dropped.astype(jnp.int32)
