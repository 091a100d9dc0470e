"""The `mesh` config block: the device mesh a run trains on, and where every array lives.

    mesh.data   batch rows                              (data parallel)
    mesh.fsdp   batch rows too, and the dense parameters and their optimiser
                state split along one dimension each    (fully sharded data parallel)
    mesh.seq    time (a task whose batches are token sequences may split it:
                the LM's context parallelism); XLA partitions the rest
    mesh.table  memory tables by rows, as the task's placement rules say
    mesh.expert batch rows too, and the MoE FFN's routed experts (expert
                parallelism: the task's rules split their expert dimension and
                tokens reach their experts by all-to-all;
                experiments/models/moe/parallel.py)

Each size is a positive int or -1 (the devices the others leave; at most one -1).
On one process the mesh takes the first data·fsdp·seq·table·expert devices; across
processes it must span them all. All sizes 1 (the default) is a one-device mesh.

Placement is by parameter path (`param_specs`): the task's rule first (a
`rule(path, shape, mesh) -> PartitionSpec | None`; the LM's is
`experiments.models.layout.placement_rules`: memory tables by rows, the Lngram
router's columns by routes), then every parameter with a dimension that `fsdp`
divides split along its largest such dimension, the rest replicated. The
optimiser state follows the parameters leaf for leaf (`like_params`). Batches:
rows over data × fsdp × expert, time over seq (`batch_sharding`); with several processes
each holds only its block of rows (`process_rows`, `put_batch`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.trainer.keypaths import path_names

log = logging.getLogger("experiments")

# The training mesh's axes, in this order; `expert` last (innermost: its psum stays
# between neighbouring devices), size 1 unless asked, so older meshes are unchanged.
AXES = ("data", "fsdp", "seq", "table", "expert")
# The batch's rows split over data, fsdp and expert: on an `expert` axis every device
# routes its own tokens and the MoE layers send them to their experts by all-to-all
# (experiments/models/moe/parallel.py), so no device computes another's tokens.
BATCH_AXES = ("data", "fsdp", "expert")


def mesh_sizes(block: Mapping | None, n_devices: int) -> dict[str, int]:
  """{axis: size} from a `mesh` config block (missing block or fields: 1), -1 resolved."""
  block = dict(block or {})
  unknown = set(block) - set(AXES)
  if unknown:
    raise ValueError(f"mesh: unknown axes {sorted(unknown)}; the axes are {list(AXES)}.")
  sizes = {axis: block.get(axis, 1) for axis in AXES}
  for axis, size in sizes.items():
    if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
      raise ValueError(f"mesh.{axis}={size!r} must be a positive int or -1 (the rest).")
  rest = [a for a, s in sizes.items() if s == -1]
  if len(rest) > 1:
    raise ValueError(f"mesh: only one axis may be -1, got {rest}.")
  fixed = int(np.prod([s for s in sizes.values() if s != -1]))
  if rest:
    if n_devices % fixed:
      raise ValueError(f"mesh: {n_devices} devices do not split into "
                       f"{_describe(sizes)} (the fixed axes take {fixed}).")
    sizes[rest[0]] = n_devices // fixed
  if int(np.prod(list(sizes.values()))) != n_devices:
    raise ValueError(
        f"mesh: {_describe(sizes)} = {int(np.prod(list(sizes.values())))} devices, but there "
        f"are {n_devices} ({jax.process_count()} process(es)); set the sizes so that their "
        "product is the device count, e.g. --config.mesh.data=-1.")
  return sizes


def parse_mesh(text: str) -> dict[str, int]:
  """`data=2,table=4` (the `--mesh` flag of eval/sample) -> {"data": 2, "table": 4}."""
  block = {}
  for part in filter(None, (p.strip() for p in (text or "").split(","))):
    axis, sep, value = part.partition("=")
    axis = axis.strip()
    if sep and axis in block:
      raise ValueError(f"--mesh={text!r}: {axis} is given twice; give each axis once.")
    try:
      block[axis] = int(value)
    except ValueError:
      sep = ""
    if not sep:
      raise ValueError(f"--mesh={text!r}: write axis=size pairs, e.g. data=2,table=4 "
                       f"(axes {list(AXES)}, -1 = the rest).")
  return block


def place_model(model, mesh: Mesh, *, rules=None):
  """Moves a restored model's parameters into their shards on `mesh` (in place);
  `rules`: the model's placement rule (`param_specs`)."""
  from flax import nnx
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  placed = Placement(mesh, params, rules=rules)
  nnx.update(model, placed.put_params(params))
  return model


