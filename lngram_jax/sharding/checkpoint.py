"""Checkpoints of a (sharded) Lngram layer, restorable onto any mesh.

The format is the project's one checkpoint format (`lngram_jax.checkpoint`):
`path/0/` holds the layer's state as a pure dict of arrays (`params`), the
`LngramConfig` as JSON (`config`) and the per-array digests (`meta`). orbax
writes each shard from the device that holds it, and the digests are computed
shard by shard, so no host ever gathers a table.

Restoring follows the flax recipe (`nnx.eval_shape` for an abstract layer,
orbax restore into its abstract state, `nnx.update`), with the target
shardings of the NEW mesh attached to the abstract arrays: orbax reads every
shard straight into the device that owns it, whatever mesh wrote it (8 → 4
devices, or one device for a notebook), and the digests, being independent of
the layout, still verify.
"""

from __future__ import annotations

import shutil

import jax
from flax import nnx
from jax.sharding import Mesh, SingleDeviceSharding

from lngram_jax.checkpoint import Checkpointer, CheckpointError, absolute
from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2
from lngram_jax.sharding.layer import ShardedLngramV2
from lngram_jax.sharding.mesh import ShardingConfig, layer_param_shardings

_STEP = 0  # a layer checkpoint is a one-step run


def save_layer(path, layer: LngramV2, *, force: bool = False) -> str:
  """Write `layer`'s state and config to the directory `path` (synchronously).

  Works for sharded and unsharded layers alike. Returns the absolute path.
  An existing directory is an error unless `force`.
  """
  path = absolute(path)
  if path.exists():
    if not force:
      raise CheckpointError(f"save_layer: {path} exists; pass force=True to overwrite it.")
    shutil.rmtree(path)
  with Checkpointer(path, max_to_keep=None, async_save=False) as ckpt:
    ckpt.save(_STEP, params=nnx.to_pure_dict(nnx.state(layer)),
              config=layer.config.to_dict())
  return str(path)


def read_config(path) -> LngramConfig:
  """The `LngramConfig` stored in a checkpoint."""
  with Checkpointer(path, async_save=False, create=False) as ckpt:
    return LngramConfig.from_dict(ckpt.read_json(_STEP, "config"))


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
    The layer, its parameters read directly into their target shards and
    checked against the digests recorded at save time.
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
  with Checkpointer(path, async_save=False, create=False) as ckpt:
    restored = ckpt.restore_step(_STEP, abstract_params=target_params)
  nnx.update(abstract, restored["params"])
  return abstract
