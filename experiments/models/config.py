"""Configuration of the decoder LM, with a JSON round trip, and its experiment-config conversion.

A checkpoint stores `LMConfig.to_dict()` as JSON and rebuilds the model from it
alone, so every field (the branch configs included, each with its "kind")
must survive `LMConfig.from_dict(json.loads(json.dumps(config.to_dict())))`
unchanged. `lm_config(experiment_config)` turns the `model` block of an
experiment config (experiments/configs/*.py) into an LMConfig.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from experiments.models import branches
from experiments.models.layers import rope_inv_freq
from experiments.models.lora import LoRAConfig, lora_config
from experiments.models.moe import MoEConfig
from lngram_jax import dataclass_json
from lngram_jax.config import READOUTS, SURROGATES

_OWNER = "LMConfig"
# Fields added after runs were saved, with their JSON defaults (see `to_dict`).
_LATER_FIELDS = {"qkv_bias": False, "qk_norm": False, "rope_scaling": [],
                 "norm_scale_in_dtype": False, "mrope_section": [],
                 "mrope_interleaved": False, "moe_layers": [], "moe": None,
                 "attention": "auto", "lora": None}


ATTENTIONS = ("auto", "xla")   # LMConfig.attention


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """Hyper-parameters of `DecoderLM`.

  Attributes:
    vocab_size: V; 256 for byte-level tokens.
    d_model, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim: the backbone.
    max_len: the longest sequence (training rows and decode caches).
    rope_theta: RoPE base.
    tie_embeddings: the output projection is the embedding table transposed.
    dtype, param_dtype: activation and parameter dtypes (names or dtypes).
    remat: rematerialise every block in the backward, in order (experiments/models/remat.py).
    memory_layers: layers whose memory slot holds `memory` (its delta is added
      to the residual stream before that layer's attention).
    memory: the memory-slot branch config shared by those layers (today an
      `LngramConfig`; d_model must match).
    ffn_branch_layers: layers whose beside-FFN slot holds `ffn_branch`.
    ffn_branch: the beside-FFN branch config (a `PVMConfig` / `PVMBranchConfig`
      or a `ParallelMLPConfig`; d_model must match).
    norm_eps: RMSNorm epsilon.
    init_std: normal init scale; residual output projections use
      init_std / sqrt(2·n_layers).
    qkv_bias: q, k and v projections carry biases (Qwen2).
    qk_norm: per-head RMSNorm of q and k over head_dim before RoPE (Qwen3).
    rope_scaling: () or (name, value) pairs of a RoPE frequency rescaling, e.g.
      (("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
      ("high_freq_factor", 4.0), ("original_max_position_embeddings", 8192)).
    norm_scale_in_dtype: RMSNorms multiply by their scale after casting back to
      the input dtype (Hugging Face Llama / Qwen), not before.
    mrope_section: () or (n_t, n_h, n_w) RoPE frequencies per position axis
      (sum head_dim/2): positions [3, B, T] (Qwen3-VL's multimodal RoPE).
    mrope_interleaved: the axes alternate over the frequencies (Qwen3-VL) rather
      than taking consecutive blocks (Qwen2-VL).
    The last six default off and draw no random numbers (DESIGN.md §11).
    moe_layers: layers whose FFN is the mixture of experts `moe` (an
      experiments.models.moe.MoEConfig; d_model must match) instead of the
      dense SwiGLU (DESIGN.md §6.7); () draws nothing new.
    attention: "auto" (the flash kernel of the platform the step is compiled for,
      splash on TPU and Pallas Triton on GPU, where the shapes fit; the XLA form
      on CPU) or "xla" (always the XLA form, which holds the [T, T] scores).
    lora: None or a LoRAConfig (experiments/models/lora.py): low-rank factors on the
      projections it targets, drawn after every other parameter from a key of their
      own, B = 0 (the model equals the one without LoRA until trained).
  """

  d_model: int = 256
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: int = 2
  head_dim: int = 64
  ffn_dim: int = 768
  max_len: int = 512
  vocab_size: int = 256
  rope_theta: float = 10000.0
  tie_embeddings: bool = True
  dtype: Any = "float32"
  param_dtype: Any = "float32"
  remat: bool = False
  memory_layers: tuple[int, ...] = ()
  memory: Any = None
  ffn_branch_layers: tuple[int, ...] = ()
  ffn_branch: Any = None
  norm_eps: float = 1e-6
  init_std: float = 0.02
  qkv_bias: bool = False
  qk_norm: bool = False
  rope_scaling: tuple = ()
  norm_scale_in_dtype: bool = False
  mrope_section: tuple = ()
  mrope_interleaved: bool = False
  moe_layers: tuple[int, ...] = ()
  moe: Any = None
  attention: str = "auto"
  lora: Any = None

  def __post_init__(self):
    for name in ("dtype", "param_dtype"):
      object.__setattr__(self, name,
                         dataclass_json.as_float_dtype(_OWNER, name, getattr(self, name)))
    for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                 "max_len", "vocab_size"):
      dataclass_json.check_positive_int(_OWNER, name, getattr(self, name))
    for name in ("rope_theta", "norm_eps", "init_std"):
      dataclass_json.check_finite(_OWNER, name, getattr(self, name))
    for name in ("tie_embeddings", "remat", "qkv_bias", "qk_norm", "norm_scale_in_dtype",
                 "mrope_interleaved"):
      dataclass_json.check_bool(_OWNER, name, getattr(self, name))
    if self.attention not in ATTENTIONS:
      raise ValueError(f"LMConfig: attention={self.attention!r} is not one of {ATTENTIONS}.")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
          f"LMConfig: n_heads={self.n_heads} must be a multiple of "
          f"n_kv_heads={self.n_kv_heads}.")
    if self.head_dim % 2:
      raise ValueError(f"LMConfig: head_dim={self.head_dim} must be even (RoPE pairs).")
    if self.rope_theta <= 0:
      raise ValueError(f"LMConfig: rope_theta={self.rope_theta} must be > 0.")
    if self.norm_eps <= 0:
      raise ValueError(f"LMConfig: norm_eps={self.norm_eps} must be > 0.")
    if self.init_std <= 0:
      raise ValueError(f"LMConfig: init_std={self.init_std} must be > 0.")
    self._check_rope_scaling()
    self._check_mrope()
    self._check_moe()
    if self.lora is not None and not isinstance(self.lora, LoRAConfig):
      raise ValueError(f"LMConfig: lora must be a LoRAConfig, not {type(self.lora).__name__}.")
    for slot, layers_field, config_field in (("memory", "memory_layers", "memory"),
                                             ("ffn", "ffn_branch_layers", "ffn_branch")):
      self._check_slot(slot, layers_field, config_field)

  def _check_rope_scaling(self) -> None:
    scaling = self.rope_scaling
    if isinstance(scaling, dict):
      scaling = tuple(sorted(scaling.items()))
    if not isinstance(scaling, (tuple, list)) or not all(
        isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str)
        for p in scaling):
      raise ValueError(f"LMConfig: rope_scaling={self.rope_scaling!r} must be () or "
                       "(name, value) pairs.")
    scaling = tuple((str(k), v) for k, v in scaling)
    object.__setattr__(self, "rope_scaling", scaling)
    if scaling:
      try:
        rope_inv_freq(self.head_dim, self.rope_theta, dict(scaling))
      except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"LMConfig: rope_scaling={dict(scaling)} is not usable: "
                         f"{e!s}") from None

  def _check_mrope(self) -> None:
    section = self.mrope_section
    if not isinstance(section, (tuple, list)) or not all(
        dataclass_json.is_int(n) and n >= 0 for n in section) or len(section) not in (0, 3):
      raise ValueError(f"LMConfig: mrope_section={section!r} must be () or three "
                       "non-negative ints (t, h, w).")
    section = tuple(int(n) for n in section)
    object.__setattr__(self, "mrope_section", section)
    if section and sum(section) != self.head_dim // 2:
      raise ValueError(f"LMConfig: mrope_section={section} must sum to head_dim/2="
                       f"{self.head_dim // 2}.")

  def _check_moe(self) -> None:
    layers = self.moe_layers
    if not isinstance(layers, (tuple, list)) or not all(dataclass_json.is_int(i) for i in layers):
      raise ValueError(f"LMConfig: moe_layers={layers!r} must be a tuple of layer indices (ints).")
    layers = tuple(int(i) for i in layers)
    object.__setattr__(self, "moe_layers", layers)
    bad = [i for i in layers if not 0 <= i < self.n_layers]
    if bad:
      raise ValueError(f"LMConfig: moe_layers={layers} has {bad} outside "
                       f"[0, n_layers={self.n_layers}).")
    if len(set(layers)) != len(layers):
      raise ValueError(f"LMConfig: moe_layers={layers} has duplicates.")
    if layers and self.moe is None:
      raise ValueError(f"LMConfig: moe_layers={layers} needs a `moe` config.")
    if self.moe is None:
      return
    if not isinstance(self.moe, MoEConfig):
      raise ValueError(f"LMConfig: moe must be a MoEConfig, not {type(self.moe).__name__}.")
    if self.moe.d_model != self.d_model:
      raise ValueError(f"LMConfig: moe.d_model={self.moe.d_model} must equal "
                       f"d_model={self.d_model}.")

  def _check_slot(self, slot: str, layers_field: str, config_field: str) -> None:
    layers = getattr(self, layers_field)
    if not isinstance(layers, (tuple, list)) or not all(
        dataclass_json.is_int(i) for i in layers):
      raise ValueError(f"LMConfig: {layers_field}={layers!r} must be a tuple of layer "
                       "indices (ints).")
    layers = tuple(int(i) for i in layers)
    object.__setattr__(self, layers_field, layers)
    bad = [i for i in layers if not 0 <= i < self.n_layers]
    if bad:
      raise ValueError(f"LMConfig: {layers_field}={layers} has {bad} outside "
                       f"[0, n_layers={self.n_layers}).")
    if len(set(layers)) != len(layers):
      raise ValueError(f"LMConfig: {layers_field}={layers} has duplicates.")
    config = getattr(self, config_field)
    if layers and config is None:
      raise ValueError(f"LMConfig: {layers_field}={layers} needs a `{config_field}` config.")
    if config is None:
      return
    kind = branches.kind_of(config)
    if kind.slot != slot:
      raise ValueError(f"LMConfig: {config_field} is a {kind.name!r} branch, which goes in "
                       f"the {kind.slot!r} slot, not {slot!r}.")
    if config.d_model != self.d_model:
      raise ValueError(f"LMConfig: {config_field}.d_model={config.d_model} must equal "
                       f"d_model={self.d_model}.")
    object.__setattr__(self, config_field, branches.canonical(config))

  def replace(self, **changes) -> LMConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """A JSON-serialisable dict: dtypes as names, branch configs with a "kind".

    The backbone options added for pretrained checkpoints are written only when
    set, so a config without them writes the JSON it wrote before (saved runs
    resume against an unchanged config).
    """
    d = dataclass_json.to_json(self, **{
        field: None if getattr(self, field) is None
        else branches.config_to_dict(getattr(self, field))
        for field in ("memory", "ffn_branch")},
        moe=None if self.moe is None else self.moe.to_dict(),
        lora=None if self.lora is None else self.lora.to_dict())
    for field, default in _LATER_FIELDS.items():
      if d[field] == default:
        del d[field]
    return d

  @classmethod
  def from_dict(cls, d: dict) -> LMConfig:
    d = dict(d)
    # Checkpoints written before the branch slots: lngram_layers / lngram.
    if "lngram_layers" in d or "lngram" in d:
      d["memory_layers"] = d.pop("lngram_layers", ())
      lngram = d.pop("lngram", None)
      d["memory"] = None if lngram is None else {"kind": "lngram", **lngram}
    nested = {field: None if d[field] is None else branches.config_from_dict(d[field])
              for field in ("memory", "ffn_branch") if field in d}
    if d.get("moe") is not None:
      nested["moe"] = MoEConfig.from_dict(d["moe"])
    if d.get("lora") is not None:
      nested["lora"] = LoRAConfig.from_dict(d["lora"])
    return dataclass_json.from_json(cls, d, owner="LMConfig.from_dict", **nested)


# Backbone shape fields an experiment config may leave 0 for an `init_from=hf:DIR` run.
HF_SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim")


def lm_config(config) -> LMConfig:
  """The LMConfig an experiment config's `model` block describes.

  model.memory = dict(kind=..., <the branch config's fields except d_model>)
  applies to model.memory_layers (none: no memory branch); d_model follows
  model.d_model. Checks what a config file cannot (it imports nothing but
  ml_collections): the kind, the Lngram surrogate and readout names, and
  data.seq_len against model.max_len.
  """
  m = config.model.to_dict()
  # 0 = "from config.json" (experiments/configs/hf_lngram.py), filled in by
  # experiments.hf.backbone.with_hf_backbone before this when init_from=hf:DIR.
  unset = [f for f in HF_SHAPE_FIELDS if m.get(f) == 0]
  if unset:
    raise ValueError(f"model.{unset[0]}=0 means 'from the checkpoint's config.json': "
                     "set --config.init_from=hf:DIR (or give model." + ", ".join(unset) + ").")
  m["vocab_size"] = m.get("vocab_size") or 256   # 0: the data's (bytes: 256)
  memory = dict(m.pop("memory") or {})
  layers = tuple(m.pop("memory_layers"))
  kind = memory.pop("kind", None)
  if layers:
    if kind not in branches.KINDS or branches.KINDS[kind].slot != "memory":
      names = sorted(k for k, v in branches.KINDS.items() if v.slot == "memory")
      raise ValueError(f"model.memory.kind={kind!r} is not one of {names}.")
    if kind == "lngram":
      for field, names in (("surrogate", SURROGATES), ("readout", READOUTS)):
        if field in memory and memory[field] not in names:
          raise ValueError(f"model.memory.{field}={memory[field]!r} is not one of {names}.")
    memory = {k: tuple(v) if isinstance(v, list) else v for k, v in memory.items()}
    if kind == "engram" and memory.get("vocab_size") == 0:
      memory["vocab_size"] = m["vocab_size"]   # 0: the model's token ids
    m["memory"] = branches.config_from_dict({"kind": kind, "d_model": m["d_model"], **memory})
  m["memory_layers"] = layers
  # model.moe = dict(<MoEConfig fields except d_model>) for model.moe_layers.
  moe = m.pop("moe", None)
  m["moe_layers"] = tuple(m.pop("moe_layers", ()) or ())
  if m["moe_layers"] or moe:
    moe = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(moe or {}).items()}
    try:
      m["moe"] = MoEConfig(**{"d_model": m["d_model"], **moe})
    except TypeError as e:
      raise ValueError(f"model.moe: {e}") from None
  # model.lora = dict(rank, alpha, dropout, targets); rank 0 (the default) = no LoRA.
  m["lora"] = lora_config(m.pop("lora", None))
  seq_len = config.get("data", {}).get("seq_len")
  if seq_len is not None and seq_len > m["max_len"]:
    raise ValueError(f"data.seq_len={seq_len} exceeds model.max_len={m['max_len']}.")
  return LMConfig(**m)
