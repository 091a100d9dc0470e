"""Configuration of one PVM branch (DESIGN.md §3; the paper's §4).

Frozen and validated up front, so a bad setting fails with a message naming
the field and its value before anything is traced.

Head layout: the latent width d' splits into Hq = d'/dh query heads; the KV
heads follow the backbone's grouped-query ratio, Hkv = max(1, Hq // ratio).
For Qwen3-VL-8B (d = 4096, ffn 12288, 32/8 heads) with d' = 512, dh = 128:
Hq = 4, Hkv = 1, latent FFN width 512·12288/4096 = 1536. The latent FFN width
truncates as the authors' code does, int(d'·(ffn/d)): at Qwen3-VL-4B widths
(d = 2560, ffn 9728) that is int(1945.6) = 1945, not the rounded 1946, so
their weights load (DESIGN.md §3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from lngram_jax import dataclass_json

UP_INITS = ("normal", "zero")


@dataclasses.dataclass(frozen=True)
class PVMConfig:
  """Hyper-parameters of one PVM branch.

  Attributes:
    d_model: backbone width d (the branch reads and writes [.., d]).
    latent_dim: d', the width of the latent bottleneck (paper: 512).
    head_dim: dh of the cross-attention heads (paper: 128); d' must be a
      multiple of it.
    backbone_gqa_ratio: the backbone's query heads per KV head; the branch
      uses Hkv = max(1, Hq // ratio) KV heads.
    backbone_ffn_dim: the backbone FFN width; sets the latent FFN width
      int(d'·(ffn/d)) (truncated, as the authors' code) when `latent_ffn_dim`
      is None.
    latent_ffn_dim: the latent SwiGLU width; overrides the rule above.
    visual_dim: width of the visual embeddings the branch reads; None means
      d_model (the projected embeddings that enter the LM have width d).
    eps: RMSNorm epsilon.
    dtype, param_dtype: activation and parameter dtypes.
    init_std: normal init scale of every projection (W_up included).
    up_init: "normal" (ours: step 0 equals the base model because λ = 0, and
      the gate receives gradient) or "zero" (the official code: W_up = 0 and
      λ = 0, a stationary point; kept to reproduce and test that fact).
  """

  d_model: int
  latent_dim: int = 512
  head_dim: int = 128
  backbone_gqa_ratio: int = 1
  backbone_ffn_dim: int | None = None
  latent_ffn_dim: int | None = None
  visual_dim: int | None = None
  eps: float = 1e-6
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  init_std: float = 0.02
  up_init: str = "normal"

  def __post_init__(self):
    _positive("d_model", self.d_model)
    _positive("latent_dim", self.latent_dim)
    _positive("head_dim", self.head_dim)
    _positive("backbone_gqa_ratio", self.backbone_gqa_ratio)
    if self.backbone_ffn_dim is not None:
      _positive("backbone_ffn_dim", self.backbone_ffn_dim)
    if self.latent_ffn_dim is not None:
      _positive("latent_ffn_dim", self.latent_ffn_dim)
    if self.visual_dim is not None:
      _positive("visual_dim", self.visual_dim)
    if self.latent_ffn_dim is None and self.backbone_ffn_dim is None:
      raise ValueError(
          "PVMConfig: latent_ffn_dim=None and backbone_ffn_dim=None: give the "
          "backbone FFN width (latent FFN = latent_dim·backbone_ffn_dim/d_model) "
          "or the latent FFN width itself.")
    if self.latent_dim % self.head_dim:
      raise ValueError(
          f"PVMConfig: latent_dim={self.latent_dim} must be a multiple of "
          f"head_dim={self.head_dim} (query heads = latent_dim/head_dim).")
    if self.q_heads % self.kv_heads:
      raise ValueError(
          f"PVMConfig: query heads {self.q_heads} (latent_dim/head_dim) are not a "
          f"multiple of KV heads {self.kv_heads} (= query heads // "
          f"backbone_gqa_ratio={self.backbone_gqa_ratio}); pick another ratio.")
    if self.ffn_dim < 1:
      raise ValueError(
          f"PVMConfig: latent FFN width latent_dim·backbone_ffn_dim/d_model = "
          f"{self.latent_dim}·{self.backbone_ffn_dim}/{self.d_model} truncates to "
          f"{self.ffn_dim}; it must be >= 1.")
    if self.up_init not in UP_INITS:
      raise ValueError(f"PVMConfig: up_init={self.up_init!r} is not one of {UP_INITS}.")
    if not self.eps > 0:
      raise ValueError(f"PVMConfig: eps={self.eps} must be > 0.")
    if not self.init_std > 0:
      raise ValueError(f"PVMConfig: init_std={self.init_std} must be > 0.")
    for name in ("dtype", "param_dtype"):   # refused here, not at call time inside jax
      dataclass_json.as_float_dtype("PVMConfig", name, getattr(self, name))

  @property
  def q_heads(self) -> int:
    """Hq = d'/dh."""
    return self.latent_dim // self.head_dim

  @property
  def kv_heads(self) -> int:
    """Hkv = max(1, Hq // backbone_gqa_ratio)."""
    return max(1, self.q_heads // self.backbone_gqa_ratio)

  @property
  def ffn_dim(self) -> int:
    """F, the latent SwiGLU width."""
    if self.latent_ffn_dim is not None:
      return self.latent_ffn_dim
    # The authors' expression, evaluated in the same order: d' * (ffn / d), then
    # truncated. (Rounding gave 1946 at 4B widths: 1,536 parameters too many.)
    return int(self.latent_dim * (self.backbone_ffn_dim / self.d_model))

  @property
  def vis_dim(self) -> int:
    """Width of the visual embeddings (d_model unless `visual_dim` is set)."""
    return self.d_model if self.visual_dim is None else self.visual_dim

  def replace(self, **changes) -> PVMConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """A JSON-serialisable dict (dtypes by name): checkpoints store this."""
    return dataclass_json.to_json(self)

  @classmethod
  def from_dict(cls, d: dict):
    """Inverse of `to_dict` (of this class or a subclass); unknown fields are an error."""
    return dataclass_json.from_json(cls, d)


def _positive(name: str, value) -> None:
  dataclass_json.check_positive_int("PVMConfig", name, value)
