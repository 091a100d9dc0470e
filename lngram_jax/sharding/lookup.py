"""The generic sharded n-gram lookup: own rows gathered, zeros elsewhere, `psum`.

Shard s of the `table` axis holds rows [s·V/S, (s+1)·V/S) of a table of
V = R·C^n rows, i.e. every row of routes [s·R/S, (s+1)·R/S). It runs the
unsharded `ngram_lookup` on those routes only, against its local rows, places
the result in a zero [B, T, R, Dm] tensor and a `psum` over `table` combines
the shards. Because the slice holds whole routes:

  * the forward is the unsharded forward: route-local row ids (r - s·R/S)·C^n
    + digits index the local block exactly;
  * the table gradient is the unsharded scatter-add restricted to local rows;
  * the surrogate gradient of a route reads only counterfactual rows of the
    same route (same slot, other codes), which live on the same shard, so each
    shard computes it for its routes and the transpose of the replicated
    logits' broadcast sums the disjoint pieces.

Hence values, table gradients and logit gradients equal `ngram_lookup` for every
surrogate mode (tested on 8 host devices).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lngram_jax import checks
from lngram_jax.lookup import ngram_lookup
from lngram_jax.sharding.context import extend_tokens
from lngram_jax.sharding.mesh import (
    ShardingConfig,
    axis_names,
    axis_size,
    table_spec,
    token_spec,
)


def vary_over(x, axes: tuple[str, ...]):
  """Mark `x` as varying over `axes` inside shard_map.

  A `custom_vjp` returns cotangents typed like its inputs: a table shard that is
  replicated over `data` meets logits that vary over `data`, and the table
  cotangent varies too. Casting first makes the types agree; the transpose of
  the cast is the `psum` over those axes that the gradient needs anyway.
  """
  return jax.lax.pcast(x, tuple(axes), to="varying") if axes else x


def ngram_lookup_shard(table_local_ElxDm, logits_BxTxRxM, *, order: int, bits: int,
                       table_axis: str | None, vary_axes: tuple[str, ...] = (),
                       segment_ids=None, valid=None, surrogate: str = "onebit",
                       tau: float = 1.0, scale: float = 1.0, surrogate_impl: str = "auto"):
  """Inside `shard_map`: the generic lookup of one order, psum'd over `table_axis`.

  Args:
    table_local_ElxDm: this shard's block of rows, El = E / shards = (R / shards)·C^n rows.
    logits_BxTxRxM: router logits of ALL routes (replicated over `table_axis`).
    table_axis: the mesh axis the rows are split over, or None (unsharded).
    vary_axes: mesh axes the logits vary over but the table does not (data, seq).
    Other arguments as `ngram_lookup`.

  Returns:
    mem_BxTxRxDm, identical on every shard of `table_axis`.
  """
  kwargs = dict(order=order, bits=bits, segment_ids=segment_ids, valid=valid,
                surrogate=surrogate, tau=tau, scale=scale, surrogate_impl=surrogate_impl)
  table_local_ElxDm = vary_over(table_local_ElxDm, vary_axes)
  if table_axis is None:
    return ngram_lookup(table_local_ElxDm, logits_BxTxRxM, **kwargs)
  B, T, R, _ = logits_BxTxRxM.shape
  shards = jax.lax.axis_size(table_axis)
  if R % shards:
    raise ValueError(
        f"sharded lookup: routes R={R} must be a multiple of the '{table_axis}' axis "
        f"size {shards}, so that every shard owns whole routes.")
  Rs = R // shards
  first_route = jax.lax.axis_index(table_axis) * Rs
  logits_own = jax.lax.dynamic_slice_in_dim(logits_BxTxRxM, first_route, Rs, axis=2)
  mem_own_BxTxRsxDm = ngram_lookup(table_local_ElxDm, logits_own, **kwargs)
  Dm = table_local_ElxDm.shape[1]
  # Rows of the other shards' routes are zero here; the psum fills them in.
  mem_BxTxRxDm = jax.lax.dynamic_update_slice_in_dim(
      jnp.zeros((B, T, R, Dm), mem_own_BxTxRsxDm.dtype), mem_own_BxTxRsxDm,
      first_route, axis=2)
  return jax.lax.psum(mem_BxTxRxDm, table_axis)


def sharded_ngram_lookup(table_ExDm, logits_BxTxRxM, *, mesh, order: int, bits: int,
                         sharding: ShardingConfig | None = None, segment_ids=None,
                         valid=None, surrogate: str = "onebit", tau: float = 1.0,
                         scale: float = 1.0, surrogate_impl: str = "auto"):
  """`ngram_lookup` with rows over `table`, batch over `data`, time over `seq`.

  The sharded twin of `lngram_jax.lookup.ngram_lookup` (same arguments plus
  the mesh); with the time axis split, each shard first fetches the order-1
  previous steps' logits from its left neighbour (`context.extend_tokens`).
  Returns mem_BxTxRxDm sharded as [data, seq, -, -].
  """
  s = sharding or ShardingConfig(mode="generic")
  checks.check_rank("table", table_ExDm, 2, "[E, Dm]")
  checks.check_rank("logits", logits_BxTxRxM, 4, "[B, T, R, M]")
  B, T, R, _ = logits_BxTxRxM.shape
  shards = axis_size(mesh, s.table_axis)
  if R % shards:
    raise ValueError(
        f"sharded_ngram_lookup: routes R={R} must be a multiple of the "
        f"'{s.table_axis}' axis size {shards}.")
  seq = axis_size(mesh, s.seq_axis)
  halo = order - 1 if seq > 1 else 0
  if T % seq or T // seq < halo:
    raise ValueError(
        f"sharded_ngram_lookup: T={T} must split into '{s.seq_axis}'={seq} blocks of "
        f"at least order-1 = {halo} steps.")
  body = functools.partial(
      _lookup_body, order=order, bits=bits, surrogate=surrogate, tau=float(tau),
      scale=float(scale), surrogate_impl=surrogate_impl, halo=halo, sharding=s,
      table_axis=s.table_axis if s.table_axis in mesh.axis_names else None,
      vary_axes=tuple(a for a in (*axis_names(s.data_axis), s.seq_axis)
                      if a in mesh.axis_names))
  tok = token_spec(mesh, s)
  in_specs = (table_spec(mesh, s), token_spec(mesh, s, None, None),
              None if segment_ids is None else tok, None if valid is None else tok)
  fn = jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                     out_specs=token_spec(mesh, s, None, None))
  return fn(table_ExDm, logits_BxTxRxM, segment_ids, valid)


def _lookup_body(table, logits, segment_ids, valid, *, order, bits, surrogate, tau,
                 scale, surrogate_impl, halo, sharding, table_axis, vary_axes):
  if halo:
    logits, segment_ids, valid = extend_tokens(
        logits, halo=halo, axis_name=sharding.seq_axis, segment_ids=segment_ids,
        valid=valid)
  mem = ngram_lookup_shard(table, logits, order=order, bits=bits, table_axis=table_axis,
                           vary_axes=vary_axes, segment_ids=segment_ids, valid=valid,
                           surrogate=surrogate, tau=tau, scale=scale,
                           surrogate_impl=surrogate_impl)
  return mem[:, halo:]
