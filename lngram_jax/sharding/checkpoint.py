"""Checkpoints of a (sharded) Lngram layer on plain orbax, restorable onto any mesh.

`path/0/` holds the layer's state as a pure dict of arrays (`params`) and the
`LngramConfig` as JSON (`config`), the layout training runs use too, so a
layer checkpoint written by earlier versions (which also held a `meta` item)
still restores. orbax writes each shard from the device that holds it, so no
host ever gathers a table.

Restoring follows the flax recipe (`nnx.eval_shape` for an abstract layer,
orbax restore into its abstract state, `nnx.update`), with the target
shardings of the NEW mesh attached to the abstract arrays: orbax reads every
shard straight into the device that owns it, whatever mesh wrote it (8 → 4
devices, or one device for a notebook). Digests, fallback to older steps and
the other run infrastructure belong to the trainer
(`experiments.trainer.checkpoint`), not to the layer.

The one module of `lngram_jax` that imports orbax (DESIGN.md §6).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2
from lngram_jax.sharding.layer import ShardedLngramV2
from lngram_jax.sharding.mesh import ShardingConfig, layer_param_shardings

_STEP = 0  # a layer checkpoint is a one-step run


def _absolute(path) -> Path:
  return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))   # orbax needs it


def _manager(path: Path, *, create: bool) -> ocp.CheckpointManager:
  if not create and not (path / str(_STEP)).is_dir():
    raise FileNotFoundError(f"no layer checkpoint in {path} (expected {path / str(_STEP)}).")
  options = ocp.CheckpointManagerOptions(create=create, enable_async_checkpointing=False)
  return ocp.CheckpointManager(path, options=options)


def save_layer(path, layer: LngramV2, *, force: bool = False) -> str:
  """Write `layer`'s state and config to the directory `path` (synchronously).

  Works for sharded and unsharded layers alike. Returns the absolute path.
  An existing directory is an error (FileExistsError) unless `force`.
  """
  path = _absolute(path)
  if path.exists():
    if not force:
      raise FileExistsError(f"save_layer: {path} exists; pass force=True to overwrite it.")
    shutil.rmtree(path)
  manager = _manager(path, create=True)
  try:
    manager.save(_STEP, args=ocp.args.Composite(
        params=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(layer))),
        config=ocp.args.JsonSave(layer.config.to_dict())))
    manager.wait_until_finished()
  finally:
    manager.close()
  return str(path)


def read_config(path) -> LngramConfig:
  """The `LngramConfig` stored in a checkpoint."""
  manager = _manager(_absolute(path), create=False)
  try:
    restored = manager.restore(_STEP, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
  finally:
    manager.close()
  return LngramConfig.from_dict(restored["config"])


def restore_layer(path, *, mesh: Mesh | None = None, sharding: ShardingConfig | None = None,
                  device: jax.Device | None = None):
  """Rebuild the layer saved at `path`.

  Args:
    path: a directory written by `save_layer`.
    mesh: restore as a `ShardedLngramV2` laid out on this mesh (any shape the
      config allows). None: a plain `LngramV2` on one device.
    sharding: the layout on `mesh` (default `ShardingConfig()`).
    device: with `mesh` None, the device (default: the first local one).

  Returns:
    The layer, its parameters read directly into their target shards.
  """
  config = read_config(path)
  if mesh is None:
    abstract = nnx.eval_shape(lambda: LngramV2(config, rngs=nnx.Rngs(0)))
    target = SingleDeviceSharding(device or jax.local_devices()[0])
    params = nnx.to_pure_dict(nnx.state(abstract))
    shardings = jax.tree.map(lambda _: target, params)
  else:
    sharding = sharding or ShardingConfig()
    abstract = nnx.eval_shape(
        lambda: ShardedLngramV2(config, mesh=mesh, sharding=sharding, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(nnx.state(abstract))
    shardings = layer_param_shardings(params, mesh, sharding)
  target_params = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, shardings)
  manager = _manager(_absolute(path), create=False)
  try:
    restored = manager.restore(_STEP, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(target_params)))
  finally:
    manager.close()
  nnx.update(abstract, restored["params"])
  return abstract
