"""Meshes, the sharding config, and partition specs of a sharded Lngram layer.

Three mesh axes, each optional (a name missing from the mesh means size 1):

  data   the batch;
  seq    time, for context parallelism (halos exchanged with `ppermute`);
  table  table rows. Rows of route r are the contiguous range
         [r·C^n, (r+1)·C^n), so an even split of rows over the axis is an even
         split of routes: shard s owns routes [s·R/S, (s+1)·R/S) of every
         order's table, and with them every counterfactual row the surrogate
         gradient of those routes reads.

Two forms of the layer (DESIGN.md §2, sharding):

  generic         each shard gathers the rows of the routes it owns, the rest
                  are zero, and a `psum` over `table` rebuilds the route tokens
                  [B, T, R, Dr]; the readout then runs replicated.
  route_parallel  each shard routes, looks up and reads out its own routes
                  only, and returns the partial online-softmax state; shards
                  merge it with a log-sum-exp reduction (traffic Hq·Dr per token
                  instead of R·Dr). The router columns are sharded with the
                  routes (column r·M + j belongs to route r).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, get_args

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lngram_jax.config import LngramConfig

ShardingMode = Literal["generic", "route_parallel"]
MODES: tuple[str, ...] = get_args(ShardingMode)


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
  """How a layer is laid out over a mesh.

  Attributes:
    mode: "generic" (psum of gathered rows, then the readout form the
      LngramConfig names) or "route_parallel" (the absorbed readout's maths as
      partial softmax states; `LngramConfig.readout` is not consulted).
    data_axis, seq_axis, table_axis: mesh axis names of the batch, time and
      table-row (= route) dimensions; a name the mesh lacks means unsharded.
      The batch may be split over several axes: `data_axis=("data", "fsdp")`
      (a training mesh whose parameters are also sharded over `fsdp`).
  """

  mode: ShardingMode = "route_parallel"
  data_axis: str | tuple[str, ...] = "data"
  seq_axis: str = "seq"
  table_axis: str = "table"

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"ShardingConfig: mode={self.mode!r} is not one of {MODES}.")
    names = (*axis_names(self.data_axis), self.seq_axis, self.table_axis)
    if len(set(names)) != len(names):
      raise ValueError(
          f"ShardingConfig: data_axis, seq_axis, table_axis = {names} must differ.")


def make_mesh(*, data: int = 1, seq: int = 1, table: int | None = None,
              devices: Sequence[jax.Device] | None = None,
              sharding: ShardingConfig | None = None) -> Mesh:
  """A (data, seq, table) mesh over `devices` (default: all, every process).

  `table=None` takes every device that data·seq leaves.
  """
  s = sharding or ShardingConfig()
  if not isinstance(s.data_axis, str):
    raise ValueError(f"make_mesh builds one data axis; got data_axis={s.data_axis!r} (build "
                     "a mesh with several batch axes with jax.sharding.Mesh).")
  devices = list(jax.devices() if devices is None else devices)
  if data < 1 or seq < 1:
    raise ValueError(f"make_mesh: data={data} and seq={seq} must be >= 1.")
  if table is None:
    if len(devices) % (data * seq):
      raise ValueError(
          f"make_mesh: {len(devices)} devices do not split into data={data} x seq={seq}.")
    table = len(devices) // (data * seq)
  if data * seq * table != len(devices):
    raise ValueError(
        f"make_mesh: data*seq*table = {data}*{seq}*{table} = {data * seq * table} "
        f"!= {len(devices)} devices.")
  grid = np.asarray(devices, dtype=object).reshape(data, seq, table)
  return Mesh(grid, (s.data_axis, s.seq_axis, s.table_axis))


def axis_names(name: str | tuple[str, ...]) -> tuple[str, ...]:
  """A (possibly compound) axis as a tuple of mesh axis names."""
  return (name,) if isinstance(name, str) else tuple(name)


def axis_size(mesh: Mesh, name: str | tuple[str, ...]) -> int:
  """Size of a mesh axis (the product, for a tuple of axes); 1 for names the mesh
  does not have."""
  return int(np.prod([mesh.shape[n] for n in axis_names(name) if n in mesh.axis_names]))


def present_axis(mesh: Mesh, name: str | tuple[str, ...]) -> str | tuple[str, ...] | None:
  """The part of `name` that `mesh` has, as a PartitionSpec entry (None: none of it)."""
  if isinstance(name, str):
    return name if name in mesh.axis_names else None
  names = tuple(n for n in name if n in mesh.axis_names)
  return names or None


_axis = present_axis


def token_spec(mesh: Mesh, sharding: ShardingConfig, *trailing) -> P:
  """[B, T, ...] activations: batch over data, time over seq."""
  return P(_axis(mesh, sharding.data_axis), _axis(mesh, sharding.seq_axis), *trailing)


def route_spec(mesh: Mesh, sharding: ShardingConfig, *trailing) -> P:
  """[B, T, R, ...] per-route activations with routes over table."""
  return token_spec(mesh, sharding, _axis(mesh, sharding.table_axis), *trailing)


def table_spec(mesh: Mesh, sharding: ShardingConfig) -> P:
  """[R·C^n, Dm] tables: rows over table."""
  return P(_axis(mesh, sharding.table_axis), None)


def router_spec(mesh: Mesh, sharding: ShardingConfig) -> P:
  """[D, R·M] router: columns (routes) over table in the route-parallel form."""
  if sharding.mode == "route_parallel":
    return P(None, _axis(mesh, sharding.table_axis))
  return P()


def layer_param_specs(params: dict, mesh: Mesh, sharding: ShardingConfig) -> dict:
  """PartitionSpecs for a pure-dict state of `LngramV2` (same tree structure).

  Tables and (route-parallel) the router are sharded; the dense projections,
  norms and conv are small and replicated.
  """

  def spec(path, leaf):
    del leaf
    name = path[0].key
    if name == "tables":
      return table_spec(mesh, sharding)
    if name == "router_w":
      return router_spec(mesh, sharding)
    return P()

  return jax.tree_util.tree_map_with_path(spec, params)


def layer_param_shardings(params: dict, mesh: Mesh, sharding: ShardingConfig) -> dict:
  """`layer_param_specs` as NamedShardings on `mesh`."""
  return jax.tree.map(lambda p: NamedSharding(mesh, p),
                      layer_param_specs(params, mesh, sharding),
                      is_leaf=lambda x: isinstance(x, P))


def check_layout(config: LngramConfig, mesh: Mesh, sharding: ShardingConfig,
                 batch_time: tuple[int, int] | None = None) -> None:
  """Fail early, naming the numbers, when the layer cannot be laid out on `mesh`."""
  tables = axis_size(mesh, sharding.table_axis)
  if config.routes % tables:
    raise ValueError(
        f"routes={config.routes} must be a multiple of the '{sharding.table_axis}' "
        f"axis size {tables}: each table shard owns whole routes (their rows "
        "and all counterfactual rows of the surrogate).")
  if batch_time is None:
    return
  B, T = batch_time
  data = axis_size(mesh, sharding.data_axis)
  seq = axis_size(mesh, sharding.seq_axis)
  if B % data:
    raise ValueError(f"batch B={B} must be a multiple of the '{sharding.data_axis}' "
                     f"axis size {data}.")
  if T % seq:
    raise ValueError(f"time T={T} must be a multiple of the '{sharding.seq_axis}' "
                     f"axis size {seq}.")
  halo = max(config.max_order - 1, config.conv_context)
  if seq > 1 and T // seq < halo:
    raise ValueError(
        f"context parallelism: each '{sharding.seq_axis}' shard holds T/seq = "
        f"{T}/{seq} = {T // seq} steps but the halo from one left neighbour is "
        f"{halo} steps (max order - 1 = {config.max_order - 1}, conv context "
        f"(k-1)*dilation = {config.conv_context}); use fewer seq shards or longer T.")
