"""Context parallelism (time over `seq`, ppermute halos) == the unsharded layer,
with packed segments, padding and a segment boundary at the shard cut."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from sharding_cases import (
    CONFIG,
    assert_close,
    assert_nonzero,
    mesh,
    packed_inputs,
    reference_layer,
    run,
)

from lngram_jax import LngramV2
from lngram_jax.sharding import ShardingConfig, check_layout, shard_layer
from lngram_jax.sharding.context import left_halo


def test_left_halo_reads_the_left_neighbour():
  m = mesh(seq=4, table=2)
  x = jnp.arange(2 * 12, dtype=jnp.float32).reshape(2, 12)  # 4 blocks of 3 steps

  def body(x_block):
    return left_halo(x_block, 2, axis_name="seq", fill=-1.0)

  spec = jax.sharding.PartitionSpec(None, "seq")
  halos = jax.shard_map(body, mesh=m, in_specs=spec, out_specs=spec)(x)
  want = np.concatenate([np.full((2, 2), -1.0)] + [np.asarray(x[:, 3 * i + 1:3 * i + 3])
                                                   for i in range(3)], axis=1)
  np.testing.assert_array_equal(halos, want)


def test_generic_layer_with_context_parallelism_equals_unsharded():
  layer, inputs = reference_layer(), packed_inputs()
  want = run(layer, inputs)
  # The generic form runs the configured readout after the psum: use the
  # streaming one here (its scan must type-check inside shard_map); all forms
  # are equal, so the absorbed reference still applies.
  streaming_config = CONFIG.replace(readout="streaming", route_chunk=3)
  streaming = nnx.merge(
      nnx.graphdef(nnx.eval_shape(lambda: LngramV2(streaming_config, rngs=nnx.Rngs(0)))),
      nnx.state(layer))
  sharded = shard_layer(streaming, mesh=mesh(seq=2, table=4),
                        sharding=ShardingConfig(mode="generic"))
  got = run(sharded, inputs)
  assert_close(got, want)
  assert_nonzero(want, ["grad_h", "grad/router_w", "grad/tables/0", "grad/tables/1",
                        "grad/conv_kernel"])


def test_blocks_shorter_than_the_halo_are_rejected():
  m = mesh(seq=4, table=2)
  with pytest.raises(ValueError, match=r"T/seq = 20/4 = 5 steps but the halo .* is 9 steps"):
    check_layout(CONFIG, m, ShardingConfig(), (2, 20))
