"""PVM on Qwen3-VL: the paper's branches added to a Qwen3VLConfig, and the CPU smoke model.

    with_pvm(config, layers, latent_dim)  the config with PVM beside the FFN at `layers`
    PAPER_LAYERS[size]                    the paper's best layers (8/16/24 of 36 at 8B,
                                          5/11/17 at 4B; DESIGN.md §3.5)
    smoke_config(processor)               a tiny random Qwen3-VL for CPU runs and tests
    authors_pvm_config(lm_config, L)      the branch the authors' block builds at latent L

Every branch width follows the authors' `PVMMemoryBlock` (`authors_pvm_config`;
their names: experiments/hf/pvm_format.py: head dim = the backbone's, KV heads by its GQA ratio, latent
FFN int(L·F/D), visual width D, the backbone's eps), so what trains here
exports to their code. The branch starts at our init (λ = 0, W_up normal):
step 0 computes the base model's logits exactly.
"""

from __future__ import annotations

from experiments.models.branches import PVMBranchConfig
from experiments.models.config import LMConfig
from experiments.vlm.qwen3vl.config import Qwen3VLConfig, VisionConfig

PAPER_LAYERS = {"8b": (8, 16, 24), "4b": (5, 11, 17)}
PAPER_LATENT = 512

# The smoke model: 2 decoder layers of width 64 (q/k norms, interleaved MRoPE over
# head_dim 16: 8 frequencies as 4 t + 2 h + 2 w), a 1-block ViT over 16-pixel patches
# with one DeepStack merger; PVM latent 32 (2 heads of 16, 1 KV head) at layer 1.
SMOKE_TEXT = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128,
                  rope_theta=5e6, tie_embeddings=True, qk_norm=True, norm_scale_in_dtype=True,
                  mrope_section=(4, 2, 2), mrope_interleaved=True, init_std=0.02)
SMOKE_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=16,
                    temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                    num_position_embeddings=16, deepstack_visual_indexes=(0,))
SMOKE_PVM = dict(layers=(1,), latent_dim=32)


def authors_pvm_config(lm_config: LMConfig, latent_dim: int) -> PVMBranchConfig:
  """The branch `PVMMemoryBlock` builds at `latent_dim` inside `lm_config`'s backbone."""
  c = lm_config
  return PVMBranchConfig(
      d_model=c.d_model, latent_dim=latent_dim, head_dim=c.head_dim,
      backbone_gqa_ratio=max(1, c.n_heads // c.n_kv_heads), backbone_ffn_dim=c.ffn_dim,
      eps=c.norm_eps, dtype=c.dtype, param_dtype=c.param_dtype)


def with_pvm(config: Qwen3VLConfig, layers, latent_dim: int) -> Qwen3VLConfig:
  """`config` with a PVM branch (the authors' widths) beside the FFN at each of `layers`."""
  text = config.text
  layers = tuple(sorted(int(i) for i in layers))
  bad = [i for i in layers if not 0 <= i < text.n_layers]
  if bad or not layers:
    raise ValueError(f"qwen3vl.pvm.layers={layers}: need one or more layers in "
                     f"0..{text.n_layers - 1}.")
  if latent_dim % text.head_dim:
    raise ValueError(f"qwen3vl.pvm.latent_dim={latent_dim} must be a multiple of the "
                     f"backbone's head_dim={text.head_dim} (the authors' block keeps it).")
  pvm = authors_pvm_config(text, latent_dim)
  return config.replace(text=text.replace(ffn_branch_layers=layers, ffn_branch=pvm))


def smoke_config(processor, *, max_len: int = 512, dtype: str = "float32") -> Qwen3VLConfig:
  """The tiny random Qwen3-VL (no PVM) for the token ids of `processor`."""
  vocab = max(processor.tokenizer.get_vocab_size(), processor.image_token_id + 1,
              processor.video_token_id or 0) + 1
  text = LMConfig(vocab_size=vocab, max_len=max_len, dtype=dtype, param_dtype=dtype,
                  **SMOKE_TEXT)
  vision = VisionConfig(out_hidden_size=text.d_model, dtype=dtype, param_dtype=dtype,
                        **SMOKE_VISION)
  return Qwen3VLConfig(text=text, vision=vision, image_token_id=processor.image_token_id,
                       video_token_id=processor.video_token_id,
                       vision_start_token_id=processor.vision_start_token_id,
                       vision_end_token_id=processor.vision_end_token_id)


def with_remat(config: Qwen3VLConfig, q) -> Qwen3VLConfig:
  """`qwen3vl.remat`: rematerialise every decoder block in the backward (the full-size
  stages keep [heads, T, T] attention probabilities of 36 layers otherwise)."""
  return config.replace(text=config.text.replace(remat=bool(q.get("remat", False))))
