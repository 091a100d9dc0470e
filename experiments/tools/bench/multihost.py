"""A multi-process check of the sharded Lngram layer over `jax.distributed`.

    python -m experiments.tools.bench.multihost --data 2 [--coordinator host0:1234
        --num-processes 2 --process-id 0|1] [--out result.npz]

Every process calls `experiments.trainer.multihost.initialize`, builds a mesh
over all processes' devices and runs a small sharded forward + backward of the
layer; process 0 writes the gathered loss, output and gradients.
`reference_step` computes the same unsharded in one process, and a test
compares the two files' contents.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.trainer.multihost import initialize
from lngram_jax.config import LngramConfig
from lngram_jax.layer import LngramV2

# The check: a small problem every process builds identically.

CHECK_CONFIG = LngramConfig(
    d_model=16, routes=8, bits=2, orders=(2, 3), mem_dim=8, q_heads=4, kv_heads=2,
    head_dim=4, surrogate="exact")
CHECK_SEED = 0


def check_inputs(batch: int = 2, time: int = 20) -> dict[str, np.ndarray]:
  """h, packed segment ids, a padding mask and a loss weight, the same everywhere.

  Row 0 has a segment boundary at 14 (n-gram windows and conv taps straddle
  a seq=2 split at time/2 inside one segment) and two padding steps at the
  end; every other row has its boundary exactly at the split.
  """
  rng = np.random.default_rng(3)
  c = CHECK_CONFIG
  segment_ids = np.zeros((batch, time), np.int32)
  segment_ids[0, 14:] = 1
  segment_ids[1:, time // 2:] = 1
  valid = np.ones((batch, time), bool)
  valid[0, time - 2:] = False
  return {
      "h": rng.standard_normal((batch, time, c.d_model)).astype(np.float32),
      "segment_ids": segment_ids,
      "valid": valid,
      "w": rng.standard_normal((batch, time, c.d_model)).astype(np.float32),
  }


@nnx.jit
def wake_zero_init(layer):
  """Give W_O and the conv (zero at init) fixed nonzero values, in place.

  At init they are zero, so the conv and everything behind W_O would carry no
  signal and no gradient: a comparison of two layers would not see them.
  """
  layer.w_o[...] = 0.3 * jax.random.normal(jax.random.key(11), layer.w_o.shape)
  layer.conv_kernel[...] = 0.3 * jax.random.normal(jax.random.key(12), layer.conv_kernel.shape)


@nnx.jit
def loss_and_grads(layer, h, segment_ids, valid, w):
  """loss = Σ w·layer(h), the output y and the gradients of every parameter and h."""

  def loss_fn(layer, h):
    y = layer(h, segment_ids=segment_ids, valid=valid)
    return jnp.sum(y * w), y

  (loss, y), (g_layer, g_h) = nnx.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
      layer, h)
  return {"loss": loss, "y": y, "grad_h": g_h, "grad": nnx.to_pure_dict(nnx.state(g_layer))}


@nnx.jit
def _new_check_layer():
  return LngramV2(CHECK_CONFIG, rngs=nnx.Rngs(CHECK_SEED))


def check_layer(*, wake: bool = True) -> LngramV2:
  """The check's unsharded layer; `wake` gives W_O and the conv nonzero values."""
  layer = _new_check_layer()
  if wake:
    wake_zero_init(layer)
  return layer


def reference_step() -> dict[str, np.ndarray]:
  """The check's loss, output and gradients with the unsharded `LngramV2`."""
  layer = check_layer()
  inputs = {k: jnp.asarray(v) for k, v in check_inputs().items()}
  return flatten(jax.device_get(loss_and_grads(layer, **inputs)))


def sharded_step(mesh, sharding) -> dict[str, np.ndarray]:
  """The same on `mesh` (may span processes); results gathered to every host."""
  from jax.experimental import multihost_utils
  from jax.sharding import NamedSharding

  from lngram_jax.sharding.layer import create_sharded
  from lngram_jax.sharding.mesh import token_spec

  layer = create_sharded(CHECK_CONFIG, mesh=mesh, sharding=sharding,
                         rngs=nnx.Rngs(CHECK_SEED))
  wake_zero_init(layer)
  inputs = {}
  for name, value in check_inputs().items():
    spec = token_spec(mesh, sharding, *([None] * (value.ndim - 2)))
    inputs[name] = jax.make_array_from_callback(
        value.shape, NamedSharding(mesh, spec), lambda index, v=value: v[index])
  out = loss_and_grads(layer, **inputs)
  return flatten(multihost_utils.process_allgather(out, tiled=True))


def flatten(tree) -> dict[str, np.ndarray]:
  """{'grad/tables/0': array, ...} for np.savez and comparisons."""
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = "/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)
    flat[key] = np.asarray(leaf)
  return flat


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--coordinator", help="host:port of process 0 "
                      "(default: JAX_COORDINATOR_ADDRESS)")
  parser.add_argument("--num-processes", type=int)
  parser.add_argument("--process-id", type=int)
  parser.add_argument("--mode", default="route_parallel",
                      choices=("generic", "route_parallel"))
  parser.add_argument("--data", type=int, default=2, help="data axis size")
  parser.add_argument("--seq", type=int, default=1, help="seq axis size")
  parser.add_argument("--out", help="write the gathered results here (.npz, process 0)")
  parser.add_argument("--timeout", type=int, default=300,
                      help="seconds to wait for the other processes at start-up")
  args = parser.parse_args(argv)
  initialize(args.coordinator, args.num_processes, args.process_id, timeout_s=args.timeout)

  from lngram_jax.sharding.mesh import ShardingConfig, make_mesh

  sharding = ShardingConfig(mode=args.mode)
  mesh = make_mesh(data=args.data, seq=args.seq, sharding=sharding)
  result = sharded_step(mesh, sharding)
  print(f"process {jax.process_index()}/{jax.process_count()}: "
        f"{jax.local_device_count()} local of {jax.device_count()} devices, "
        f"mesh {dict(mesh.shape)}, loss {float(result['loss']):.6f}", flush=True)
  if args.out and jax.process_index() == 0:
    np.savez(os.path.abspath(args.out), **result)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
