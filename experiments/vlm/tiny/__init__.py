"""The tiny VLM: a ViT encoder, a projector and the decoder LM with PVM beside its FFN.

  config     `VLMConfig`, `vlm_config` (a config's `vlm` block -> the model config)
  model      `VLM`: the encoder, the projector, the DecoderLM (experiments.models) with the
             branch in its beside-FFN slot; prefill and decode with the visual caches
  data       emoji-scene batches, the resumable SceneSampler
  scenes     the scenes of a run
  cell_loss  the stage-0 per-cell class head

Its stages are the "vlm" job (experiments/jobs/vlm/); its analyses are experiments/analysis/
vlm.py and grounding.py.
"""

from experiments.vlm.tiny.config import VLMConfig
from experiments.vlm.tiny.model import VLM

__all__ = ["VLM", "VLMConfig"]
