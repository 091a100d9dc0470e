"""Qwen3-VL in the one stack: vision tower + `DecoderLM` with multimodal RoPE and DeepStack.

Modules: `config` (`Qwen3VLConfig`, `VisionConfig`), `vision` (the tower:
patch embedding, interpolated position table, 2-D rotary ViT, mergers),
`positions` (`rope_index`: transformers' [3, B, T] position ids), `model`
(`Qwen3VL`), `generate` (`greedy_generate` with the KV cache), `tiny`
(`tiny_config`, a CPU-sized random model). Inputs: `image` (smart_resize,
normalise, patchify), `chat` (chat-ML rendering), `processor`
(`Qwen3VLProcessor`), `conversations` (LLaVA JSONL -> examples, collate),
`emoji_jsonl` (the default data), `tiny_processor` (a tiny processor dir).
PVM on it: `pvm` (with_pvm, smoke_config, model_config, PAPER_LAYERS), `sft`
(sft_loss), `grpo` (sample_completions, sequence_inputs, token_logp,
qwen3vl_grpo_hooks).
Checkpoints: experiments/hf/qwen3vl.py. Mapping and deviations: DESIGN.md §11.6.
"""
