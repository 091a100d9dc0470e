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
import logging
from collections.abc import Sequence
from typing import Literal, get_args

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lngram_jax.config import LngramConfig

log = logging.getLogger(__name__)

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


def rows_spec(rows: int, mesh: Mesh, axes: Sequence[str]) -> P | None:
  """A [rows, ...] table split by rows over `axes` (those of size > 1 in `mesh`), or,
  when their product does not divide `rows`, over the first alone, then the others;
  None when nothing divides (the table stays whole on every device)."""
  axes = [a for a in axes if axis_size(mesh, a) > 1]
  for group in (axes, axes[:1], axes[1:]):
    if group and rows % int(np.prod([axis_size(mesh, a) for a in group])) == 0:
      return P(tuple(group) if len(group) > 1 else group[0], None)
  return None


def layer_param_spec(path: Sequence[str], shape: Sequence[int], mesh: Mesh,
                     sharding: ShardingConfig, *,
                     at_rest: Sequence[str] | None = None) -> P | None:
  """Where one `LngramV2` parameter lives on `mesh`; `path` is its key path inside the
  layer (("tables", "0"), ("router_w",), ...).

  Tables: rows over the table axis (each shard owns whole routes); router: columns
  over table in the route-parallel form; every other parameter: None (dense and
  small: replicated by `layer_param_specs`, the caller's rule otherwise).

  `at_rest=None` gives the layout the shard_map body reads (`layer_param_specs`).
  `at_rest=(axis, ...)` gives where the parameter is stored between steps on a
  training mesh: tables split over those axes too when the rows allow (e.g. fsdp; a
  shard is gathered where it is used), replicated with a warning when nothing
  divides; axes of size 1 are left out.
  """
  table = sharding.table_axis
  if path[0] == "tables":
    if at_rest is None:
      return table_spec(mesh, sharding)
    spec = rows_spec(int(shape[0]), mesh, (table, *at_rest))
    if spec is None and axis_size(mesh, table) > 1:
      log.warning("mesh: %s has %d rows, not a multiple of the '%s' axis size %d; "
                  "replicated.", "/".join(path), shape[0], table, axis_size(mesh, table))
    return spec or P()
  if path[0] == "router_w":
    if at_rest is not None and axis_size(mesh, table) == 1:
      return P()
    return router_spec(mesh, sharding)
  return None


def layer_param_specs(params: dict, mesh: Mesh, sharding: ShardingConfig) -> dict:
  """PartitionSpecs for a pure-dict state of `LngramV2` (same tree structure), by
  `layer_param_spec`: tables and (route-parallel) the router are sharded; the dense
  projections, norms and conv are small and replicated."""

  def spec(path, leaf):
    keys = tuple(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return layer_param_spec(keys, leaf.shape, mesh, sharding) or P()

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
