"""A tiny vision-language model with Persistent Visual Memory (PVM) branches.

PVM: "Persistent Visual Memory: Sustaining Perception for Deep Generation in
LVLMs", arXiv 2605.00814. Modules: `config` (VLMConfig, vlm_config), `model`
(ViT encoder, projector, the DecoderLM of experiments.models with the branch in
its beside-FFN slot), `data` (emoji-scene batches, the resumable SceneSampler),
`cell_loss` (the stage-0 per-cell class head), `grpo` (Stage II hooks),
`analysis` / `grounding` (attention decay, accuracy by length, LogitLens,
grounding probe), `run` (the scenes of a run and `analyze`). The stages are
tasks of the trainer: experiments/tasks/vlm.py and vlm_loss.py. Configs:
experiments/configs/vlm_*.py; the command line is `lngram-exp` (train, analyze).
"""

from experiments.vlm.config import VLMConfig
from experiments.vlm.model import VLM

__all__ = ["VLM", "VLMConfig"]
