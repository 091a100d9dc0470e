"""The decoder LM with Lngram v2 layers, its decode caches and sampling."""

from experiments.models.cache import DecodeCache, LayerCache
from experiments.models.config import LMConfig
from experiments.models.generate import generate, sample_logits
from experiments.models.lm import Block, DecoderLM, liven_lngram

__all__ = [
    "Block",
    "DecodeCache",
    "DecoderLM",
    "LMConfig",
    "LayerCache",
    "generate",
    "liven_lngram",
    "sample_logits",
]
