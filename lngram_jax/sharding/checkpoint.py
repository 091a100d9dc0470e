"""Orbax checkpoints of a (sharded) Lngram layer, restorable onto any mesh.

A checkpoint directory holds two items:
  params  the layer's state as a pure dict of arrays; orbax writes each shard
          from the device that holds it, so no host ever gathers a table;
  config  the `LngramConfig` as JSON, so `restore_layer` needs nothing else.

Restoring follows the flax recipe (`nnx.eval_shape` for an abstract layer,
orbax restore into its abstract state, `nnx.update`), with the target
shardings of the NEW mesh attached to the abstract arrays: orbax reads every
shard straight into the device that owns it, whatever mesh wrote it (8 → 4
devices, or one device for a notebook).

Orbax needs absolute paths; relative ones are resolved against the working
directory here.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2
from lngram_jax.sharding.layer import ShardedLngramV2
from lngram_jax.sharding.mesh import ShardingConfig, layer_param_shardings


def config_to_json(config: LngramConfig) -> dict:
  return config.to_dict()


def config_from_json(d: dict) -> LngramConfig:
  return LngramConfig.from_dict(d)


def _absolute(path) -> str:
  return os.path.abspath(os.fspath(path))


def save_layer(path, layer: LngramV2, *, force: bool = False) -> str:
  """Write `layer`'s state and config to the directory `path` (synchronously).

  Works for sharded and unsharded layers alike. Returns the absolute path.
  An existing directory is an error unless `force`.
  """
  path = _absolute(path)
  params = nnx.to_pure_dict(nnx.state(layer))
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
    ckpt.save(path, ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        config=ocp.args.JsonSave(config_to_json(layer.config))), force=force)
  return path


def read_config(path) -> LngramConfig:
  """The `LngramConfig` stored in a checkpoint."""
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
    saved = ckpt.restore(_absolute(path), ocp.args.Composite(config=ocp.args.JsonRestore()))
  return config_from_json(saved["config"])


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
  path = _absolute(path)
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
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckpt:
    restored = ckpt.restore(path, ocp.args.Composite(
        params=ocp.args.StandardRestore(target_params)))
  nnx.update(abstract, restored["params"])
  return abstract
