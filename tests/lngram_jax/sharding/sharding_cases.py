"""Shared cases of the sharding tests: a tiny layer, packed inputs, comparisons."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from tree_checks import relative_to_reference

from experiments.tools.bench.multihost import (
  CHECK_CONFIG,
  check_inputs,
  check_layer,
  flatten,
  loss_and_grads,
)
from lngram_jax.sharding import make_mesh

# R = 8 routes split over up to 8 table shards; K = 4 keeps tables at 128/512 rows;
# T = 20 so that T/2 = 10 >= the conv halo of 9 and seq=2 is allowed. The same
# problem as the multi-process check, so the reference compiles once.
CONFIG = CHECK_CONFIG


def packed_inputs():
  """Row 0: windows and conv taps straddle T/2 inside one segment, padding at
  the end; row 1: a segment boundary exactly at T/2, where a seq=2 split cuts."""
  return {k: jnp.asarray(v) for k, v in check_inputs().items()}


def reference_layer(*, wake=True):
  """The unsharded layer the sharded ones are compared with."""
  return check_layer(wake=wake)


def run(layer, inputs):
  """Loss, output and all gradients as a flat dict of host arrays."""
  return flatten(jax.device_get(loss_and_grads(layer, **inputs)))


def mesh(**axes):
  return make_mesh(**axes)


def assert_close(got: dict, want: dict, *, rtol=2e-5):
  """Every entry equal up to float32 reordering, relative to its own scale:
  |got - want| <= rtol·max(max|want|, 1e-12/rtol) + rtol·|want|."""
  assert got.keys() == want.keys()
  chex.assert_trees_all_close(*relative_to_reference(got, want, floor=1e-12 / rtol),
                              rtol=rtol, atol=rtol)


def has_spec(array, *spec):
  """Sharded as PartitionSpec(*spec) on its mesh (trailing Nones do not matter)."""
  want = jax.sharding.NamedSharding(array.sharding.mesh, jax.sharding.PartitionSpec(*spec))
  return array.sharding.is_equivalent_to(want, array.ndim)


def assert_nonzero(tree: dict, keys):
  """Guards the comparison: these gradients must actually carry signal."""
  for key in keys:
    assert np.any(np.abs(tree[key]) > 0), f"{key} is all zero"
