"""The Lngram v2 layer on a mesh: `ShardedLngramV2` and its shard_map body.

`ShardedLngramV2(config, mesh=, sharding=, rngs=)` is `LngramV2` with the same
parameters (names, shapes, init, checkpoints) whose forward runs under
`jax.shard_map`:

  * tables split by rows over `table` (= routes), the router by route columns
    in the route-parallel form, everything else replicated;
  * batch over `data`, time over `seq` (context parallelism, `context.py`);
  * "generic": rows gathered per shard and psum'd (`lookup.py`), then the
    configured readout, replicated; "route_parallel": each shard routes, looks
    up and reads out its own routes and the partial softmax states are merged
    (`readout.py`).

Inside the body each shard runs the one forward, `lngram_jax.core.forward`,
on its local arrays, passing only its pieces: the lookup (a table shard's,
with the left halo of context parallelism), the readout (route-parallel merge
or the configured form) and the conv (with halo). Gradients of replicated
parameters are summed by shard_map's transpose.

`create_sharded` builds the layer inside `nnx.jit` with sharding constraints,
so every parameter is created directly in its shards: no device ever holds a
whole table.
"""

from __future__ import annotations

import functools

import jax
from flax import nnx
from jax.sharding import Mesh

from lngram_jax import checks, core
from lngram_jax.config import LngramConfig
from lngram_jax.conv import short_conv
from lngram_jax.layer import LngramV2
from lngram_jax.lookup import check_surrogate_impl, ngram_lookup
from lngram_jax.sharding.context import extend_tokens, short_conv_with_halo
from lngram_jax.sharding.lookup import ngram_lookup_shard, vary_over
from lngram_jax.sharding.mesh import (
    ShardingConfig,
    axis_names,
    axis_size,
    check_layout,
    layer_param_shardings,
    layer_param_specs,
    present_axis,
    route_spec,
    token_spec,
)
from lngram_jax.sharding.readout import route_parallel_readout


class ShardedLngramV2(LngramV2):
  """`LngramV2` laid out over `mesh` as `sharding` says; same parameters.

  Create it with `create_sharded` to get the parameters directly sharded;
  calling the constructor eagerly first builds them on one device and then
  moves them.
  """

  def __init__(self, config: LngramConfig, *, mesh: Mesh,
               sharding: ShardingConfig | None = None, rngs: nnx.Rngs,
               surrogate_impl: str = "auto"):
    sharding = sharding or ShardingConfig()
    check_layout(config, mesh, sharding)
    super().__init__(config, rngs=rngs, surrogate_impl=surrogate_impl)
    self.mesh = mesh
    self.sharding = sharding
    # Under jit these constraints let XLA generate each parameter in place.
    params = nnx.to_pure_dict(nnx.state(self))
    nnx.update(self, jax.lax.with_sharding_constraint(
        params, layer_param_shardings(params, mesh, sharding)))

  def __call__(self, h_BxTxD, *, segment_ids=None, valid=None, return_aux=False):
    """The delta Y: [B, T, d], equal to `LngramV2.__call__` (see there for aux)."""
    return sharded_layer_apply(self, h_BxTxD, mesh=self.mesh, sharding=self.sharding,
                               segment_ids=segment_ids, valid=valid,
                               return_aux=return_aux)


def create_sharded(config: LngramConfig, *, mesh: Mesh,
                   sharding: ShardingConfig | None = None,
                   rngs: nnx.Rngs, surrogate_impl: str = "auto") -> ShardedLngramV2:
  """A `ShardedLngramV2` whose parameters are created directly in their shards.

  With partitionable threefry (JAX's default) the values equal those of
  `LngramV2(config, rngs=...)` with the same seed.
  """

  @nnx.jit
  def create(rngs):
    return ShardedLngramV2(config, mesh=mesh, sharding=sharding, rngs=rngs,
                           surrogate_impl=surrogate_impl)

  return create(rngs)


def shard_layer(layer: LngramV2, *, mesh: Mesh,
                sharding: ShardingConfig | None = None) -> ShardedLngramV2:
  """A `ShardedLngramV2` holding `layer`'s parameters, moved into their shards.

  For a layer built or trained on one device; its arrays are copied, and its
  `surrogate_impl` too.
  """
  sharding = sharding or ShardingConfig()
  sharded = nnx.eval_shape(lambda: ShardedLngramV2(
      layer.config, mesh=mesh, sharding=sharding, rngs=nnx.Rngs(0),
      surrogate_impl=layer.surrogate_impl))
  params = nnx.to_pure_dict(nnx.state(layer))
  nnx.update(sharded, jax.device_put(params, layer_param_shardings(params, mesh, sharding)))
  return sharded


