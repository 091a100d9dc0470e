"""Parameters born sharded; plain orbax save on 8 devices, restore on 4 and on 1."""

import chex
import jax
import numpy as np
import pytest
from flax import nnx
from sharding_cases import CONFIG, has_spec, mesh, packed_inputs, reference_layer

from lngram_jax import LngramV2
from lngram_jax.sharding import ShardedLngramV2, ShardingConfig, create_sharded
from lngram_jax.sharding.checkpoint import read_config, restore_layer, save_layer


def _params(layer):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(layer)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  layer = create_sharded(CONFIG, mesh=mesh(table=8), rngs=nnx.Rngs(0))
  path = save_layer(tmp_path_factory.mktemp("ckpt") / "layer", layer)
  return layer, path


def test_parameters_are_created_in_their_shards(saved):
  layer, _ = saved
  table = layer.tables[1][...]
  assert has_spec(table, "table", None)
  # Each device holds its 1/8 of the rows, never the whole table.
  assert {s.data.shape for s in table.addressable_shards} == {(CONFIG.table_rows(3) // 8, 8)}
  assert has_spec(layer.router_w[...], None, "table")
  assert has_spec(layer.w_q[...])
  plain = reference_layer(wake=False)  # the same seed, on one device
  chex.assert_trees_all_close(_params(layer), _params(plain), rtol=1e-6, atol=1e-8)


def test_restore_onto_four_devices_and_onto_one(saved):
  layer, path = saved
  assert read_config(path) == CONFIG
  four = restore_layer(path, mesh=mesh(table=4, devices=jax.devices()[:4]),
                       sharding=ShardingConfig(mode="generic"))
  one = restore_layer(path)
  assert isinstance(four, ShardedLngramV2) and type(one) is LngramV2
  assert has_spec(four.tables[0][...], "table", None)
  assert {s.device for s in four.tables[0][...].addressable_shards} == set(jax.devices()[:4])
  assert has_spec(four.router_w[...])  # the generic form keeps it whole
  assert one.tables[0][...].sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for restored in (four, one):
    chex.assert_trees_all_equal(_params(restored), _params(layer))

  # The restored layers run and agree, diagnostics included.
  inputs = packed_inputs()

  def forward(layer):
    return nnx.jit(lambda m, h: m(h, segment_ids=inputs["segment_ids"], valid=inputs["valid"],
                                  return_aux=True))(layer, inputs["h"])

  (y4, aux4), (y1, aux1) = forward(four), forward(one)
  np.testing.assert_allclose(y4, y1, rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(aux4["codes"], aux1["codes"])
  np.testing.assert_allclose(aux4["route_mass"], aux1["route_mass"], rtol=1e-5)
  np.testing.assert_allclose(aux4["logits"], aux1["logits"], rtol=1e-5, atol=1e-6)


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  layer = nnx.jit(lambda: LngramV2(CONFIG.replace(routes=2), rngs=nnx.Rngs(1)))()
  path = save_layer("relative_ckpt", layer)
  assert path == str(tmp_path / "relative_ckpt")
  jax.tree.map(np.testing.assert_array_equal, _params(restore_layer("relative_ckpt")),
               _params(layer))


def test_a_layer_checkpoint_of_the_earlier_format_still_restores(saved, tmp_path):
  """Layer checkpoints used to be written through the run Checkpointer (params, config
  and meta with digests); plain orbax reads them onto another mesh. The digests
  themselves are the trainer's (tests/experiments/trainer/test_checkpoint.py: a flipped byte in
  a shard is caught on another mesh)."""
  from experiments.trainer.checkpoint import Checkpointer

  layer, _ = saved
  old = tmp_path / "old_layer"
  with Checkpointer(old, max_to_keep=None, async_save=False) as ckpt:
    ckpt.save(0, params=nnx.to_pure_dict(nnx.state(layer)), config=layer.config.to_dict())
  assert read_config(old) == CONFIG
  four = restore_layer(old, mesh=mesh(table=4, devices=jax.devices()[:4]),
                       sharding=ShardingConfig(mode="generic"))
  jax.tree.map(np.testing.assert_array_equal, _params(four), _params(layer))


def test_an_existing_path_is_kept_unless_forced(saved, tmp_path):
  layer, path = saved
  with pytest.raises(FileExistsError, match="force=True"):
    save_layer(path, layer)
  with pytest.raises(FileNotFoundError, match="no layer checkpoint"):
    restore_layer(tmp_path / "nothing")
  copy = save_layer(tmp_path / "copy", layer)
  assert save_layer(copy, layer, force=True) == copy
  jax.tree.map(np.testing.assert_array_equal, _params(restore_layer(copy)), _params(layer))
