"""The mixture-of-experts FFN, one concept in four modules.

`layer` (the FFN of `LMConfig.moe_layers`: `MoEConfig`, `MoEFFN`, routing, the
balance statistics and the parameter count), `parallel` (its experts over the
`expert` mesh axis: sort, exchange, grouped matmul, return), `exchange` (the
ragged all-to-all and the row permutation with their own backward rules) and
`reference` (the per-token loops every fast path is tested against).
The layer's names are re-exported here: `from experiments.models.moe import MoEFFN`.
"""

from experiments.models.moe.layer import (
    DISPATCHES,
    ROUTERS,
    ExpertBias,
    MoEConfig,
    MoEFFN,
    balance_stats,
    bias_update,
    compute_dtype,
    expert_swiglu,
    grouped_experts,
    param_count,
    route,
    routing_bias_updates,
)

__all__ = [
    "DISPATCHES",
    "ROUTERS",
    "ExpertBias",
    "MoEConfig",
    "MoEFFN",
    "balance_stats",
    "bias_update",
    "compute_dtype",
    "expert_swiglu",
    "grouped_experts",
    "param_count",
    "route",
    "routing_bias_updates",
]