def sharded_layer_apply(layer: LngramV2, h_BxTxD, *, mesh: Mesh, sharding: ShardingConfig,
                        segment_ids=None, valid=None, return_aux=False):
  """Run `layer` (any `LngramV2`, its arrays on `mesh` or not) under shard_map.

  The lookups' backward runs `layer.surrogate_impl`.
  """
  c = layer.config
  s = sharding
  check_surrogate_impl(layer.surrogate_impl)
  checks.check_layer_inputs(c.d_model, h_BxTxD, segment_ids, valid)
  B, T = h_BxTxD.shape[:2]
  check_layout(c, mesh, s, (B, T))
  params = nnx.to_pure_dict(nnx.state(layer))
  present = functools.partial(present_axis, mesh)
  body = functools.partial(
      _layer_body, config=c, sharding=s, return_aux=return_aux,
      surrogate_impl=layer.surrogate_impl,
      data_axis=present(s.data_axis), seq_axis=present(s.seq_axis),
      table_axis=present(s.table_axis),
      context_parallel=axis_size(mesh, s.seq_axis) > 1)
  tok = token_spec(mesh, s)
  in_specs = (layer_param_specs(params, mesh, s), token_spec(mesh, s, None),
              None if segment_ids is None else tok, None if valid is None else tok)
  out_specs = token_spec(mesh, s, None)
  if return_aux:
    per_route = route_spec if s.mode == "route_parallel" else (
        lambda m, sh, *t: token_spec(m, sh, None, *t))
    out_specs = (out_specs, {"codes": per_route(mesh, s),
                             "route_mass": token_spec(mesh, s, None),
                             "logits": per_route(mesh, s, None)})
  fn = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
  return fn(params, h_BxTxD, segment_ids, valid)


def _layer_body(params, h_BxTxD, segment_ids, valid, *, config, sharding, return_aux,
                surrogate_impl, data_axis, seq_axis, table_axis, context_parallel):
  """One shard's `core.forward`, given its pieces: lookup, readout and conv."""
  c = config
  route_parallel = sharding.mode == "route_parallel"
  # Every parameter varies with the tokens it meets (see `vary_over`).
  vary_axes = tuple(n for a in (data_axis, seq_axis) if a is not None for n in axis_names(a))
  params = jax.tree.map(lambda p: vary_over(p, vary_axes), params)
  # In the route-parallel form router_w and the tables hold this shard's routes
  # only, so the router and the lookup see R/S routes; b0 stays that of all R.
  local = core.LngramParams.from_state(params)

  h_BxTxD = h_BxTxD.astype(c.dtype)
  if route_parallel and table_axis is not None:
    # Everything before the merge is per-shard work on h; marking h varying puts
    # the backward's one psum on dh [B, T, D] instead of on dq̃ [B, T, Hq, Dr]
    # and on the router's dh separately.
    h_BxTxD = vary_over(h_BxTxD, (table_axis,))
  halo = c.max_order - 1 if context_parallel else 0

  extended = {}  # one halo exchange for all orders (the core calls lookup per order)

  def lookup(table_ExDm, logits_BxTxRxM, order):
    # Context parallel: the windows reach `halo` steps into the left shard.
    logits_ext, segment_ext, valid_ext = logits_BxTxRxM, segment_ids, valid
    if halo:
      if id(logits_BxTxRxM) not in extended:
        extended[id(logits_BxTxRxM)] = extend_tokens(
            logits_BxTxRxM, halo=halo, axis_name=seq_axis, segment_ids=segment_ids,
            valid=valid)
      logits_ext, segment_ext, valid_ext = extended[id(logits_BxTxRxM)]
    kwargs = dict(order=order, bits=c.bits, segment_ids=segment_ext, valid=valid_ext,
                  surrogate=c.surrogate, tau=c.surrogate_tau, scale=c.surrogate_scale,
                  surrogate_impl=surrogate_impl)
    if route_parallel:  # own routes only, nothing to combine
      mem = ngram_lookup(table_ExDm, logits_ext, **kwargs)
    else:  # own rows gathered, the rest psum'd in
      mem = ngram_lookup_shard(table_ExDm, logits_ext, table_axis=table_axis, **kwargs)
    return mem[:, halo:]

  readout = None  # generic: the configured form, replicated after the psum
  if route_parallel:
    readout = functools.partial(route_parallel_readout, axis_name=table_axis,
                                kernel=c.readout in ("pallas", "pallas_fused"))
  conv = functools.partial(short_conv, segment_ids=segment_ids)
  if context_parallel:
    conv = functools.partial(short_conv_with_halo, axis_name=seq_axis,
                             segment_ids=segment_ids)
  y_BxTxD, trace = core.forward(local, c, h_BxTxD, segment_ids=segment_ids, valid=valid,
                                lookup=lookup, readout=readout, conv=conv)
  if not return_aux:
    return y_BxTxD
  return y_BxTxD, core.aux_outputs(c, trace)
