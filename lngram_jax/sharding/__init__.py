"""Lngram v2 on a device mesh with `jax.shard_map` (DESIGN.md §2, sharding).

  mesh.py        ShardingConfig, make_mesh, partition specs, layout checks
  lookup.py      sharded_ngram_lookup: own rows gathered, psum over `table`
  readout.py     route-parallel readout: partial softmax states, lse merge
  context.py     context parallelism: ppermute halos over `seq`
  layer.py       ShardedLngramV2, create_sharded (parameters born sharded);
                 each shard runs `lngram_jax.core.forward` with its own pieces
  checkpoint.py  orbax save of sharded state, restore onto another mesh

Multi-process start-up (`jax.distributed`) is run code, not the layer's:
`experiments.trainer.multihost.initialize`; the multi-process check and the
benchmark are `experiments.tools.bench.multihost` / `.sharding`.

Every sharded function has an unsharded twin it is tested against.
"""

from lngram_jax.sharding.layer import (
    ShardedLngramV2,
    create_sharded,
    shard_layer,
    sharded_layer_apply,
)
from lngram_jax.sharding.lookup import ngram_lookup_shard, sharded_ngram_lookup
from lngram_jax.sharding.mesh import (
    ShardingConfig,
    ShardingMode,
    check_layout,
    layer_param_shardings,
    layer_param_specs,
    make_mesh,
)
from lngram_jax.sharding.readout import (
    merge_partial_attention,
    partial_sink_attention,
    partial_sink_attention_reference,
    route_parallel_readout,
    sharded_readout,
)

__all__ = [
    "ShardedLngramV2",
    "ShardingConfig",
    "ShardingMode",
    "check_layout",
    "create_sharded",
    "layer_param_shardings",
    "layer_param_specs",
    "make_mesh",
    "merge_partial_attention",
    "ngram_lookup_shard",
    "partial_sink_attention",
    "partial_sink_attention_reference",
    "route_parallel_readout",
    "shard_layer",
    "sharded_layer_apply",
    "sharded_ngram_lookup",
    "sharded_readout",
]
