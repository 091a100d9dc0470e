"""pvm_jax: Persistent Visual Memory (PVM) in JAX/Flax NNX.

Implements "Persistent Visual Memory: Sustaining Perception for Deep
Generation in LVLMs" (arXiv 2605.00814): a small cross-attention branch beside
a decoder layer's FFN that re-reads the raw visual embeddings at every text
position. Its softmax runs over the visual tokens of the image only, so the
visual signal it brings back does not dilute as the answer grows (the paper's
Theorems 3.1 and 4.1). Facts taken from the authors' code and our choices
(init, latent FFN width) are in DESIGN.md §3, deviations in §5.

Shape legend used in names throughout the package (DESIGN.md §1):
  B batch, T time (text + image positions of the LM), D model width d,
  Nv visual tokens per image, Dv visual embedding width (D by default),
  L latent width d' (512), Hq = d'/Dh query heads, Hkv KV heads,
  G = Hq/Hkv, Dh head dim (128), F latent FFN width.

Layout: `config` (PVMConfig), `attention` (visual-only cross-attention and
its reference twin), `branch` (the functional core over a dict of arrays and
the `VisualCache`), `module` (the NNX shell, `param_count`), `layers`
(injection-layer strategies), `data` (emoji scenes; needs the `vlm` extra).
"""

from pvm_jax.attention import padding_bias, visual_attention, visual_attention_reference
from pvm_jax.branch import VisualCache, latent_retrieval, pvm_forward, swiglu, visual_cache
from pvm_jax.config import PVMConfig
from pvm_jax.layers import (
    explicit_layers,
    layer_decay,
    max_decay_layers,
    peak_attention_layers,
    select_layers,
    strided_layers,
)
from pvm_jax.module import PVM, param_count

__version__ = "0.1.0"

__all__ = [
    "PVM",
    "PVMConfig",
    "VisualCache",
    "explicit_layers",
    "latent_retrieval",
    "layer_decay",
    "max_decay_layers",
    "padding_bias",
    "param_count",
    "peak_attention_layers",
    "pvm_forward",
    "select_layers",
    "strided_layers",
    "swiglu",
    "visual_attention",
    "visual_attention_reference",
    "visual_cache",
]
