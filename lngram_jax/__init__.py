"""lngram_jax: Lngram v2 latent n-gram memory in JAX/Flax NNX.

Implements "Lngram v2: Latent N-Gram Memory with Interpretable Discrete
Representations" (the successor of "Lngram: N-gram Conditional Memory in
Latent Space", arXiv 2605.24869): a router emits discrete codes per route,
exact n-grams of codes address memory tables, a grouped-query readout with a
fixed sink reads the retrieved rows, and a short conv shapes the output added
to the residual stream. The conventions shared with the authors' code (bit
and digit order, invalid windows, sink, init) are in DESIGN.md §2, the
deviations in §5.

Layout: `core` (the forward, written once, over `LngramParams`), `layer`
(the NNX shell `LngramV2`), `decode` (decode state), `sharding/` (shard_map
forms), `addressing`, `lookup` (surrogate gradients), `readout` (the forms),
`conv`, `norms`; `pallas` and `fused` glue the `kernels` package in;
`reference` holds the slow loop references of the equations that the tests
compare every form against.

Shape legend (DESIGN.md §1; one meaning per symbol):
  B batch, T time, S cache/history time, D model width d, R routes,
  M bits per route, C = 2^M codes per route, N the set of orders,
  Dm memory-entry width, Dr = |N|·Dm route-token width, Hq query heads,
  Hkv KV heads, G = Hq/Hkv, Dh head dim (Hq·Dh may differ from D), W conv taps,
  E rows of one order's table (R·C^n), H = max order - 1 history slots,
  n one order (window length).
"""

from lngram_jax.addressing import codes_from_logits, ngram_rows, window_valid
from lngram_jax.config import LngramConfig, Readout, Surrogate, sink_logit
from lngram_jax.conv import short_conv
from lngram_jax.core import LngramParams, Trace, forward
from lngram_jax.decode import (
    LngramDecodeState,
    init_decode_state,
    lngram_decode_step,
    prefill_decode_state,
)
from lngram_jax.layer import LngramV2, param_count
from lngram_jax.lookup import ngram_lookup
from lngram_jax.norms import rms_norm
from lngram_jax.readout import (
    absorbed_readout,
    literal_readout,
    mqa_sink_attention,
    route_mass_from_lse,
    sink_readout,
    streaming_readout,
)

__version__ = "0.1.0"

__all__ = [
    "LngramConfig",
    "LngramDecodeState",
    "LngramParams",
    "LngramV2",
    "Readout",
    "Surrogate",
    "Trace",
    "absorbed_readout",
    "codes_from_logits",
    "forward",
    "init_decode_state",
    "lngram_decode_step",
    "literal_readout",
    "mqa_sink_attention",
    "ngram_lookup",
    "ngram_rows",
    "param_count",
    "prefill_decode_state",
    "rms_norm",
    "route_mass_from_lse",
    "short_conv",
    "sink_logit",
    "sink_readout",
    "streaming_readout",
    "window_valid",
]
