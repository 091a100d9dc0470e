"""Configuration of the decoder LM, with a JSON round trip, and its experiment-config conversion.

A checkpoint stores `LMConfig.to_dict()` as JSON and rebuilds the model from it
alone, so every field (the branch configs included, each with its "kind")
must survive `LMConfig.from_dict(json.loads(json.dumps(config.to_dict())))`
unchanged. `lm_config(experiment_config)` turns the `model` block of an
experiment config (experiments/configs/*.py) into an LMConfig.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax.numpy as jnp

from experiments.models import branches
from lngram_jax.config import READOUTS, SURROGATES

_FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _dtype(field: str, value) -> jnp.dtype:
  if value is None or isinstance(value, (bool, int, float)):
    raise ValueError(f"LMConfig: {field}={value!r} is not a dtype.")
  try:
    dtype = jnp.dtype(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"LMConfig: {field}={value!r} is not a dtype.") from e
  if dtype.name not in _FLOAT_DTYPES:
    raise ValueError(f"LMConfig: {field}={dtype.name!r} is not one of {_FLOAT_DTYPES}.")
  return dtype


def _finite(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    raise ValueError(f"LMConfig: {name}={value!r} must be a finite number.")


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

  def __post_init__(self):
    object.__setattr__(self, "dtype", _dtype("dtype", self.dtype))
    object.__setattr__(self, "param_dtype", _dtype("param_dtype", self.param_dtype))
    for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
                 "max_len", "vocab_size"):
      _positive(name, getattr(self, name))
    for name in ("rope_theta", "norm_eps", "init_std"):
      _finite(name, getattr(self, name))
    for name in ("tie_embeddings", "remat"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"LMConfig: {name}={getattr(self, name)!r} must be a bool.")
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
    for slot, layers_field, config_field in (("memory", "memory_layers", "memory"),
                                             ("ffn", "ffn_branch_layers", "ffn_branch")):
      self._check_slot(slot, layers_field, config_field)

  def _check_slot(self, slot: str, layers_field: str, config_field: str) -> None:
    layers = getattr(self, layers_field)
    if not isinstance(layers, (tuple, list)) or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in layers):
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
    """A JSON-serialisable dict: dtypes as names, branch configs with a "kind"."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["dtype"] = self.dtype.name
    d["param_dtype"] = self.param_dtype.name
    for field in ("memory_layers", "ffn_branch_layers"):
      d[field] = list(d[field])
    for field in ("memory", "ffn_branch"):
      d[field] = None if d[field] is None else branches.config_to_dict(d[field])
    return d

  @classmethod
  def from_dict(cls, d: dict) -> LMConfig:
    d = dict(d)
    # Checkpoints written before the branch slots: lngram_layers / lngram.
    if "lngram_layers" in d or "lngram" in d:
      d["memory_layers"] = d.pop("lngram_layers", ())
      lngram = d.pop("lngram", None)
      d["memory"] = None if lngram is None else {"kind": "lngram", **lngram}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"LMConfig.from_dict: unknown fields {unknown}.")
    for field in ("memory", "ffn_branch"):
      if d.get(field) is not None:
        d[field] = branches.config_from_dict(d[field])
    return cls(**d)


def lm_config(config) -> LMConfig:
  """The LMConfig an experiment config's `model` block describes.

  model.memory = dict(kind=..., <the branch config's fields except d_model>)
  applies to model.memory_layers (none: no memory branch); d_model follows
  model.d_model. Checks what a config file cannot (it imports nothing but
  ml_collections): the kind, the Lngram surrogate and readout names, and
  data.seq_len against model.max_len.
  """
  m = config.model.to_dict()
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
    m["memory"] = branches.config_from_dict({"kind": kind, "d_model": m["d_model"], **memory})
  m["memory_layers"] = layers
  seq_len = config.get("data", {}).get("seq_len")
  if seq_len is not None and seq_len > m["max_len"]:
    raise ValueError(f"data.seq_len={seq_len} exceeds model.max_len={m['max_len']}.")
  return LMConfig(**m)
