"""A tiny random Qwen3-VL configuration for smoke runs and tests (CPU-sized).

Two ViT layers of width 32 with two DeepStack mergers, a 3-layer decoder of
width 64 with interleaved multimodal RoPE, a 320-token vocabulary whose top ids
are the special tokens. Pass `Qwen3VLConfig` fields, or `text=` / `vision=`
dicts of field changes.
"""

from __future__ import annotations

from experiments.models.config import LMConfig
from experiments.vlm.qwen3vl.config import Qwen3VLConfig, VisionConfig

RANDOM_VOCAB = 320


def random_qwen3vl_config(*, text: dict | None = None, vision: dict | None = None,
                **overrides) -> Qwen3VLConfig:
  lm = LMConfig(vocab_size=RANDOM_VOCAB, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2,
                head_dim=16, ffn_dim=96, max_len=512, tie_embeddings=False, qk_norm=True,
                norm_scale_in_dtype=True, mrope_section=(2, 3, 3), mrope_interleaved=True)
  tower = VisionConfig(depth=2, hidden_size=32, num_heads=2, intermediate_size=48,
                       patch_size=4, temporal_patch_size=2, spatial_merge_size=2,
                       out_hidden_size=64, num_position_embeddings=16,
                       deepstack_visual_indexes=(0, 1))
  fields = dict(text=lm.replace(**(text or {})), vision=VisionConfig(**{
      **{k: getattr(tower, k) for k in tower.__dataclass_fields__}, **(vision or {})}),
      image_token_id=RANDOM_VOCAB - 2, video_token_id=RANDOM_VOCAB - 1,
      vision_start_token_id=RANDOM_VOCAB - 4, vision_end_token_id=RANDOM_VOCAB - 3)
  return Qwen3VLConfig(**{**fields, **overrides})
