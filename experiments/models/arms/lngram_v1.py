"""Lngram v1 (single table per order) in the memory slot: the paper's v1 baseline.

"Lngram: N-gram Conditional Memory in Latent Space" (arXiv 2605.24869), as its
successor "Lngram v2" (§4.4, Table 4) compares against it. Over the block
input h (the residual stream before attention):

    u = RMSNorm(h; the block's own pre-attention weight)   router input
    z = u W_q, W_q [D, D]; route r owns channels r·M..r·M+M-1; R = D/M
        (`n_routes` sets R apart from D, W_q [D, R·M]: a control, not v1's design)
    e^(n) = concat_r E^(n)[A^(n)_r]                         [R·Dm], 0 if no window
    k^(n) = e^(n) W_K + b_K,  v^(n) = e^(n) W_V + b_V       shared across orders
    α^(n) = σ(RMSNorm_q(h) · RMSNorm_k(k^(n)) / √D)         dot in float32
    mixed = Σ_n α^(n) v^(n);  Y = mixed + SiLU(DWConv(RMSNorm_c(mixed)))

The addresses, hard lookup and surrogate router gradients are lngram_jax's
(`ngram_lookup`): its row layout r·C^n + Σ_i a[t-n+1+i]·C^i with the oldest
symbol least significant and bit j of route r on channel r·M + j is exactly
v1's (the tests check it against a transcription of v1's formula). Windows
that start before the sequence or segment, or touch padding, read e = 0, so
there k = b_K and v = b_V: v1's own t < n-1 rule. Deviations from the
authors' code (all follow v2): the conv input and Y are zero on padding
tokens, no tap reads across a packed segment, and the surrogate ignores
invalid windows. Zero tables and conv taps (the authors' init) make Y ≡ 0
at init.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lngram_jax import checks, dataclass_json, history
from lngram_jax.addressing import codes_from_logits, ngram_rows
from lngram_jax.config import SURROGATES
from lngram_jax.conv import short_conv
from lngram_jax.dataclass_json import is_int as _is_int
from lngram_jax.decode import LngramDecodeState, check_state, init_decode_state
from lngram_jax.lookup import gather_rows, ngram_lookup
from lngram_jax.norms import rms_norm

NAME = "lngram_v1"
SLOT = "memory"
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class LngramV1Config:
  """One Lngram v1 layer (authors' `LngramConfig` defaults unless noted).

  Attributes:
    d_model: backbone width D; the router is D → D, so R = D / bits routes.
    bits: M bits per route; C = 2**M codes.
    n_routes: R set apart from the width (a comparison's control: the router is then
      D → R·M, as Lngram v2's); 0 (default) = v1's own coupling, R = D / M.
    orders: n-gram orders, ascending (one table of R·C^n rows per order).
    mem_dim: Dm, the width of one table row (authors' default 16; the paper 144).
    surrogate: router gradient, one of lngram_jax's: "exact" (the authors'
      single-table default), "onebit" (their recommended approximation, and
      the default here, as for v2), "ste", "none".
    surrogate_tau, surrogate_scale: τ and λ.
    conv_kernel: W taps of the depthwise conv (dilation = the largest order).
    dtype, param_dtype: activation and parameter dtypes.
    eps: RMSNorm epsilon (of every norm, the router's included: the model's).
    init_std: σ0 of W_q, W_K, W_V.
    table_init_std: tables' normal std; 0 = the authors' zero init.
  """

  d_model: int
  bits: int = 4
  orders: tuple[int, ...] = (2, 3)
  mem_dim: int = 16
  surrogate: str = "onebit"
  surrogate_tau: float = 1.0
  surrogate_scale: float = 1.0
  conv_kernel: int = 4
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  eps: float = 1e-6
  init_std: float = 0.02
  table_init_std: float = 0.0
  n_routes: int = 0

  def __post_init__(self):
    owner = "LngramV1Config"
    for name in ("d_model", "bits", "mem_dim", "conv_kernel"):
      dataclass_json.check_positive_int(owner, name, getattr(self, name))
    if self.bits > 8:
      raise ValueError(f"LngramV1Config: bits={self.bits} must be in [1, 8].")
    if not _is_int(self.n_routes) or self.n_routes < 0:
      raise ValueError(f"LngramV1Config: n_routes={self.n_routes!r} must be an int >= 0 "
                       "(0: R = d_model / bits).")
    if not self.n_routes and self.d_model % self.bits:
      raise ValueError(f"LngramV1Config: d_model={self.d_model} must be a multiple of "
                       f"bits={self.bits} (R = d_model / bits routes).")
    if (not isinstance(self.orders, (tuple, list)) or not self.orders
        or not all(_is_int(n) and n >= 1 for n in self.orders)
        or list(self.orders) != sorted(set(self.orders))):
      raise ValueError(f"LngramV1Config: orders={self.orders!r} must be a non-empty, "
                       "strictly ascending tuple of ints >= 1.")
    object.__setattr__(self, "orders", tuple(int(n) for n in self.orders))
    for n in self.orders:
      if self.table_rows(n) > _INT32_MAX:
        raise ValueError(f"LngramV1Config: orders={self.orders} needs R*C^{n} = "
                         f"{self.table_rows(n)} rows, more than int32 row ids hold.")
    if self.surrogate not in SURROGATES:
      raise ValueError(f"LngramV1Config: surrogate={self.surrogate!r} must be one of "
                       f"{SURROGATES}.")
    for name in ("surrogate_tau", "surrogate_scale", "eps", "init_std", "table_init_std"):
      dataclass_json.check_finite(owner, name, getattr(self, name))
    for name in ("surrogate_tau", "eps"):
      if getattr(self, name) <= 0:
        raise ValueError(f"LngramV1Config: {name}={getattr(self, name)} must be > 0.")
    for name in ("init_std", "table_init_std"):
      if getattr(self, name) < 0:
        raise ValueError(f"LngramV1Config: {name}={getattr(self, name)} must be >= 0.")
    for name in ("dtype", "param_dtype"):
      object.__setattr__(self, name,
                         dataclass_json.as_float_dtype(owner, name, getattr(self, name)))

  @property
  def routes(self) -> int:
    """R = D / M: v1 couples the route count to the width (unless `n_routes` sets it)."""
    return int(self.n_routes) or self.d_model // self.bits

  @property
  def router_dim(self) -> int:
    """R·M, the router's output width (D under v1's coupling)."""
    return self.routes * self.bits

  @property
  def read_dim(self) -> int:
    """R·Dm, the width of one order's retrieved vector e^(n)."""
    return self.routes * self.mem_dim

  @property
  def max_order(self) -> int:
    return max(self.orders)

  @property
  def conv_context(self) -> int:
    """Previous steps the conv reads: (W - 1)·max order."""
    return (self.conv_kernel - 1) * self.max_order

  def table_rows(self, order: int) -> int:
    return self.routes * 2 ** (self.bits * order)


def _normal(std, key, shape, dtype):
  return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


class LngramV1(nnx.Module):
  """The v1 memory branch; parameters (init of the authors' code):

    router_w  [D, R·M]     N(0, σ0); bit j of route r is column r·M + j (R·M = D
                           unless `n_routes` sets R)
    tables[i] [R·C^n, Dm]  one per order, ascending; zeros by default
    q_norm, k_norm [D]     ones
    w_k, w_v [R·Dm, D]     N(0, σ0); b_k, b_v [D] zeros
    conv_norm [D] ones, conv_kernel [W, D] zeros
  The router's RMSNorm weight is the block's (ctx.attn_norm_scale_D; None =
  affine-free), so the surrogate gradient also reaches it.
  """

  def __init__(self, config: LngramV1Config, *, rngs: nnx.Rngs):
    self.config = c = config
    d, F, pd = c.d_model, c.read_dim, c.param_dtype
    self.router_w = nnx.Param(_normal(c.init_std, rngs.params(), (d, c.router_dim), pd))
    self.tables = nnx.List([
        nnx.Param(_normal(c.table_init_std, rngs.params(), (c.table_rows(n), c.mem_dim), pd))
        for n in c.orders])
    self.q_norm = nnx.Param(jnp.ones((d,), pd))
    self.w_k = nnx.Param(_normal(c.init_std, rngs.params(), (F, d), pd))
    self.b_k = nnx.Param(jnp.zeros((d,), pd))
    self.w_v = nnx.Param(_normal(c.init_std, rngs.params(), (F, d), pd))
    self.b_v = nnx.Param(jnp.zeros((d,), pd))
    self.k_norm = nnx.Param(jnp.ones((d,), pd))
    self.conv_norm = nnx.Param(jnp.ones((d,), pd))
    self.conv_kernel = nnx.Param(jnp.zeros((c.conv_kernel, d), pd))

  # --- the forward, written once; modes differ in the lookup and conv pieces ----

  def router_logits(self, h_BxTxD, norm_scale_D=None):
    """z: [B, T, R, M] float32 (thresholds must not flip with the dtype)."""
    c = self.config
    u_BxTxD = rms_norm(h_BxTxD, norm_scale_D, eps=c.eps)
    z = jnp.einsum("btd,dz->btz", u_BxTxD, self.router_w[...].astype(c.dtype),
                   preferred_element_type=jnp.float32)
    return z.reshape(*h_BxTxD.shape[:2], c.routes, c.bits)

  def _forward(self, h_BxTxD, norm_scale_D, *, lookup, conv, valid_BxT=None):
    """(Y [B, T, D], z [B, T, R, M], gates [B, T, |N|], conv input [B, T, D])."""
    c = self.config
    B, T, D = h_BxTxD.shape
    h_BxTxD = h_BxTxD.astype(c.dtype)
    if valid_BxT is not None:
      # Masks select (as lngram_jax.core): padding computes from zeros, so a
      # NaN there reaches no valid output and no gradient.
      valid_BxTx1 = valid_BxT.astype(bool)[:, :, None]
      h_BxTxD = jnp.where(valid_BxTx1, h_BxTxD, 0).astype(c.dtype)
    z_BxTxRxM = self.router_logits(h_BxTxD, norm_scale_D)
    q_BxTxD = rms_norm(h_BxTxD, self.q_norm[...], eps=c.eps).astype(jnp.float32)
    w_k, w_v = self.w_k[...].astype(c.dtype), self.w_v[...].astype(c.dtype)
    mixed_BxTxD = jnp.zeros((B, T, D), jnp.float32)
    gates = []
    for n, table in zip(c.orders, self.tables, strict=True):
      # Lookup in the table's dtype (float32), then cast for the projections.
      e_BxTxF = lookup(table[...], z_BxTxRxM, n).reshape(B, T, c.read_dim).astype(c.dtype)
      k_BxTxD = e_BxTxF @ w_k + self.b_k[...].astype(c.dtype)
      v_BxTxD = e_BxTxF @ w_v + self.b_v[...].astype(c.dtype)
      k_hat_BxTxD = rms_norm(k_BxTxD, self.k_norm[...], eps=c.eps).astype(jnp.float32)
      gate_BxT = jax.nn.sigmoid(jnp.sum(q_BxTxD * k_hat_BxTxD, -1) / math.sqrt(D))
      gates.append(gate_BxT)
      mixed_BxTxD = mixed_BxTxD + gate_BxT[..., None] * v_BxTxD.astype(jnp.float32)
    mixed_BxTxD = mixed_BxTxD.astype(c.dtype)
    conv_in_BxTxD = rms_norm(mixed_BxTxD, self.conv_norm[...], eps=c.eps)
    if valid_BxT is not None:
      conv_in_BxTxD = jnp.where(valid_BxTx1, conv_in_BxTxD, 0).astype(conv_in_BxTxD.dtype)
    y_BxTxD = mixed_BxTxD + jax.nn.silu(
        conv(conv_in_BxTxD, self.conv_kernel[...].astype(c.dtype), dilation=c.max_order))
    if valid_BxT is not None:
      y_BxTxD = jnp.where(valid_BxTx1, y_BxTxD, 0).astype(y_BxTxD.dtype)
    return y_BxTxD, z_BxTxRxM, jnp.stack(gates, -1), conv_in_BxTxD

  def _parallel(self, h_BxTxD, ctx, valid_BxT):
    c = self.config
    seg = ctx.segment_ids_BxT

    def lookup(table_ExDm, z_BxTxRxM, order):
      return ngram_lookup(table_ExDm, z_BxTxRxM, order=order, bits=c.bits, segment_ids=seg,
                          valid=valid_BxT, surrogate=c.surrogate, tau=c.surrogate_tau,
                          scale=c.surrogate_scale)

    def conv(x_BxTxD, kernel_WxD, *, dilation):
      return short_conv(x_BxTxD, kernel_WxD, dilation=dilation, segment_ids=seg)

    return self._forward(h_BxTxD, ctx.attn_norm_scale_D, lookup=lookup, conv=conv,
                         valid_BxT=valid_BxT)

  # --- the branch protocol ----------------------------------------------------------

  def forward(self, x_BxTxD, ctx):
    """(Y, aux): aux router_codes [B, T, R] int32, gates [B, T, |N|] and the
    training metrics metric/gate_<n> (mean α of order n)."""
    checks.check_layer_inputs(self.config.d_model, x_BxTxD, ctx.segment_ids_BxT, ctx.valid_BxT)
    y_BxTxD, z_BxTxRxM, gates_BxTxN, _ = self._parallel(x_BxTxD, ctx, ctx.valid_BxT)
    aux = {"router_codes": codes_from_logits(z_BxTxRxM), "gates": gates_BxTxN}
    for i, n in enumerate(self.config.orders):
      aux[f"metric/gate_{n}"] = jnp.mean(gates_BxTxN[..., i])
    return y_BxTxD, aux

  def init_decode_state(self, batch, ctx):
    """An empty history (every slot 'before the sequence'): `LngramDecodeState`."""
    # v1's config has the fields the v2 state is sized by (max_order, conv_context,
    # routes, d_model, dtype): one state type, one constructor.
    return init_decode_state(self.config, batch)

  def prefill(self, x_BxTxD, ctx):
    """The forward over a right-padded prompt and the state after its last token."""
    c = self.config
    checks.check_layer_inputs(c.d_model, x_BxTxD, ctx.segment_ids_BxT, ctx.valid_BxT)
    B, T = x_BxTxD.shape[:2]
    # No lengths: the whole row is the prompt (also when a `valid` mask is given).
    lengths = ctx.lengths_B if ctx.lengths_B is not None else jnp.full((B,), T, jnp.int32)
    lengths_B, valid_BxT = history.prompt_lengths(B, T, lengths, ctx.valid_BxT)
    y_BxTxD, z_BxTxRxM, _, conv_in_BxTxD = self._parallel(x_BxTxD, ctx, valid_BxT)
    codes_BxHxR, codes_ok_BxH, conv_BxSxD = history.prefill_history(
        codes_from_logits(z_BxTxRxM), conv_in_BxTxD, lengths_B, valid_BxT,
        history=c.max_order - 1, conv_context=c.conv_context, segment_ids=ctx.segment_ids_BxT)
    return y_BxTxD, LngramDecodeState(codes_BxHxR=codes_BxHxR, codes_ok_BxH=codes_ok_BxH,
                                      conv_BxSxD=conv_BxSxD.astype(c.dtype))

  def decode_step(self, x_Bx1xD, state, ctx):
    """One token per row (always valid), continuing the state's segment."""
    c = self.config
    checks.check_layer_inputs(c.d_model, x_Bx1xD)
    if x_Bx1xD.shape[1] != 1:
      raise ValueError(f"LngramV1.decode_step: x must have shape [B, 1, {c.d_model}]; got "
                       f"{tuple(x_Bx1xD.shape)}.")
    check_state(c, state, x_Bx1xD.shape[0], "LngramV1.decode_step")

    def window(z_Bx1xRxM):
      return history.step_window(state.codes_BxHxR, state.codes_ok_BxH,
                                 codes_from_logits(z_Bx1xRxM))

    def lookup(table_ExDm, z_Bx1xRxM, order):
      # The same rows as the parallel path, over the last `order` slots.
      window_codes, window_ok = window(z_Bx1xRxM)
      rows_BxnxR, ok_Bxn = ngram_rows(window_codes[:, -order:], order=order, bits=c.bits,
                                      valid=window_ok[:, -order:])
      return gather_rows(table_ExDm, rows_BxnxR[:, -1:], ok_Bxn[:, -1:])

    def conv(x_Bx1xD, kernel_WxD, *, dilation):
      conv_inputs = history.conv_window(state.conv_BxSxD, x_Bx1xD)
      return short_conv(conv_inputs, kernel_WxD, dilation=dilation)[:, -1:]

    y_Bx1xD, z_Bx1xRxM, _, conv_in_Bx1xD = self._forward(
        x_Bx1xD, ctx.attn_norm_scale_D, lookup=lookup, conv=conv)
    window_codes, window_ok = window(z_Bx1xRxM)
    new_state = LngramDecodeState(
        codes_BxHxR=window_codes[:, 1:], codes_ok_BxH=window_ok[:, 1:],
        conv_BxSxD=history.conv_window(state.conv_BxSxD, conv_in_Bx1xD)[:, 1:])
    return y_Bx1xD, new_state

  # --- evaluation statistics (experiments/jobs/metrics.py) --------------------------

  def metric_sums(self, aux, valid_BxT, segment_ids_BxT=None):
    """Per-batch sums: tokens, Σα per order, and each route's code histogram."""
    from experiments.models.memory_stats import code_histogram
    c = self.config
    w_BxT = valid_BxT.astype(bool).astype(jnp.float32)
    sums = {"tokens": w_BxT.sum(),
            "codes": code_histogram(aux["router_codes"], valid_BxT, 2**c.bits)}
    for i, n in enumerate(c.orders):
      sums[f"gate_sum/{n}"] = (aux["gates"][..., i] * w_BxT).sum()
    return sums

  @staticmethod
  def summarise_metrics(sums):
    """gate/<n> (mean α over valid tokens), effective_codes, dead_code_frac."""
    from experiments.models.memory_stats import effective_codes
    tokens = max(float(sums["tokens"]), 1.0)
    out = {f"gate/{k.split('/', 1)[1]}": float(v) / tokens
           for k, v in sums.items() if k.startswith("gate_sum/")}
    counts_RxC = np.asarray(sums["codes"])
    out["effective_codes"] = float(effective_codes(counts_RxC).mean())
    out["dead_code_frac"] = float((counts_RxC == 0).mean())
    return out


def param_count(config: LngramV1Config) -> dict[str, int]:
  """Parameters of one layer (the paper's accounting, as for v2's Table 3).

  total:  router D·R·M (D² under v1's coupling), tables R·Dm·Σ_n C^n, W_K/W_V
          2·R·Dm·D, b_K/b_V 2D,
          q/k norms 2D, conv W·D and its norm D. This is the authors'
          estimator (DESIGN.md §8.3) plus the conv norm it omits; the
          block's pre-attention norm the router reuses is not counted.
  active: what one token touches: everything but the tables, plus one row
          per route of each order (R·|N|·Dm).
  """
  c = config
  d, R, Dm = c.d_model, c.routes, c.mem_dim
  tables = sum(c.table_rows(n) for n in c.orders) * Dm
  dense = d * c.router_dim + 2 * (R * Dm * d + d) + 2 * d + c.conv_kernel * d + d
  return {"total": tables + dense, "active": dense + R * len(c.orders) * Dm,
          "tables": tables, "dense": dense, "readout": 2 * R * Dm * d}


CONFIG = LngramV1Config
MODULE = LngramV1
