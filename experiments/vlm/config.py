"""Configuration of the tiny vision-language model (VLM), with a JSON round trip.

A VLM is a small ViT patch encoder + a projector + the decoder LM of
experiments/models, with an optional parallel branch beside the FFN at
chosen layers (DESIGN §3):

    branch = "pvm"   Persistent Visual Memory (pvm_jax.PVM);
    branch = "mlp"   the iso-parameter baseline: a gated, text-masked parallel
                     SwiGLU with no cross-attention, sized to PVM's parameter count;
    branch = "none"  the base model.

`pvm_source` chooses what PVM reads: "raw" (the projected visual embeddings
that enter the LM, the paper's design) or "hidden" (the baseline that reads
the LM's processed hidden states at the image positions of that layer).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from experiments.models.config import LMConfig
from pvm_jax.config import PVMConfig
from pvm_jax.module import param_count

BRANCHES = ("none", "pvm", "mlp")
SOURCES = ("raw", "hidden")


@dataclasses.dataclass(frozen=True)
class VLMConfig:
  """Hyper-parameters of `VLM`.

  Attributes:
    lm: the decoder LM (byte vocabulary; no Lngram layers here).
    image_hw: (height, width) of the RGB images in pixels.
    patch_size: square ViT patch side; Nv = (H/P)·(W/P) visual tokens.
    vit_dim, vit_layers, vit_heads, vit_ffn: the encoder.
    visual_pos: add a learned per-slot embedding to the projected visual
      tokens (the LM-side visual position; see `Projector`). What enters the
      LM, and what PVM reads as its raw visual embeddings, includes it.
    branch: "none", "pvm" or "mlp" (see module doc).
    branch_layers: decoder layers that get the branch.
    pvm: the PVM config (branch "pvm", and the size target of "mlp").
    pvm_source: "raw" or "hidden".
    mlp_dim: hidden width of the "mlp" branch; None = iso-parameter with PVM.
  """

  lm: LMConfig
  image_hw: tuple[int, int] = (48, 48)
  patch_size: int = 16
  vit_dim: int = 64
  vit_layers: int = 2
  vit_heads: int = 2
  vit_ffn: int = 128
  visual_pos: bool = False
  branch: str = "none"
  branch_layers: tuple[int, ...] = ()
  pvm: PVMConfig | None = None
  pvm_source: str = "raw"
  mlp_dim: int | None = None

  def __post_init__(self):
    object.__setattr__(self, "image_hw", tuple(int(v) for v in self.image_hw))
    object.__setattr__(self, "branch_layers", tuple(int(i) for i in self.branch_layers))
    if self.lm.lngram_layers:
      raise ValueError(f"VLMConfig: lm.lngram_layers={self.lm.lngram_layers} must be empty "
                       "(the VLM backbone has no Lngram branch).")
    H, W = self.image_hw
    if H % self.patch_size or W % self.patch_size:
      raise ValueError(f"VLMConfig: image_hw={self.image_hw} must be multiples of "
                       f"patch_size={self.patch_size}.")
    if self.vit_dim % self.vit_heads:
      raise ValueError(f"VLMConfig: vit_dim={self.vit_dim} must be a multiple of "
                       f"vit_heads={self.vit_heads}.")
    if self.branch not in BRANCHES:
      raise ValueError(f"VLMConfig: branch={self.branch!r} is not one of {BRANCHES}.")
    if self.pvm_source not in SOURCES:
      raise ValueError(f"VLMConfig: pvm_source={self.pvm_source!r} is not one of {SOURCES}.")
    bad = [i for i in self.branch_layers if not 0 <= i < self.lm.n_layers]
    if bad or len(set(self.branch_layers)) != len(self.branch_layers):
      raise ValueError(f"VLMConfig: branch_layers={self.branch_layers} must be distinct "
                       f"layers in [0, n_layers={self.lm.n_layers}).")
    if self.branch == "none" and self.branch_layers:
      raise ValueError(f"VLMConfig: branch='none' but branch_layers={self.branch_layers}.")
    if self.branch != "none":
      if not self.branch_layers:
        raise ValueError(f"VLMConfig: branch={self.branch!r} needs branch_layers.")
      if self.pvm is None:
        raise ValueError(f"VLMConfig: branch={self.branch!r} needs a pvm config (the 'mlp' "
                         "branch is sized to PVM's parameter count).")
      if self.pvm.d_model != self.lm.d_model or self.pvm.vis_dim != self.lm.d_model:
        raise ValueError(f"VLMConfig: pvm.d_model={self.pvm.d_model} and its visual width "
                         f"{self.pvm.vis_dim} must equal lm.d_model={self.lm.d_model}.")

  @property
  def n_visual(self) -> int:
    H, W = self.image_hw
    return (H // self.patch_size) * (W // self.patch_size)

  @property
  def iso_mlp_dim(self) -> int:
    """Hidden width F of the parallel SwiGLU with 3·d·F + 1 ≈ PVM's parameter count."""
    if self.mlp_dim is not None:
      return self.mlp_dim
    total = param_count(self.pvm)["total"]
    return max(1, round((total - 1) / (3 * self.lm.d_model)))

  def replace(self, **changes) -> VLMConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["lm"] = self.lm.to_dict()
    d["image_hw"] = list(self.image_hw)
    d["branch_layers"] = list(self.branch_layers)
    if self.pvm is not None:
      p = dataclasses.asdict(self.pvm)
      p["param_dtype"] = _dtype_name(self.pvm.param_dtype)
      p["dtype"] = _dtype_name(self.pvm.dtype)
      d["pvm"] = p
    return d

  @classmethod
  def from_dict(cls, d: dict) -> VLMConfig:
    d = dict(d)
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f"VLMConfig.from_dict: unknown fields {unknown}.")
    d["lm"] = LMConfig.from_dict(d["lm"])
    if d.get("pvm") is not None:
      p = dict(d["pvm"])
      p["dtype"], p["param_dtype"] = jnp.dtype(p["dtype"]), jnp.dtype(p["param_dtype"])
      d["pvm"] = PVMConfig(**p)
    return cls(**d)


def _dtype_name(dtype) -> str:
  return jnp.dtype(dtype).name
