"""Configuration of `Qwen3VL`: the vision tower's fields and the text decoder's `LMConfig`.

Field names follow transformers' `Qwen3VLVisionConfig` / `Qwen3VLConfig`, so a
checkpoint's `config.json` maps one to one (experiments/hf/qwen3vl/load.py). A run
stores `Qwen3VLConfig.to_dict()` and `restore` rebuilds the model from it.
"""

from __future__ import annotations

import dataclasses

from experiments.models.config import LMConfig
from lngram_jax import dataclass_json

# transformers' names of the activations the tower uses, and ours.
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
  """The Qwen3-VL vision tower (a ViT over temporal x spatial patches).

  Attributes:
    depth, hidden_size, num_heads, intermediate_size: the ViT (LayerNorm,
      2-D rotary attention, GELU MLP with biases).
    patch_size, temporal_patch_size, in_channels: one patch is
      in_channels x temporal_patch_size x patch_size x patch_size values.
    spatial_merge_size: m; m x m neighbouring patches merge into one LM token.
    out_hidden_size: the LM width the mergers project to.
    num_position_embeddings: the learned position table (a square grid),
      interpolated bilinearly to every image's patch grid.
    deepstack_visual_indexes: ViT layers whose outputs feed a DeepStack merger;
      the k-th merger's output is added to LM layer k's output.
    hidden_act: the ViT MLP's activation ("gelu_pytorch_tanh" or "gelu").
    rope_theta: base of the 2-D rotary embedding.
    dtype, param_dtype: activation and parameter dtypes.
  """

  depth: int = 2
  hidden_size: int = 32
  num_heads: int = 2
  intermediate_size: int = 64
  patch_size: int = 4
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  in_channels: int = 3
  out_hidden_size: int = 64
  num_position_embeddings: int = 16
  deepstack_visual_indexes: tuple[int, ...] = ()
  hidden_act: str = "gelu_pytorch_tanh"
  rope_theta: float = 10000.0
  norm_eps: float = 1e-6
  dtype: object = "float32"
  param_dtype: object = "float32"

  def __post_init__(self):
    owner = "VisionConfig"
    for name in ("dtype", "param_dtype"):
      object.__setattr__(self, name, dataclass_json.as_float_dtype(owner, name,
                                                                   getattr(self, name)))
    for name in ("depth", "hidden_size", "num_heads", "intermediate_size", "patch_size",
                 "temporal_patch_size", "spatial_merge_size", "in_channels",
                 "out_hidden_size", "num_position_embeddings"):
      dataclass_json.check_positive_int(owner, name, getattr(self, name))
    dataclass_json.check_finite(owner, "rope_theta", self.rope_theta, above=0)
    dataclass_json.check_finite(owner, "norm_eps", self.norm_eps, above=0)
    if self.hidden_size % self.num_heads:
      raise ValueError(f"VisionConfig: hidden_size={self.hidden_size} must be a multiple of "
                       f"num_heads={self.num_heads}.")
    if (self.hidden_size // self.num_heads) % 4:
      raise ValueError(f"VisionConfig: head dim {self.hidden_size // self.num_heads} must be "
                       "a multiple of 4 (the 2-D rotary embedding splits it in h and w).")
    side = round(self.num_position_embeddings ** 0.5)
    if side * side != self.num_position_embeddings:
      raise ValueError(f"VisionConfig: num_position_embeddings={self.num_position_embeddings} "
                       "must be a square (a grid of learned positions).")
    indexes = tuple(self.deepstack_visual_indexes)
    if not all(dataclass_json.is_int(i) and 0 <= i < self.depth for i in indexes):
      raise ValueError(f"VisionConfig: deepstack_visual_indexes={indexes} must be ViT layers "
                       f"in [0, depth={self.depth}).")
    object.__setattr__(self, "deepstack_visual_indexes", tuple(int(i) for i in indexes))
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"VisionConfig: hidden_act={self.hidden_act!r} is not one of "
                       f"{ACTIVATIONS}.")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    """Values of one flattened patch: C·T·p·p (pixel_values' last axis)."""
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Qwen3VLConfig:
  """`Qwen3VL`: vision tower + the one decoder (with multimodal RoPE) + special ids."""

  text: LMConfig
  vision: VisionConfig
  image_token_id: int
  video_token_id: int
  vision_start_token_id: int
  vision_end_token_id: int

  def __post_init__(self):
    owner = "Qwen3VLConfig"
    if not isinstance(self.text, LMConfig) or not isinstance(self.vision, VisionConfig):
      raise ValueError(f"{owner}: text must be an LMConfig and vision a VisionConfig.")
    for name in ("image_token_id", "video_token_id", "vision_start_token_id",
                 "vision_end_token_id"):
      value = getattr(self, name)
      if not dataclass_json.is_int(value) or not 0 <= value < self.text.vocab_size:
        raise ValueError(f"{owner}: {name}={value!r} must be a token id in "
                         f"[0, vocab_size={self.text.vocab_size}).")
    if not self.text.mrope_section:
      raise ValueError(f"{owner}: text.mrope_section is empty (Qwen3-VL's decoder uses "
                       "multimodal RoPE).")
    if self.vision.out_hidden_size != self.text.d_model:
      raise ValueError(f"{owner}: vision.out_hidden_size={self.vision.out_hidden_size} must "
                       f"equal text.d_model={self.text.d_model}.")
    if len(self.vision.deepstack_visual_indexes) > self.text.n_layers:
      raise ValueError(f"{owner}: {len(self.vision.deepstack_visual_indexes)} DeepStack "
                       f"mergers but only {self.text.n_layers} text layers.")

  def replace(self, **changes) -> Qwen3VLConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["text"] = self.text.to_dict()
    d["vision"] = dataclass_json.to_json(self.vision)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> Qwen3VLConfig:
    d = dict(d)
    d["text"] = LMConfig.from_dict(d["text"])
    d["vision"] = dataclass_json.from_json(VisionConfig, d["vision"],
                                           owner="VisionConfig.from_dict")
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"Qwen3VLConfig.from_dict: unknown fields {sorted(unknown)}.")
    return cls(**d)
