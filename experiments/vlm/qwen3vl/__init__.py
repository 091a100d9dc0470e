"""Qwen3-VL in the one stack: vision tower + `DecoderLM` with multimodal RoPE and DeepStack.

Modules: `config` (`Qwen3VLConfig`, `VisionConfig`), `vision` (the tower:
patch embedding, interpolated position table, 2-D rotary ViT, mergers),
`positions` (`rope_index`: transformers' [3, B, T] position ids), `model`
(`Qwen3VL`), `generate` (`sample` / `greedy_generate`: the compiled prefill and one
compiled decode loop over the KV cache, rows ending at their end token; the uncached
reference twin), `random_config` (`random_qwen3vl_config`, a CPU-sized random model
for tests and benchmarks). Inputs:
`image` (smart_resize, normalise, patchify), `conversations` (LLaVA JSONL -> examples,
collate), `emoji_jsonl` (the default data). PVM on it: `pvm` (with_pvm,
authors_pvm_config, smoke_config, PAPER_LAYERS).

Elsewhere: the checkpoint's processor and chat template, and loading and exporting
checkpoints, experiments/hf/qwen3vl/; the stages (SFT, GRPO), experiments/jobs/qwen3vl/.
Mapping and deviations: DESIGN.md §11.6.
"""
