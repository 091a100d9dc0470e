"""Matmul FLOPs of a traced program, read from its jaxpr: independent of any backend.

XLA's cost analysis counts what one backend's compiler emits: XLA:CPU lowers
`jax.lax.ragged_dot` (the MoE's grouped dispatch) as a dense product with every
group, and counts a while body once. Here every `dot_general` counts
2·(batch·M·N·K) and every ragged dot 2·M·K·N (each row meets one group), over the
whole program, global shapes:
  scan        the body times its length
  shard_map   the body (per-shard shapes) times the shards of its manual axes (work
              a shard repeats, e.g. on an axis its inputs are not split over, counts
              on every shard: the work the mesh does, not the model's)
  cond        the costliest branch (a platform choice: its XLA twin, since a kernel
              counts nothing)
  pallas_call nothing: its body is one tile's work, run a data-dependent number of
              times
  while       the body once (its trip count is not in the jaxpr)
  any other   primitive holding a jaxpr (jit, remat, custom_vjp/jvp): its body once
Only matmuls count (elementwise work is left out), so this is the program's view of
experiments/models/counts.py's formula.

`jaxpr_flops(jaxpr, kernels=False)` leaves out the work a platform choice gives to a
Pallas kernel (cond: the cheapest branch, which is the kernel's where a kernel runs),
and `loops=False` counts a scan's body once: together they count the matmuls as a
compiler's cost analysis does on a TPU or GPU, which sees no kernel's work and a loop
body once. The plan uses the three counts to say why the compiler's FLOPs differ from
the formula's (experiments/plan/report.py).

A ragged dot traced under a name scope `routed_rows_<n>` counts n of its ragged
dimension's rows (at most all): expert parallelism's receive buffer holds the
worst case of uneven loads (every device's every slot), while the rows that
arrive when the loads balance, the device's own slot count, are what the
grouped matmul computes (experiments/models/moe/parallel.py names the scope).
"""

from __future__ import annotations

import functools
import math
import re

from jax.extend import core

_RAGGED = ("ragged_dot", "ragged_dot_general")
_ROWS_SCOPE = re.compile(r"\brouted_rows_(\d+)\b")


def _shape(var) -> tuple[int, ...]:
  return tuple(getattr(var.aval, "shape", ()))


def _dot_flops(eqn) -> float:
  (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
  lhs, rhs = _shape(eqn.invars[0]), _shape(eqn.invars[1])
  free_rhs = [n for i, n in enumerate(rhs) if i not in rhs_contract and i not in rhs_batch]
  return 2.0 * math.prod(lhs) * math.prod(free_rhs)


def _ragged_flops(eqn, scope: str) -> float:
  # Each lhs entry meets the N outputs of its one group: N = rhs size / (groups · K).
  # Forward lhs [M, K], rhs [G, K, N]; the lhs cotangent [M, N] with [G, K, N]
  # (contracting N); the rhs cotangent lhs [M, K] with [M, N] grouped along M (G none).
  lhs, rhs = _shape(eqn.invars[0]), _shape(eqn.invars[1])
  numbers = eqn.params.get("ragged_dot_dimension_numbers")
  ragged = numbers.lhs_ragged_dimensions[0] if numbers is not None else 0
  rows = lhs[ragged]
  if m := _ROWS_SCOPE.search(scope):
    rows = min(rows, int(m.group(1)))
  lhs_size = math.prod(lhs) // max(lhs[ragged], 1) * rows
  if numbers is None:   # plain ragged_dot: lhs [M, K], rhs [G, K, N]
    return 2.0 * lhs_size * rhs[-1]
  (_, rhs_contract), (_, rhs_batch) = numbers.dot_dimension_numbers
  shared = set(rhs_contract) | set(numbers.rhs_group_dimensions) | set(rhs_batch)
  return 2.0 * lhs_size * math.prod(n for i, n in enumerate(rhs) if i not in shared)


def _jaxprs(value):
  if isinstance(value, core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for item in value:
      yield from _jaxprs(item)


def _shards(eqn) -> int:
  mesh = eqn.params.get("mesh")
  shape = dict(getattr(mesh, "shape", {}) or {})
  # The manual axes (named differently across jax versions); shapes along any other
  # (auto) axis stay global inside the body. Replicated work counts on every shard.
  axes = (eqn.params.get("newly_manual_axes") or eqn.params.get("manual_axes")
          or eqn.params.get("axis_names") or tuple(shape))
  return math.prod(int(shape.get(a, 1)) for a in axes)


def jaxpr_flops(jaxpr, scope: str = "", *, kernels: bool = True, loops: bool = True) -> float:
  """Matmul FLOPs of `jaxpr` (a Jaxpr or ClosedJaxpr), module docstring. `scope`: the
  name stack of the equation holding it (a branch's jaxpr starts a fresh one).
  `kernels=False`: a cond counts its cheapest branch (a Pallas kernel's, where one runs);
  `loops=False`: a scan counts its body once (module docstring)."""
  if isinstance(jaxpr, core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  total = 0.0
  pick = max if kernels else min
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    where = f"{scope}/{eqn.source_info.name_stack}"
    inner = functools.partial(jaxpr_flops, scope=where, kernels=kernels, loops=loops)
    if name == "dot_general":
      total += _dot_flops(eqn)
    elif name in _RAGGED:
      total += _ragged_flops(eqn, where)
    elif name == "scan":
      total += (eqn.params["length"] if loops else 1) * inner(eqn.params["jaxpr"])
    elif name == "shard_map":
      total += _shards(eqn) * sum(inner(j) for j in _jaxprs(eqn.params["jaxpr"]))
    elif name == "cond":
      total += pick((inner(j) for j in _jaxprs(eqn.params["branches"])), default=0.0)
    elif name == "while":
      total += inner(eqn.params["body_jaxpr"])
    elif name == "pallas_call":
      continue
    else:
      for value in eqn.params.values():
        for sub in _jaxprs(value):
          total += inner(sub)
  return total
