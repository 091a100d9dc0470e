"""The device mesh a model is traced under (set by the training loop, read by branches).

`with layout.use(mesh):` makes every Lngram v2 branch traced inside it run its
sharded form (`lngram_jax.sharding`, route-parallel: tables split by rows over
`table`, the batch over `data` × `fsdp`, time over `seq`); outside, or on a
one-device mesh, branches run their ordinary forward. Everything else in the
model is partitioned by XLA from the shardings of its parameters and batch.
"""

from __future__ import annotations

import contextlib
import contextvars

from jax.sharding import Mesh

from lngram_jax.sharding import ShardingConfig

AXES = ("data", "fsdp", "seq", "table")   # the training mesh's axes, in this order
BATCH_AXES = ("data", "fsdp")
LNGRAM_SHARDING = ShardingConfig(mode="route_parallel", data_axis=BATCH_AXES,
                                 seq_axis="seq", table_axis="table")

_ACTIVE: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("mesh", default=None)


@contextlib.contextmanager
def use(mesh: Mesh | None):
  """Trace models on `mesh` inside this block (None: no mesh)."""
  token = _ACTIVE.set(mesh)
  try:
    yield mesh
  finally:
    _ACTIVE.reset(token)


def current() -> Mesh | None:
  """The mesh of the enclosing `use` block, whatever its size (None outside one)."""
  return _ACTIVE.get()


def active() -> Mesh | None:
  """The mesh of the enclosing `use` block if it has more than one device, else None."""
  mesh = _ACTIVE.get()
  return mesh if mesh is not None and mesh.size > 1 else None


def lngram_paths(module) -> frozenset[tuple[str, ...]]:
  """The paths (tuples of str keys) of every Lngram v2 layer inside `module`."""
  from flax import nnx

  from lngram_jax.layer import LngramV2
  return frozenset(tuple(str(k) for k in path) for path, node in nnx.iter_graph(module)
                   if isinstance(node, LngramV2))
