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

Inside the body the local parameter shards are merged into a plain `LngramV2`
whose config has the LOCAL route count, so the layer's own public pieces
(`router_logits`, `route_tokens`, `query`, `kv_weights`, `output`) run
unchanged on a shard. Gradients of replicated parameters are summed by
shard_map's transpose.

`create_sharded` builds the layer inside `nnx.jit` with sharding constraints,
so every parameter is created directly in its shards: no device ever holds a
whole table.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from lngram_jax import checks
from lngram_jax.addressing import codes_from_logits
from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2
from lngram_jax.norms import rms_norm
from lngram_jax.readout import route_mass_from_lse
from lngram_jax.sharding.context import extend_tokens, layer_output_with_halo
from lngram_jax.sharding.lookup import ngram_lookup_shard, vary_over
from lngram_jax.sharding.mesh import (
    ShardingConfig,
    axis_size,
    check_layout,
    layer_param_shardings,
    layer_param_specs,
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
               sharding: ShardingConfig | None = None, rngs: nnx.Rngs):
    sharding = sharding or ShardingConfig()
    check_layout(config, mesh, sharding)
    super().__init__(config, rngs=rngs)
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
                   rngs: nnx.Rngs) -> ShardedLngramV2:
  """A `ShardedLngramV2` whose parameters are created directly in their shards.

  With partitionable threefry (JAX's default) the values equal those of
  `LngramV2(config, rngs=...)` with the same seed.
  """

  @nnx.jit
  def create(rngs):
    return ShardedLngramV2(config, mesh=mesh, sharding=sharding, rngs=rngs)

  return create(rngs)


def shard_layer(layer: LngramV2, *, mesh: Mesh,
                sharding: ShardingConfig | None = None) -> ShardedLngramV2:
  """A `ShardedLngramV2` holding `layer`'s parameters, moved into their shards.

  For a layer built or trained on one device; its arrays are copied.
  """
  sharding = sharding or ShardingConfig()
  sharded = nnx.eval_shape(lambda: ShardedLngramV2(
      layer.config, mesh=mesh, sharding=sharding, rngs=nnx.Rngs(0)))
  params = nnx.to_pure_dict(nnx.state(layer))
  nnx.update(sharded, jax.device_put(params, layer_param_shardings(params, mesh, sharding)))
  return sharded


@functools.lru_cache(maxsize=32)
def _graphdef(config: LngramConfig):
  """The structure of a plain `LngramV2` with this config (no arrays built)."""
  return nnx.graphdef(nnx.eval_shape(lambda: LngramV2(config, rngs=nnx.Rngs(0))))


def sharded_layer_apply(layer: LngramV2, h_BxTxD, *, mesh: Mesh, sharding: ShardingConfig,
                        segment_ids=None, valid=None, return_aux=False):
  """Run `layer` (any `LngramV2`, its arrays on `mesh` or not) under shard_map."""
  c = layer.config
  s = sharding
  checks.check_layer_inputs(c.d_model, h_BxTxD, segment_ids, valid)
  B, T = h_BxTxD.shape[:2]
  check_layout(c, mesh, s, (B, T))
  params = nnx.to_pure_dict(nnx.state(layer))
  present = lambda name: name if name in mesh.axis_names else None
  body = functools.partial(
      _layer_body, config=c, sharding=s, return_aux=return_aux,
      data_axis=present(s.data_axis), seq_axis=present(s.seq_axis),
      table_axis=present(s.table_axis), table_shards=axis_size(mesh, s.table_axis),
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
                data_axis, seq_axis, table_axis, table_shards, context_parallel):
  c = config
  route_parallel = sharding.mode == "route_parallel"
  # Every parameter varies with the tokens it meets (see `vary_over`).
  vary_axes = tuple(a for a in (data_axis, seq_axis) if a is not None)
  params = jax.tree.map(lambda p: vary_over(p, vary_axes), params)
  local_config = c.replace(routes=c.routes // table_shards) if route_parallel else c
  local = nnx.merge(_graphdef(local_config), params)

  h_BxTxD = h_BxTxD.astype(c.dtype)
  if route_parallel and table_axis is not None:
    # Everything before the merge is per-shard work on h; marking h varying puts
    # the backward's one psum on dh [B, T, d] instead of on dq̃ [B, T, Hq, D]
    # and on the router's dh separately.
    h_BxTxD = vary_over(h_BxTxD, (table_axis,))
  logits_BxTxRxM = local.router_logits(h_BxTxD)  # R = this shard's routes if route-parallel
  halo = c.max_order - 1 if context_parallel else 0
  logits_ext, segment_ext, valid_ext = logits_BxTxRxM, segment_ids, valid
  if halo:
    logits_ext, segment_ext, valid_ext = extend_tokens(
        logits_BxTxRxM, halo=halo, axis_name=seq_axis, segment_ids=segment_ids,
        valid=valid)

  q_BxTxHqxDh = local.query(h_BxTxD)
  if route_parallel:
    x_BxTxRsxD = local.route_tokens(logits_ext, segment_ids=segment_ext,
                                    valid=valid_ext)[:, halo:]
    mem_hat = rms_norm(x_BxTxRsxD, local.mem_norm[...], eps=c.eps)
    w_k, w_v = local.kv_weights()
    o_BxTxHqxDh, lse_BxTxHq = route_parallel_readout(
        q_BxTxHqxDh, mem_hat, w_k, w_v, sink_logit=c.sink_logit, axis_name=table_axis)
  else:
    mems = [
        ngram_lookup_shard(table[...], logits_ext, order=n, bits=c.bits,
                           table_axis=table_axis, segment_ids=segment_ext,
                           valid=valid_ext, surrogate=c.surrogate, tau=c.surrogate_tau,
                           scale=c.surrogate_scale)
        for n, table in zip(c.orders, local.tables, strict=True)
    ]
    x_BxTxRxD = jnp.concatenate(mems, axis=-1).astype(c.dtype)[:, halo:]
    o_BxTxHqxDh, lse_BxTxHq = local.readout(q_BxTxHqxDh, x_BxTxRxD)

  if context_parallel:
    y_BxTxD = layer_output_with_halo(local, o_BxTxHqxDh, axis_name=seq_axis,
                                     segment_ids=segment_ids, valid=valid)
  else:
    y_BxTxD = local.output(o_BxTxHqxDh, segment_ids=segment_ids, valid=valid)
  if not return_aux:
    return y_BxTxD
  return y_BxTxD, {
      "codes": codes_from_logits(logits_BxTxRxM),
      "route_mass": route_mass_from_lse(lse_BxTxHq, c.sink_logit),
      "logits": logits_BxTxRxM,
  }
