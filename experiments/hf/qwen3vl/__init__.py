"""Qwen3-VL checkpoints (with the PVM authors' branches) into and out of
`experiments.vlm.qwen3vl.Qwen3VL`, and the checkpoint's processor.

  load            `load_qwen3vl`, `qwen3vl_config`, `vlm_logits`: a checkpoint directory in
  names           the tensor name table: HF names <-> our parameter paths
  export          a run back to the checkpoint layout transformers (and the authors) load
  moe             Qwen3-VL-MoE (Qwen3-VL-30B-A3B): its config fields and fused expert layouts
  processor       `Qwen3VLProcessor`: the checkpoint's tokenizer, image and chat template
  chat            the checkpoint's chat template, rendered with jinja2 as transformers does
  synthetic_processor  writes a tiny processor directory (CPU smoke runs, tests)

Mapping and deviations: DESIGN.md §11.6.
"""

from experiments.hf.qwen3vl.load import is_qwen3vl, load_qwen3vl, qwen3vl_config, vlm_logits

__all__ = ["is_qwen3vl", "load_qwen3vl", "qwen3vl_config", "vlm_logits"]
