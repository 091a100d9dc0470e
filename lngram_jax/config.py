"""Configuration of one Lngram v2 layer (paper §2, Table 13; DESIGN.md §2).

The dataclass is frozen and validated up front so that a bad setting fails
with a message naming the field before anything is traced or compiled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, get_args

import jax.numpy as jnp

from lngram_jax import dataclass_json
from lngram_jax.dataclass_json import is_int as _is_int

Surrogate = Literal["exact", "onebit", "ste", "none"]
Readout = Literal["literal", "streaming", "absorbed", "pallas", "pallas_fused"]
SURROGATES: tuple[str, ...] = get_args(Surrogate)
READOUTS: tuple[str, ...] = get_args(Readout)
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class LngramConfig:
  """Hyper-parameters of one Lngram v2 layer.

  Attributes:
    d_model: backbone width d.
    routes: number of routes R.
    bits: bits per route M; each route emits one of C = 2**M codes.
    orders: n-gram orders N, ascending (one table per order).
    mem_dim: width Dm of one table entry; the route token has Dr = |N|·Dm.
    q_heads, kv_heads, head_dim: the grouped-query readout; W_Q is
      [d, Hq·dh] and W_O [Hq·dh, d], so Hq·dh need not equal d (the paper's
      mem256 rows of Table 3 read with 16 heads of 256 at d = 2048).
    sink_mass: μ0, the initial probability mass on real routes; fixes the
      sink logit b0 = log(R(1-μ0)/μ0).
    sink: False drops the sink (the paper's §4.2 ablation): the softmax runs
      over the routes only, as if b0 = -inf; `sink_mass` is then unused.
    surrogate: router gradient: "exact", "onebit", "ste" or "none".
    surrogate_tau, surrogate_scale: τ and λ of the surrogate.
    conv_kernel, conv_dilation: the short causal depthwise conv (W taps);
      dilation None means the largest order.
    readout: "literal", "streaming", "absorbed", "pallas" or "pallas_fused"
      (all equal; "pallas_fused" also gathers and normalises the table rows
      inside the kernel, GPU or CPU only).
    route_chunk: routes per chunk of the streaming readout.
    dtype, param_dtype: activation and parameter dtypes.
    eps: RMSNorm epsilon.
    init_std, table_init_std: normal init scales of projections and tables.
  """

  d_model: int
  routes: int = 16
  bits: int = 4
  orders: tuple[int, ...] = (2, 3)
  mem_dim: int = 128
  q_heads: int = 16
  kv_heads: int = 2
  head_dim: int = 128
  sink_mass: float = 0.5
  sink: bool = True
  surrogate: Surrogate = "onebit"
  surrogate_tau: float = 1.0
  surrogate_scale: float = 1.0
  conv_kernel: int = 4
  conv_dilation: int | None = None
  readout: Readout = "absorbed"
  route_chunk: int = 64
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  eps: float = 1e-6
  init_std: float = 0.02
  table_init_std: float = 0.02

  def __post_init__(self):
    # Normalise `orders` so lists from config files hash and compare.
    if not isinstance(self.orders, (tuple, list)) or not all(
        _is_int(n) for n in self.orders):
      raise ValueError(f"LngramConfig: orders={self.orders!r} must be a tuple of ints.")
    object.__setattr__(self, "orders", tuple(int(n) for n in self.orders))
    for name in ("sink_mass", "surrogate_tau", "surrogate_scale", "eps", "init_std",
                 "table_init_std"):
      _finite(name, getattr(self, name))
    if self.init_std < 0 or self.table_init_std < 0:
      raise ValueError(f"LngramConfig: init_std={self.init_std} and table_init_std="
                       f"{self.table_init_std} must be >= 0.")
    if not isinstance(self.sink, bool):
      raise ValueError(f"LngramConfig: sink={self.sink!r} must be a bool.")
    if not _is_int(self.bits):
      raise ValueError(f"LngramConfig: bits={self.bits!r} must be an int in [1, 8].")
    if self.conv_dilation is not None and not _is_int(self.conv_dilation):
      raise ValueError(f"LngramConfig: conv_dilation={self.conv_dilation!r} must be None "
                       "or an int >= 1.")
    _positive("d_model", self.d_model)
    _positive("routes", self.routes)
    _positive("mem_dim", self.mem_dim)
    _positive("q_heads", self.q_heads)
    _positive("kv_heads", self.kv_heads)
    _positive("head_dim", self.head_dim)
    _positive("conv_kernel", self.conv_kernel)
    _positive("route_chunk", self.route_chunk)
    if not 1 <= self.bits <= 8:
      raise ValueError(f"LngramConfig: bits={self.bits} must be in [1, 8].")
    if not self.orders:
      raise ValueError("LngramConfig: orders=() must name at least one order.")
    if any(n < 1 for n in self.orders):
      raise ValueError(f"LngramConfig: orders={self.orders} must all be >= 1.")
    if list(self.orders) != sorted(set(self.orders)):
      raise ValueError(
          f"LngramConfig: orders={self.orders} must be strictly ascending.")
    for n in self.orders:
      rows = self.routes * 2 ** (self.bits * n)
      if rows > _INT32_MAX:
        raise ValueError(
            f"LngramConfig: routes * 2**(bits*n) = {self.routes} * 2**"
            f"({self.bits}*{n}) = {rows} rows does not fit int32 row ids; "
            "use fewer routes, bits or a lower order.")
    if self.q_heads % self.kv_heads:
      raise ValueError(
          f"LngramConfig: q_heads={self.q_heads} must be a multiple of "
          f"kv_heads={self.kv_heads}.")
    if not 0.0 < self.sink_mass < 1.0:
      raise ValueError(
          f"LngramConfig: sink_mass={self.sink_mass} must be in (0, 1).")
    if self.surrogate not in SURROGATES:
      raise ValueError(
          f"LngramConfig: surrogate={self.surrogate!r} is not one of {SURROGATES}.")
    if self.readout not in READOUTS:
      raise ValueError(
          f"LngramConfig: readout={self.readout!r} is not one of {READOUTS}.")
    if self.surrogate_tau <= 0:
      raise ValueError(
          f"LngramConfig: surrogate_tau={self.surrogate_tau} must be > 0.")
    if self.conv_dilation is not None and self.conv_dilation < 1:
      raise ValueError(
          f"LngramConfig: conv_dilation={self.conv_dilation} must be >= 1.")
    if self.eps <= 0:
      raise ValueError(f"LngramConfig: eps={self.eps} must be > 0.")
    for name in ("dtype", "param_dtype"):   # refused here, not at call time inside jax
      dataclass_json.as_float_dtype("LngramConfig", name, getattr(self, name))

  @property
  def codes_per_route(self) -> int:
    """C = 2**M."""
    return 2**self.bits

  @property
  def route_dim(self) -> int:
    """Dr = |N|·Dm, the width of one route token."""
    return len(self.orders) * self.mem_dim

  @property
  def max_order(self) -> int:
    return max(self.orders)

  @property
  def dilation(self) -> int:
    return self.max_order if self.conv_dilation is None else self.conv_dilation

  @property
  def conv_context(self) -> int:
    """Previous steps the conv reads: (W - 1)·dilation (9 by default)."""
    return (self.conv_kernel - 1) * self.dilation

  @property
  def sink_logit(self) -> float:
    """b0 = log(R(1-μ0)/μ0): at equal zero scores the routes hold mass μ0.

    Without a sink, -inf: exp(b0) = 0 drops the sink from every readout form
    (their online softmax starts at max = b0, sum = 1, and the first route
    block rescales that sum by exp(-inf) = 0) and the route mass is exactly 1.
    """
    if not self.sink:
      return -math.inf
    return sink_logit(self.routes, self.sink_mass)

  def table_rows(self, order: int) -> int:
    """R·C^n rows of the table of order n."""
    return self.routes * self.codes_per_route**order

  def replace(self, **changes) -> LngramConfig:
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """A JSON-serialisable dict (dtypes by name): checkpoints store this."""
    return dataclass_json.to_json(self)

  @classmethod
  def from_dict(cls, d: dict) -> LngramConfig:
    """Inverse of `to_dict`; unknown fields are an error, not silently dropped."""
    return dataclass_json.from_json(cls, d, owner="LngramConfig.from_dict")


def sink_logit(routes: int, sink_mass: float) -> float:
  """The fixed sink logit b0 = log(R(1-μ0)/μ0) (paper §2.4)."""
  return math.log(routes * (1.0 - sink_mass) / sink_mass)


def _finite(name: str, value) -> None:
  dataclass_json.check_finite("LngramConfig", name, value)


def _positive(name: str, value) -> None:
  dataclass_json.check_positive_int("LngramConfig", name, value)
