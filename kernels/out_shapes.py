"""Output shapes of a Pallas call that keep their inputs' varying mesh axes.

Inside `jax.shard_map` (with `check_vma`), a `pallas_call`'s outputs must say
over which manual mesh axes they vary, as their inputs do (a kernel run per
shard: the Lngram route-parallel readout, a splash attention per batch shard).
`like(x, shape, dtype)` is `jax.ShapeDtypeStruct(shape, dtype)` carrying `x`'s
manual-axis type; outside shard_map it carries nothing. jax has named that
field `manual_axis_type` (0.10) and `vma`; both are tried.
"""

from __future__ import annotations

import jax


def like(x, shape, dtype) -> jax.ShapeDtypeStruct:
  """A ShapeDtypeStruct of `shape` and `dtype` varying over the mesh axes `x` varies over."""
  aval = jax.typeof(x)
  for field in ("manual_axis_type", "vma"):
    value = getattr(aval, field, None)
    if value is None:
      continue
    try:
      return jax.ShapeDtypeStruct(shape, dtype, **{field: value})
    except TypeError:   # this jax spells the keyword otherwise
      continue
  return jax.ShapeDtypeStruct(shape, dtype)


def varying_axes(x) -> frozenset:
  """The manual mesh axes `x` varies over inside shard_map (empty outside)."""
  aval = jax.typeof(x)
  vma = getattr(aval, "vma", None)
  if vma is None:
    vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
  return frozenset(vma or ())


def vary_like(x, *others):
  """`x` cast to vary over every axis that `others` vary over: a replicated input of a
  `custom_vjp` whose cotangent is computed from varying values (the sink logit of a
  kernel run per shard) then gets a cotangent of its own type; the transpose of the
  cast is the psum over those axes."""
  axes = frozenset().union(*(varying_axes(o) for o in others)) - varying_axes(x)
  return jax.lax.pcast(x, tuple(sorted(axes)), to="varying") if axes else x
