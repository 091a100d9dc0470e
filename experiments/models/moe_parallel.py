"""The MoE FFN on a mesh: each device dispatches its own tokens; experts split over `expert`.

On any training mesh of more than one device the grouped dispatch runs here,
per block of tokens (left to XLA, its sort and gathers over the whole batch's
slots would be one global sort repeated on every device). With `expert` = 1
every device holds all the experts (gathered over fsdp like any weight).

The layout rules (experiments/models/layout.py) place w_gate, w_up and w_down
with their expert dimension over `expert`, so device i holds experts
i·E/n .. (i+1)·E/n − 1. The routing (router, softmax, top-k, balance loss) runs
before, partitioned by XLA like the rest of the model; here, under
`jax.shard_map`, each device runs the grouped dispatch of moe.py over its block
of tokens (rows over data × fsdp, time over seq) against its own experts only
(slots routed elsewhere get gate 0 and no matmul rows), and one psum over
`expert` adds the devices' parts. Tokens are not split over `expert`: the
attention and the dense layers of a step are computed on every `expert`
device of a group (the simple form; an all-to-all token exchange would split
them too). The one-device dispatch is the reference (tested equal on 8 host
devices, losses and parameters after training steps).
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")


def check_expert_axis(n_experts: int, mesh) -> None:
  """Refuses an `expert` axis that does not divide the experts."""
  n = int(dict(mesh.shape).get("expert", 1))
  if n > 1 and n_experts % n:
    raise ValueError(f"n_experts={n_experts} must be a multiple of mesh.expert={n} "
                     "(each device holds whole experts).")


def _token_spec(mesh) -> P:
  rows = tuple(a for a in BATCH_AXES if a in mesh.shape)
  seq = "seq" if "seq" in mesh.shape else None
  return P(rows or None, seq, None)


def expert_parallel_experts(grouped, mesh, x_BxTxD, experts_BxTxK, gates_BxTxK, w_gate_ExDxH,
                            w_up_ExDxH, w_down_ExHxD):
  """`grouped` (moe.grouped_experts, passed in: this module imports nothing from
  moe.py) of every token with the experts split over `expert`: [B, T, D]."""
  E = w_gate_ExDxH.shape[0]
  check_expert_axis(E, mesh)
  has_axis = "expert" in mesh.axis_names   # a mesh built elsewhere may lack it
  e_local = E // int(mesh.shape["expert"]) if has_axis else E
  tok = _token_spec(mesh)
  w_spec = P("expert", None, None) if has_axis else P()
  token_axes = tuple(a for a in (*BATCH_AXES, "seq") if a in mesh.axis_names)
  body = functools.partial(_body, grouped=grouped, e_local=e_local, has_axis=has_axis,
                           token_axes=token_axes)
  fn = jax.shard_map(body, mesh=mesh, in_specs=(tok, tok, tok, w_spec, w_spec, w_spec),
                     out_specs=tok)
  return fn(x_BxTxD, experts_BxTxK, gates_BxTxK, w_gate_ExDxH, w_up_ExDxH, w_down_ExHxD)


def _body(x_BxTxD, experts_BxTxK, gates_BxTxK, w_gate, w_up, w_down, *, grouped, e_local,
          has_axis, token_axes):
  b, t, D = x_BxTxD.shape
  K = experts_BxTxK.shape[-1]
  # Every input that is the same on the devices of an axis but meets values that are
  # not is cast to varying over it, so the transpose of the cast is the psum of its
  # cotangent over that axis: the weights over the token axes, x and the gates over
  # `expert` (jax 0.10.2: ragged_dot's own transpose inside shard_map drops the
  # psum of x's cotangent over `expert`; tested).
  if token_axes:
    w_gate, w_up, w_down = (jax.lax.pcast(w, token_axes, to="varying")
                            for w in (w_gate, w_up, w_down))
  if not has_axis:
    return grouped(x_BxTxD.reshape(b * t, D), experts_BxTxK.reshape(b * t, K),
                   gates_BxTxK.reshape(b * t, K), w_gate, w_up, w_down).reshape(b, t, D)
  first = jax.lax.axis_index("expert") * e_local
  x_BxTxD, gates_BxTxK = (jax.lax.pcast(a, ("expert",), to="varying")
                          for a in (x_BxTxD, gates_BxTxK))
  y_NxD = grouped(x_BxTxD.reshape(b * t, D), experts_BxTxK.reshape(b * t, K),
                  gates_BxTxK.reshape(b * t, K), w_gate, w_up, w_down, first_expert=first)
  return jax.lax.psum(y_NxD, "expert").reshape(b, t, D)
