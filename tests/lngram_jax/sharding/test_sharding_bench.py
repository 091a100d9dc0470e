"""The benchmark's collective accounting: the HLO parser on a hand-written module,
and the forward bytes of both forms against their closed forms."""

from sharding_cases import CONFIG

from experiments.tools.bench.sharding import collective_bytes, hlo_bytes
from lngram_jax.sharding import ShardingConfig, make_mesh

HLO = """
  %all-reduce.1 = (f32[2,8,4]{2,1,0}, bf16[3]{0}) all-reduce(%a, %b), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %all-gather.2 = f32[8,16]{1,0} all-gather(%c), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %collective-permute.3 = s32[5]{0} collective-permute(%d), channel_id=3, source_target_pairs={{0,1}}
  %get-tuple-element.4 = f32[2,8,4]{2,1,0} get-tuple-element(%all-reduce.1), index=0
"""


def test_collective_bytes_parses_hlo():
  got = collective_bytes(HLO)
  assert got["all-reduce"] == 2 * 8 * 4 * 4 + 3 * 2
  assert got["all-gather"] == 8 * 16 * 4 // 4  # each device's piece of a group of 4
  assert got["collective-permute"] == 5 * 4
  assert got["reduce-scatter"] == got["all-to-all"] == 0


def test_forward_bytes_match_the_closed_forms():
  mesh = make_mesh(table=8)
  B, T = 2, 4
  c = CONFIG
  generic = hlo_bytes(c, mesh, ShardingConfig(mode="generic"), batch=B, steps=T, train=False)
  parallel = hlo_bytes(c, mesh, ShardingConfig(mode="route_parallel"), batch=B, steps=T,
                       train=False)
  # generic: the psum'd route tokens, R·D floats per token;
  # route-parallel: the merged state (max, sum, weighted sum), Hq·(D + 2).
  assert sum(generic.values()) == B * T * c.routes * c.route_dim * 4
  assert sum(parallel.values()) == B * T * c.q_heads * (c.route_dim + 2) * 4
