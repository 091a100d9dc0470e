"""The vision-language models with Persistent Visual Memory (PVM) branches.

PVM: "Persistent Visual Memory: Sustaining Perception for Deep Generation in
LVLMs", arXiv 2605.00814.

  tiny/      a tiny VLM (ViT encoder, projector, the decoder LM with PVM beside its FFN)
             for CPU experiments: the "vlm" job
  qwen3vl/   Qwen3-VL in the one stack (vision tower, multimodal RoPE, DeepStack, the
             decoder LM) with PVM: the "qwen3vl" job

Both compose the decoder of experiments.models and its beside-FFN branch slot; their jobs
(training stages, GRPO) are experiments/jobs/, their checkpoints experiments/hf/, their
analyses experiments/analysis/.
"""