def _describe(sizes: Mapping[str, int]) -> str:
  return " × ".join(f"{a}={s}" for a, s in sizes.items())


def make_train_mesh(block: Mapping | None, devices=None) -> Mesh:
  """The (data, fsdp, seq, table, expert) mesh of a `mesh` block.

  With no -1 and fewer devices than this process has, the mesh takes the first
  ones: all ones (the default) is the one-device run, `data=4` on an 8-device
  host trains on 4. Across several processes the mesh must span every device.
  """
  devices = list(jax.devices() if devices is None else devices)
  block = dict(block or {})
  wanted = [block.get(a, 1) for a in AXES]
  if (-1 not in wanted and all(isinstance(n, int) and n > 0 for n in wanted)
      and jax.process_count() == 1 and int(np.prod(wanted)) < len(devices)):
    devices = devices[:int(np.prod(wanted))]
  sizes = mesh_sizes(block, len(devices))
  # mesh_utils orders devices so that the inner axes (table, seq) are the closest ones.
  try:
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh([sizes[a] for a in AXES], devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices, dtype=object).reshape([sizes[a] for a in AXES])
  return Mesh(grid, AXES)


def describe(mesh: Mesh) -> str:
  return _describe({a: int(mesh.shape[a]) for a in AXES})


# --- where parameters, optimiser state and batches live ----------------------------------------


def param_spec(path: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh, rules=None) -> P:
  """The PartitionSpec of one parameter: the task's `rules(path, shape, mesh)` if it
  names one, else split over fsdp along the largest dimension fsdp divides, else
  replicated."""
  if rules is not None:
    spec = rules(path, shape, mesh)
    if spec is not None:
      return spec
  fsdp = int(mesh.shape["fsdp"])
  if fsdp > 1:
    dims = [i for i, n in enumerate(shape) if n % fsdp == 0]
    if dims:
      dim = max(dims, key=lambda i: shape[i])
      return P(*[("fsdp" if i == dim else None) for i in range(len(shape))])
  return P()


