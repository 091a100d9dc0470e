"""lngram_jax: Lngram v2 latent n-gram memory in JAX/Flax NNX.

Shape legend used in names throughout the package:
  B batch, T time, d model width (D in `h_BxTxD`), R routes, M bits per route,
  K = 2^M codes, N the set of orders, Dm memory-entry dim d_m,
  D = |N|·d_m route-token dim, Hq query heads, Hkv KV heads, G = Hq/Hkv,
  Dh head dim with Hq·dh = d, V table rows R·K^n.
"""

from lngram_jax.addressing import codes_from_logits, ngram_rows, window_valid
from lngram_jax.config import LngramConfig, sink_logit
from lngram_jax.conv import short_conv
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
    "LngramV2",
    "absorbed_readout",
    "codes_from_logits",
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
