"""The decoder LM: one block with two branch slots, its decode caches and sampling.

Modules: `layers` (RMSNorm, RoPE, SwiGLU, embedding), `attention` (GQA with a
KV cache), `branches` (the slot-branch protocol, `BranchContext`, the
registry and the Lngram / PVM / MLP branches), `cache` (`LayerCache`,
`DecodeCache`), `config` (`LMConfig`, `lm_config`), `block` (`Block`, the
decoder block), `lm` (`DecoderLM`), `layer_scan` (`scan=True`'s stacked runs of
blocks), `generate` (one sampler for every model), `moe/` (the MoE
FFN of `LMConfig.moe_layers`: the layer, its expert-parallel dispatch, the
exchange and the per-token reference).

Papers: "Lngram v2: Latent N-Gram Memory with Interpretable Discrete
Representations" (v1: "Lngram: N-gram Conditional Memory in Latent Space",
arXiv 2605.24869) for the memory slot; "Persistent Visual Memory: Sustaining
Perception for Deep Generation in LVLMs" (arXiv 2605.00814) for PVM beside
the FFN. Layout and slots: DESIGN.md §6.

Shape legend (DESIGN.md §1): B batch, T query time, S key/cache time, D model
width d, R routes, Hq query heads, Hkv KV heads, G = Hq/Hkv, Dh head dim,
F feed-forward width, V vocabulary, Nv visual tokens.
"""

from experiments.models.branches import (
    BranchContext,
    LngramMemory,
    ParallelMLP,
    ParallelMLPConfig,
    PVMBranch,
    PVMBranchConfig,
)
from experiments.models.cache import DecodeCache, LayerCache
from experiments.models.config import LMConfig, lm_config
from experiments.models.generate import completion_mask, generate, sample_logits
from experiments.models.lm import Block, DecoderLM, liven_lngram

__all__ = [
    "Block",
    "BranchContext",
    "DecodeCache",
    "DecoderLM",
    "LMConfig",
    "LayerCache",
    "LngramMemory",
    "PVMBranch",
    "PVMBranchConfig",
    "ParallelMLP",
    "ParallelMLPConfig",
    "completion_mask",
    "generate",
    "liven_lngram",
    "lm_config",
    "sample_logits",
]