def param_specs(params, mesh: Mesh, *, rules=None):
  """PartitionSpecs for a pure-dict parameter tree (`param_spec` of every leaf)."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: param_spec(path_names(p), tuple(x.shape), mesh, rules), params)


def shardings(specs, mesh: Mesh):
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                      is_leaf=lambda x: isinstance(x, P))


def like_params(tree, param_shardings, mesh: Mesh):
  """Shardings for a tree that holds copies of the parameters (optimiser state):
  a leaf whose path ends with a parameter's path and has its shape gets its
  sharding; every other leaf (counts, scalars) is replicated."""
  by_path = {}
  for path, sharding in jax.tree_util.tree_flatten_with_path(
      param_shardings, is_leaf=lambda x: isinstance(x, NamedSharding))[0]:
    by_path[path_names(path)] = sharding
  replicated = NamedSharding(mesh, P())

  def pick(path, leaf):
    keys = path_names(path)
    for start in range(len(keys)):
      sharding = by_path.get(keys[start:])
      if sharding is not None and len(sharding.spec) <= np.ndim(leaf):
        return sharding
    return replicated

  return jax.tree_util.tree_map_with_path(pick, tree)


def batch_sharding(mesh: Mesh, ndim: int, *, tokens: bool) -> NamedSharding:
  """Rows over data × fsdp × expert; time over seq for [B, T, ...] token arrays."""
  if ndim == 0:
    return NamedSharding(mesh, P())
  spec = [BATCH_AXES] + [None] * (ndim - 1)
  if tokens and ndim >= 2 and int(mesh.shape["seq"]) > 1:
    spec[1] = "seq"
  return NamedSharding(mesh, P(*spec))


def process_block(sharding: NamedSharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
  """The block of a global array of `shape` that this process's devices hold under
  `sharding`: per dimension, from the first to the last index any of them holds."""
  index = list(sharding.addressable_devices_indices_map(shape).values())
  block = []
  for dim, n in enumerate(shape):
    starts = [i[dim].start or 0 for i in index]
    stops = [n if i[dim].stop is None else i[dim].stop for i in index]
    block.append(slice(min(starts), max(stops)))
  return tuple(block)


def process_rows(mesh: Mesh, batch_size: int, *, tokens: bool = True) -> tuple[int, int]:
  """The rows (first, last + 1) of every global batch that this process's devices hold:
  what this process alone needs to read."""
  block = process_block(batch_sharding(mesh, 1, tokens=tokens), (batch_size,))
  return block[0].start, block[0].stop


def put_batch(batch: dict, mesh: Mesh, *, tokens: bool = True,
              rows: tuple[int, int, int] | None = None) -> dict:
  """A host batch as global device arrays; each process transfers only its own block
  (`process_block`), disjoint from the other processes' whenever the batch axes span them.

  `rows=(first, stop, global_rows)`: the host batch holds only rows first..stop-1 of the
  global batch (this process read nothing else, `process_rows`); None: every process
  holds the same whole batch.
  """

  def put(x):
    x = np.asarray(x)
    sharding = batch_sharding(mesh, x.ndim, tokens=tokens)
    if x.ndim == 0 or jax.process_count() == 1:
      return jax.device_put(x, sharding)
    shape = x.shape if rows is None else (rows[2], *x.shape[1:])
    block = process_block(sharding, shape)
    if rows is not None:
      if (block[0].start, block[0].stop) != tuple(rows[:2]) or x.shape[0] != rows[1] - rows[0]:
        raise ValueError(f"put_batch: this process holds rows {rows[:2]} of the batch but "
                         f"its devices take rows {block[0].start}:{block[0].stop}.")
      block = (slice(None), *block[1:])
    return jax.make_array_from_process_local_data(sharding, x[block], shape)

  return jax.tree.map(put, batch)


class Placement:
  """Where one run's arrays live on `mesh`: parameters and optimiser state by
  `param_specs`/`like_params`, batches by `batch_sharding`, the rest replicated."""

  def __init__(self, mesh: Mesh, params, *, rules=None):
    self.mesh = mesh
    self.replicated = NamedSharding(mesh, P())
    self.params = shardings(param_specs(params, mesh, rules=rules), mesh)

  def put_params(self, params):
    return jax.device_put(params, self.params)

  def put_replicated(self, tree):
    return jax.device_put(tree, self.replicated)

  def init_opt_state(self, tx, params):
    """`tx.init(params)` created directly in the parameters' shards."""
    abstract = jax.eval_shape(tx.init, params)
    return jax.jit(tx.init, out_shardings=like_params(abstract, self.params, self.mesh))(params)

  def step_out_shardings(self, state):
    """The train step's out_shardings: the state keeps its layout, metrics replicated."""
    opt = jax.tree.map(lambda x: x.sharding, state["opt_state"])
    return ({"params": self.params, "opt_state": opt, "step": self.replicated},
            self.replicated)

  def put_batch(self, batch, *, tokens: bool, rows=None):
    if jax.process_count() > 1 and not self._told_rows:
      self._told_rows = True
      x = next(np.asarray(v) for v in jax.tree.leaves(batch) if np.ndim(v) >= 1)
      shape = x.shape if rows is None else (rows[2], *x.shape[1:])
      block = process_block(batch_sharding(self.mesh, x.ndim, tokens=tokens), shape)
      log.info("process %d feeds rows %d:%d of every %d-row batch%s (%s)",
               jax.process_index(), block[0].start, block[0].stop, shape[0],
               f", steps {block[1].start}:{block[1].stop}" if tokens and x.ndim >= 2 else "",
               "read by this process alone" if rows is not None else
               "every process reads the whole batch")
    return put_batch(batch, self.mesh, tokens=tokens, rows=rows)

  _told_rows = False
