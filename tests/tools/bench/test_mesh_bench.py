"""experiments.tools.bench.mesh_train: the collectives of the mesh-training step (smoke, no timing).

One compile per layout of `lm_lngram.py:smoke` with batch 8 (8 host devices from
tests/conftest.py). The bytes are read from the compiled HLO and checked against
the benchmark's first-principles prediction (its module docstring).
"""

import jax
import numpy as np
import pytest

from experiments.tools.bench import mesh_train

LAYOUTS = ["1 device", "data=8", "data=2×table=4", "data=4×fsdp=2", "data=2×seq=2×table=2"]
TABLE_LAYOUTS = ["data=2×table=4", "data=2×seq=2×table=2"]

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")


@pytest.fixture(scope="module")
def config():
  c = mesh_train.load("lm_lngram.py:smoke")
  c.data.batch_size = 8   # the smoke batch of 4 does not split over data=8
  return c


@pytest.fixture(scope="module")
def results(config):
  return mesh_train.run(config, LAYOUTS, timing=False)


def _param_bytes(config):
  built = mesh_train.build(config, {})
  return sum(x.nbytes for x in jax.tree.leaves(built.params))


def _sum(result, kind, op_name_has):
  return sum(n for k, n, _, name in result["collectives"]
             if k == kind and any(s in name for s in op_name_has))


def test_one_device_moves_nothing_and_every_mesh_moves_bytes(results):
  assert all("skipped" not in r for r in results.values()), results
  assert results["1 device"]["measured"] == dict.fromkeys(mesh_train.OPS, 0)
  assert results["1 device"]["predicted"] == dict.fromkeys(mesh_train.OPS, 0)
  for name in LAYOUTS[1:]:
    assert sum(results[name]["measured"].values()) > 0, name
    assert sum(results[name]["predicted"].values()) > 0, name


def test_data_parallel_moves_one_gradient_all_reduce(results, config):
  """data=8: predicted one all-reduce of every gradient, 4 bytes per parameter;
  measured within a factor 1.3 above it (the tied embedding's two gradient
  contributions are all-reduced separately: +32 KiB on 126 KiB = 1.25x)."""
  params = _param_bytes(config)
  r = results["data=8"]
  assert r["predicted"] == {**dict.fromkeys(mesh_train.OPS, 0), "all-reduce": params}
  measured = r["measured"]["all-reduce"]
  assert params <= measured <= 1.3 * params, (measured, params)
  assert sum(r["measured"].values()) == measured   # nothing but all-reduces


def test_table_layouts_show_the_route_parallel_merge(results, config):
  """The forward merge (pmax of m, psum of l and u) moves n·Hq·(Dr + 2)·4 bytes."""
  mem = mesh_train.lm_config(config).memory
  for name in TABLE_LAYOUTS:
    r = results[name]
    block = r["block"]
    tokens = config.data.batch_size // block.get("data", 1) * (
        config.data.seq_len // block.get("seq", 1))
    merge = _sum(r, "all-reduce", ("jvp(memory)/shard_map/pmax", "jvp(memory)/shard_map/psum"))
    assert merge == tokens * mem.q_heads * (mem.route_dim + 2) * 4, name
    assert merge > 0
  # data=2×table=4: every other all-reduce as predicted too (gradients over data with the
  # tables and router in their shards, W_Q/W_K/norms over table, the dh psum), except the
  # tied embedding's second gradient all-reduce and a few scalars.
  r = results["data=2×table=4"]
  embed = 256 * mesh_train.lm_config(config).d_model * 4
  extra = r["measured"]["all-reduce"] - r["predicted"]["all-reduce"] - embed
  assert 0 <= extra < 256, extra


def test_seq_halos_and_fsdp_gathers_are_as_predicted(results):
  seq = results["data=2×seq=2×table=2"]
  halos = _sum(seq, "collective-permute", ("shard_map/ppermute",))
  predicted = sum(t.bytes for t in seq["terms"] if "Lngram halo" in t.what)
  assert halos == predicted > 0
  fsdp = results["data=4×fsdp=2"]
  np.testing.assert_allclose(fsdp["measured"]["all-gather"], fsdp["predicted"]["all-gather"],
                             rtol=0.05)


def test_the_parser_reads_long_tuples_mesh_groups_and_singletons():
  """A long tuple counts every element (not only those after its last `/*index=*/`
  comment), `mesh[...] {axes}` groups have their size, singleton groups move nothing."""
  line = ("  %all-reduce.1 = (f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, "
          "/*index=5*/f32[4]{0}) all-reduce(%a, %b, %c, %d, %e, %f), channel_id=1, "
          "replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}, to_apply=%add")
  assert mesh_train.measured_bytes(line)["all-reduce"] == 6 * 16
  gather = ("  %ag = f32[8,4]{1,0} all-gather(%p), channel_id=2, replica_groups=mesh["
            "'axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, dimensions={0}")
  assert mesh_train.measured_bytes(gather)["all-gather"] == 8 * 4 * 4 // 2
  singleton = ("  %ar = f32[8]{0} all-reduce(%p), channel_id=3, "
               "replica_groups={{0},{1},{2},{3},{4},{5},{6},{7}}, to_apply=%add")
  assert mesh_train.measured_bytes(singleton)["all-reduce"] == 0
