"""Pretrained Hugging Face backbones (Qwen3, Qwen3-MoE, Llama, Qwen2) in the one decoder, without torch.

Modules: `safetensors_io` (memory-mapped safetensors reading, single or
sharded, with the checks of a damaged file), `config` (config.json ->
LMConfig), `names` (HF tensor names <-> our parameter paths, with the
transposes), `load` (`load_hf`, `fill_backbone`: shape-only build, then each
tensor into its shard), `backbone` (`init_from=hf:DIR`), `run_dir`
(`import-hf`), `export` (`export-hf`), `memory_export` (Lngram v2 branches
under the authors' `RouteNgramMemoryV2` names), `tokenizer` (the run's
tokenizer.json and EOS ids for `sample`), `qwen3_moe` (Qwen3-MoE's sparse layers
and expert tensors), `qwen3vl` + `qwen3vl_names` (Qwen3-VL checkpoints into
`experiments.vlm.qwen3vl.Qwen3VL`; `vlm_logits`), `hub` (`resolve_checkpoint`: a hub id
such as `Qwen/Qwen3-0.6B`, wherever a checkpoint directory is taken, fetched into the
Hugging Face cache). Every refusal is an `HFCheckpointError` (a
ValueError) of one line. Mapping and deviations: DESIGN.md §11.
"""

from experiments.hf.config import hf_lm_config, read_config_json
from experiments.hf.hub import resolve_checkpoint
from experiments.hf.load import fill_backbone, load_hf
from experiments.hf.qwen3vl.load import load_qwen3vl, vlm_logits
from experiments.hf.safetensors_io import HFCheckpointError

__all__ = ["HFCheckpointError", "fill_backbone", "hf_lm_config", "load_hf", "load_qwen3vl",
           "read_config_json", "resolve_checkpoint", "vlm_logits"]
