"""Where a model's arrays live on a training mesh, and how its Lngram layers split.

The mesh is passed explicitly: `BranchContext(mesh=...)` (experiments/models/
branches.py) makes every Lngram v2 branch of a forward run its sharded form
(`lngram_jax.sharding`, route-parallel: tables split by rows over `table`, the
batch over `data` × `fsdp` × `expert`, time over `seq`); without one, or on a one-device
mesh, branches run their ordinary forward. Everything else in the model is
partitioned by XLA from the shardings of its parameters and batch.

`placement_rules(module)` is the model's part of the trainer's placement
(experiments/trainer/placement.py): memory tables by rows, Lngram layers by
their own rules (`lngram_jax.sharding.layer_param_spec`), the MoE FFN's routed
experts by their expert dimension over `expert` (experiments/models/moe/parallel.py)
and, at rest, by a width over `fsdp`.
"""

from __future__ import annotations

from collections.abc import Callable

from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from lngram_jax.sharding import ShardingConfig
from lngram_jax.sharding.mesh import layer_param_spec, rows_spec

# The trainer's mesh axes (experiments/trainer/placement.py AXES) as the layer names them:
# the batch's rows over data, fsdp and expert (experiments/models/moe/parallel.py).
BATCH_AXES = ("data", "fsdp", "expert")
LNGRAM_SHARDING = ShardingConfig(mode="route_parallel", data_axis=BATCH_AXES,
                                 seq_axis="seq", table_axis="table")

EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")   # MoEFFN's [E, ., .] weights
Rule = Callable[[tuple[str, ...], tuple[int, ...], Mesh], P | None]


def check_expert_axis(n_experts: int, mesh) -> None:
  """Refuses an `expert` axis that does not divide the experts."""
  n = int(dict(mesh.shape).get("expert", 1))
  if n > 1 and n_experts % n:
    raise ValueError(f"n_experts={n_experts} must be a multiple of mesh.expert={n} "
                     "(each device holds whole experts).")


def sharded(mesh: Mesh | None) -> Mesh | None:
  """`mesh` if a forward on it runs the sharded branches (more than one device), else None."""
  return mesh if mesh is not None and mesh.size > 1 else None


def lngram_paths(module) -> frozenset[tuple[str, ...]]:
  """The paths (tuples of str keys) of every Lngram v2 layer inside `module`."""
  from flax import nnx

  from lngram_jax.layer import LngramV2
  return frozenset(tuple(str(k) for k in path) for path, node in nnx.iter_graph(module)
                   if isinstance(node, LngramV2))


def _experts_spec(shape, mesh) -> P:
  """[E, ., .] experts over `expert`; at rest also over `fsdp` along the larger of the
  other two dimensions it divides (gathered where the layer runs, like every fsdp
  parameter: the exchange's shard_map takes whole experts)."""
  fsdp = int(mesh.shape.get("fsdp", 1))
  dims = [i for i in (1, 2) if fsdp > 1 and int(shape[i]) % fsdp == 0]
  spec = ["expert", None, None]
  if dims:
    spec[max(dims, key=lambda i: int(shape[i]))] = "fsdp"
  return P(*spec)


def placement_rules(module) -> Rule:
  """The placement rule of `module`'s parameters: `rule(path, shape, mesh)` -> a
  PartitionSpec, or None for the trainer's default (fsdp / replicated).

  Lngram v2 layers follow `layer_param_spec` (tables by rows over table and fsdp,
  the router's columns with their routes); every other memory branch's tables
  (`.../memory/tables/<j>`, [rows, width]) split by rows the same way. The MoE
  FFN's `mlp/w_gate`, `mlp/w_up`, `mlp/w_down` ([E, ., .]) split their experts over
  `expert` when that axis has more than one device (its size must divide E), and at
  rest over `fsdp` too (`_experts_spec`).
  """
  layers = lngram_paths(module)

  def rule(path, shape, mesh):
    for layer in layers:
      if path[:len(layer)] == layer:
        return layer_param_spec(path[len(layer):], shape, mesh, LNGRAM_SHARDING,
                                at_rest=("fsdp",))
    if "memory" in path and len(path) >= 2 and path[-2] == "tables" and len(shape) == 2:
      return rows_spec(int(shape[0]), mesh, ("table", "fsdp")) or P()
    if (len(path) >= 2 and path[-2] == "mlp" and path[-1] in EXPERT_WEIGHTS
        and len(shape) == 3 and int(mesh.shape.get("expert", 1)) > 1):
      check_expert_axis(int(shape[0]), mesh)
      return _experts_spec(shape, mesh)
    return None

  return rule
