"""A tiny vision-language model with Persistent Visual Memory (PVM) branches.

Modules: `config` (VLMConfig), `model` (ViT encoder, projector, the decoder
LM of experiments.models, parallel branches, prefill/decode with visual
caches), `generate` (cached sampling), `data` (emoji-scene batches), `train`
(stage 0 / Stage I with optax masks), `grpo` (Stage II), `analysis`
(attention decay, accuracy by length, LogitLens), `run` (stages from an
experiment config). Configs: experiments/configs/vlm_*.py.
"""

from experiments.vlm.config import VLMConfig
from experiments.vlm.model import VLM, ParallelMLP

__all__ = ["VLM", "ParallelMLP", "VLMConfig"]
