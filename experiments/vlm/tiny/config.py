"""Configuration of the tiny vision-language model (VLM), with a JSON round trip.

A VLM is a small ViT patch encoder + a projector + the decoder LM of
experiments/models, whose beside-FFN slot holds a parallel branch at chosen
layers (DESIGN.md §3; PVM, arXiv 2605.00814, §4):

    branch = "pvm"   Persistent Visual Memory (pvm_jax.PVM);
    branch = "mlp"   the iso-parameter baseline: a gated, text-masked parallel
                     SwiGLU with no cross-attention, sized to PVM's parameter count;
    branch = "none"  the base model.

`pvm_source` chooses what PVM reads: "raw" (the projected visual embeddings
that enter the LM, the paper's design) or "hidden" (the baseline that reads
the LM's processed hidden states at the image positions of that layer).
`VLMConfig.decoder` is the LMConfig of the VLM's DecoderLM: `lm` with the
branch in its `ffn_branch` slot. `vlm_config(experiment_config)` converts the
`vlm` block of an experiment config (experiments/configs/vlm_*.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from experiments.models import branches
from experiments.models.config import LMConfig, lm_config
from lngram_jax import dataclass_json
from pvm_jax.config import PVMConfig
from pvm_jax.layers import select_layers
from pvm_jax.module import param_count

BRANCHES = ("none", "pvm", "mlp")
SOURCES = branches.SOURCES


@dataclasses.dataclass(frozen=True)
class VLMConfig:
  """Hyper-parameters of `VLM`.

  Attributes:
    lm: the decoder backbone (byte vocabulary); its memory slot may hold a
      branch (e.g. Lngram), its beside-FFN slot must be empty: the branch
      fields below fill it (see `decoder`).
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
    if self.lm.ffn_branch is not None or self.lm.ffn_branch_layers:
      raise ValueError("VLMConfig: lm.ffn_branch / lm.ffn_branch_layers must be empty; "
                       "branch, branch_layers, pvm, pvm_source and mlp_dim set that slot.")
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

  @property
  def decoder(self) -> LMConfig:
    """The LMConfig of the VLM's DecoderLM: `lm` with the branch beside the FFN."""
    if self.branch == "none":
      return self.lm
    if self.branch == "pvm":
      branch = branches.PVMBranchConfig(**{**dataclasses.asdict(self.pvm),
                                           "source": self.pvm_source})
    else:
      branch = branches.ParallelMLPConfig(d_model=self.lm.d_model, hidden_dim=self.iso_mlp_dim)
    return self.lm.replace(ffn_branch_layers=self.branch_layers, ffn_branch=branch)

  def replace(self, **changes) -> VLMConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """A JSON-serialisable dict: the LM's and PVM's configs nested as their own dicts."""
    return dataclass_json.to_json(self)

  @classmethod
  def from_dict(cls, d: dict) -> VLMConfig:
    """Inverse of `to_dict`; unknown fields are an error, not silently dropped."""
    nested = {"lm": LMConfig.from_dict(d["lm"])} if "lm" in d else {}
    if d.get("pvm") is not None:
      # Read as the branch config (a saved "source" key is accepted), kept as PVMConfig.
      p = branches.PVMBranchConfig.from_dict(d["pvm"])
      nested["pvm"] = PVMConfig(**{f.name: getattr(p, f.name)
                                   for f in dataclasses.fields(PVMConfig)})
    return dataclass_json.from_json(cls, d, owner="VLMConfig.from_dict", **nested)


def vlm_config(config) -> VLMConfig:
  """The VLMConfig an experiment config describes (`model` + the grouped `vlm` block).

  vlm.branch.layer_strategy "peak" / "max_decay" read the measured visual
  attention of an earlier run: <vlm.branch.visual_mass_from>/attention_decay.json.
  """
  enc, br, sc = config.vlm.encoder, config.vlm.branch, config.vlm.scenes
  lm = lm_config(config)
  if br.kind not in BRANCHES:
    raise ValueError(f"vlm.branch.kind={br.kind!r} is not one of {BRANCHES}.")
  if br.pvm_source not in SOURCES:
    raise ValueError(f"vlm.branch.pvm_source={br.pvm_source!r} is not one of {SOURCES}.")
  layers = ()
  if br.kind != "none":
    visual_mass = None
    if br.layer_strategy in ("peak", "max_decay"):
      if not br.visual_mass_from:
        raise ValueError(f"vlm.branch.layer_strategy={br.layer_strategy!r} needs "
                         "vlm.branch.visual_mass_from (a run with attention_decay.json).")
      decay = json.loads(Path(br.visual_mass_from, "attention_decay.json").read_text())
      visual_mass = [decay["layers"][str(i)]["mass"] for i in range(lm.n_layers)]
    layers = select_layers(br.layer_strategy, lm.n_layers, start=br.layer_start,
                           stride=br.layer_stride or None, count=br.layer_count or None,
                           layers=tuple(br.layers) or None, visual_mass=visual_mass)
  pvm = PVMConfig(d_model=lm.d_model, latent_dim=br.latent_dim, head_dim=br.pvm_head_dim,
                  backbone_gqa_ratio=lm.n_heads // lm.n_kv_heads, backbone_ffn_dim=lm.ffn_dim)
  g = sc.glyph_size
  return VLMConfig(lm=lm, image_hw=(sc.rows * g, sc.cols * g), patch_size=enc.patch_size,
                   vit_dim=enc.vit_dim, vit_layers=enc.vit_layers, vit_heads=enc.vit_heads,
                   vit_ffn=enc.vit_ffn, visual_pos=bool(enc.visual_pos), branch=br.kind,
                   branch_layers=tuple(layers), pvm=None if br.kind == "none" else pvm,
                   pvm_source=br.pvm_source, mlp_dim=br.mlp_dim or None)
