"""Configuration of the decoder LM, with a JSON round trip for checkpoints.

A checkpoint stores `LMConfig.to_dict()` as JSON and rebuilds the model from it
alone, so every field (the nested LngramConfig included) must survive
`LMConfig.from_dict(json.loads(json.dumps(config.to_dict())))` unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from lngram_jax.config import LngramConfig

_FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _dtype(field: str, value) -> jnp.dtype:
  try:
    dtype = jnp.dtype(value)
  except TypeError as e:
    raise ValueError(f"LMConfig: {field}={value!r} is not a dtype.") from e
  if dtype.name not in _FLOAT_DTYPES:
    raise ValueError(f"LMConfig: {field}={dtype.name!r} is not one of {_FLOAT_DTYPES}.")
  return dtype


def _positive(name: str, value) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"LMConfig: {name}={value!r} must be a positive int.")


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
    remat: rematerialise every block in the backward (nnx.remat).
    lngram_layers: indices of the layers that get an Lngram v2 branch, whose
      delta is added to the residual stream before that layer's attention.
    lngram: the Lngram v2 config shared by those layers (d_model must match).
    norm_eps: RMSNorm epsilon.
    init_std: normal init scale; residual output projections use
      init_std / sqrt(2·n_layers).
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
  lngram_layers: tuple[int, ...] = ()
  lngram: LngramConfig | None = None
  norm_eps: float = 1e-6
  init_std: float = 0.02

  def __post_init__(self):
    object.__setattr__(self, "lngram_layers", tuple(int(i) for i in self.lngram_layers))
    object.__setattr__(self, "dtype", _dtype("dtype", self.dtype))
    object.__setattr__(self, "param_dtype", _dtype("param_dtype", self.param_dtype))
    for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                 "max_len", "vocab_size"):
      _positive(name, getattr(self, name))
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
    bad = [i for i in self.lngram_layers if not 0 <= i < self.n_layers]
    if bad:
      raise ValueError(
          f"LMConfig: lngram_layers={self.lngram_layers} has {bad} outside "
          f"[0, n_layers={self.n_layers}).")
    if len(set(self.lngram_layers)) != len(self.lngram_layers):
      raise ValueError(f"LMConfig: lngram_layers={self.lngram_layers} has duplicates.")
    if self.lngram_layers and self.lngram is None:
      raise ValueError(
          f"LMConfig: lngram_layers={self.lngram_layers} needs an `lngram` config.")
    if self.lngram is not None:
      if not isinstance(self.lngram, LngramConfig):
        raise ValueError(
            f"LMConfig: lngram must be an LngramConfig; got {type(self.lngram).__name__}.")
      if self.lngram.d_model != self.d_model:
        raise ValueError(
            f"LMConfig: lngram.d_model={self.lngram.d_model} must equal "
            f"d_model={self.d_model}.")

  @property
  def has_lngram(self) -> bool:
    return bool(self.lngram_layers)

  def replace(self, **changes) -> LMConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """A JSON-serialisable dict: dtypes as names, the Lngram config nested."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["dtype"] = self.dtype.name
    d["param_dtype"] = self.param_dtype.name
    d["lngram_layers"] = list(self.lngram_layers)
    d["lngram"] = None if self.lngram is None else _lngram_to_dict(self.lngram)
    return d

  @classmethod
  def from_dict(cls, d: dict) -> LMConfig:
    d = dict(d)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"LMConfig.from_dict: unknown fields {unknown}.")
    if d.get("lngram") is not None:
      d["lngram"] = _lngram_from_dict(d["lngram"])
    return cls(**d)


def _lngram_to_dict(c: LngramConfig) -> dict:
  return c.to_dict()


def _lngram_from_dict(d: dict) -> LngramConfig:
  return LngramConfig.from_dict(d)
