"""The Lngram v2 layer as an NNX module: a thin shell over the functional core.

    z = RMSNorm(h) W_q                     router logits [B, T, R, M]
    m^(n) = E^(n)[rows^(n)(z > 0)]         exact lookup per order (surrogate vjp)
    x = concat_n m^(n)                     route tokens [B, T, R, D]
    o = SinkGQA(RMSNorm_q(h) W_Q, RMSNorm_m(x) W_K, RMSNorm_m(x) W_V)
    ṽ = o W_O;  Y = ṽ + SiLU(DWConv(RMSNorm_c(ṽ)))

The layer returns the delta Y; the caller adds it to the residual stream
before that layer's attention (paper §2.4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lngram_jax import checks
from lngram_jax.config import LngramConfig
from lngram_jax.conv import short_conv
from lngram_jax.lookup import ngram_lookup
from lngram_jax.norms import rms_norm
from lngram_jax.readout import READOUT_FORMS, route_mass_from_lse


def _normal(std):
  return nnx.initializers.normal(stddev=std)


class LngramV2(nnx.Module):
  """One Lngram v2 memory branch (paper §2; inits of Table 13).

  Parameters (names are stable: checkpoints and analyses use them):
    router_w      [d, R·M]            bit j of route r is column r·M + j. The
                                      router norm is affine-free: a scale before
                                      a thresholded projection is absorbed by W_q
                                      (this also matches the paper's counts).
    tables[i]     [R·K^n, d_m]        one per order, ascending.
    q_norm        [d], w_q [d, Hq·dh]
    mem_norm      [D], w_kv [D, 2·Hkv·dh]  first Hkv·dh columns are K, rest V.
    w_o           [Hq·dh, d]          zero-init.
    conv_norm     [d], conv_kernel [k, d]  zero-init.
  """

  def __init__(self, config: LngramConfig, *, rngs: nnx.Rngs):
    self.config = config
    c = config
    d, R, M, D = c.d_model, c.routes, c.bits, c.route_dim
    pd = c.param_dtype
    self.router_w = nnx.Param(_normal(c.init_std)(rngs.params(), (d, R * M), pd))
    self.tables = nnx.List([
        nnx.Param(_normal(c.table_init_std)(rngs.params(), (c.table_rows(n), c.mem_dim), pd))
        for n in c.orders
    ])
    self.q_norm = nnx.Param(jnp.ones((d,), pd))
    self.w_q = nnx.Param(_normal(c.init_std)(rngs.params(), (d, c.q_heads * c.head_dim), pd))
    self.mem_norm = nnx.Param(jnp.ones((D,), pd))
    self.w_kv = nnx.Param(
        _normal(c.init_std)(rngs.params(), (D, 2 * c.kv_heads * c.head_dim), pd))
    self.w_o = nnx.Param(jnp.zeros((c.q_heads * c.head_dim, d), pd))
    self.conv_norm = nnx.Param(jnp.ones((d,), pd))
    self.conv_kernel = nnx.Param(jnp.zeros((c.conv_kernel, d), pd))

  # --- pieces, public so decode, sharding and analyses reuse them -------------

  def router_logits(self, h_BxTxD):
    """z: [B, T, R, M] in float32 (thresholds must not flip with the dtype)."""
    c = self.config
    u_BxTxD = rms_norm(h_BxTxD, eps=c.eps)
    z = jnp.einsum("btd,dz->btz", u_BxTxD, self.router_w[...].astype(c.dtype),
                   preferred_element_type=jnp.float32)
    return z.reshape(*h_BxTxD.shape[:2], c.routes, c.bits)

  def route_tokens(self, logits_BxTxRxM, *, segment_ids=None, valid=None):
    """x = concat_n E^(n)[rows]: [B, T, R, D] (orders ascending)."""
    c = self.config
    mems = [
        ngram_lookup(table[...], logits_BxTxRxM, order=n, bits=c.bits,
                     segment_ids=segment_ids, valid=valid, surrogate=c.surrogate,
                     tau=c.surrogate_tau, scale=c.surrogate_scale)
        for n, table in zip(c.orders, self.tables, strict=True)
    ]
    return jnp.concatenate(mems, axis=-1).astype(c.dtype)

  def kv_weights(self):
    """W_K, W_V: [D, Hkv, dh] each, split from w_kv's columns."""
    c = self.config
    w = self.w_kv[...].astype(c.dtype).reshape(c.route_dim, 2, c.kv_heads, c.head_dim)
    return w[:, 0], w[:, 1]

  def query(self, h_BxTxD):
    c = self.config
    q = rms_norm(h_BxTxD, self.q_norm[...], eps=c.eps) @ self.w_q[...].astype(c.dtype)
    return q.reshape(*h_BxTxD.shape[:2], c.q_heads, c.head_dim)

  def readout(self, q_BxTxHqxDh, x_BxTxRxD):
    """o: [B, T, Hq, dh] and lse: [B, T, Hq] with the configured form."""
    c = self.config
    mem_hat = rms_norm(x_BxTxRxD, self.mem_norm[...], eps=c.eps)
    w_k, w_v = self.kv_weights()
    kwargs = dict(sink_logit=c.sink_logit, return_lse=True)
    if c.readout == "streaming":
      kwargs["chunk"] = c.route_chunk
    if c.readout in ("pallas", "pallas_fused"):  # given x, the fused kernel has no gather to do
      from kernels.sink_readout.api import pallas_readout  # optional dependency
      return pallas_readout(q_BxTxHqxDh, mem_hat, w_k, w_v, **kwargs)
    return READOUT_FORMS[c.readout](q_BxTxHqxDh, mem_hat, w_k, w_v, **kwargs)

  def fused_readout(self, q_BxTxHqxDh, logits_BxTxRxM, *, segment_ids=None, valid=None):
    """route_tokens + readout in one kernel: x never exists in HBM (o, lse)."""
    from kernels.sink_readout.fused import fused_readout  # optional dependency
    c = self.config
    w_k, w_v = self.kv_weights()
    return fused_readout(
        q_BxTxHqxDh, logits_BxTxRxM, [table[...] for table in self.tables], self.mem_norm[...],
        w_k, w_v, orders=c.orders, bits=c.bits, sink_logit=c.sink_logit, dtype=c.dtype,
        eps=c.eps, segment_ids=segment_ids, valid=valid, surrogate=c.surrogate,
        tau=c.surrogate_tau, surrogate_scale=c.surrogate_scale, return_lse=True)

  def output(self, o_BxTxHqxDh, *, segment_ids=None, valid=None):
    """Y = ṽ + SiLU(DWConv(RMSNorm_c(ṽ))), zero on padding tokens."""
    c = self.config
    B, T = o_BxTxHqxDh.shape[:2]
    v_BxTxD = o_BxTxHqxDh.reshape(B, T, -1) @ self.w_o[...].astype(c.dtype)
    conv_in = rms_norm(v_BxTxD, self.conv_norm[...], eps=c.eps)
    if valid is not None:
      conv_in = conv_in * valid[:, :, None].astype(conv_in.dtype)
    conv_out = short_conv(conv_in, self.conv_kernel[...].astype(c.dtype),
                          dilation=c.dilation, segment_ids=segment_ids)
    y_BxTxD = v_BxTxD + jax.nn.silu(conv_out)
    if valid is not None:
      y_BxTxD = y_BxTxD * valid[:, :, None].astype(y_BxTxD.dtype)
    return y_BxTxD

  def __call__(self, h_BxTxD, *, segment_ids=None, valid=None, return_aux=False):
    """The delta Y: [B, T, d]; with `return_aux`, also a dict of diagnostics.

    aux: codes [B, T, R] int32; route_mass [B, T, Hq], the probability mass on
    real routes (1 - sink mass); logits [B, T, R, M].
    """
    c = self.config
    checks.check_layer_inputs(c.d_model, h_BxTxD, segment_ids, valid)
    h_BxTxD = h_BxTxD.astype(c.dtype)
    logits_BxTxRxM = self.router_logits(h_BxTxD)
    if c.readout == "pallas_fused":
      o_BxTxHqxDh, lse_BxTxHq = self.fused_readout(
          self.query(h_BxTxD), logits_BxTxRxM, segment_ids=segment_ids, valid=valid)
    else:
      x_BxTxRxD = self.route_tokens(logits_BxTxRxM, segment_ids=segment_ids, valid=valid)
      o_BxTxHqxDh, lse_BxTxHq = self.readout(self.query(h_BxTxD), x_BxTxRxD)
    y_BxTxD = self.output(o_BxTxHqxDh, segment_ids=segment_ids, valid=valid)
    if not return_aux:
      return y_BxTxD
    from lngram_jax.addressing import codes_from_logits
    aux = {
        "codes": codes_from_logits(logits_BxTxRxM),
        "route_mass": route_mass_from_lse(lse_BxTxHq, c.sink_logit),
        "logits": logits_BxTxRxM,
    }
    return y_BxTxD, aux


def param_count(config: LngramConfig) -> dict[str, int]:
  """Parameters of one layer, with the paper's accounting (Table 3).

  total:  every parameter, tables included.
  active: what one token touches: all non-table parameters plus one row of
          each order's table per route (R·|N|·d_m).
  With two layers at d = 2048 this reproduces the paper's r16/r64/r121/r123/
  r16-m5 totals (e.g. r64/m4/KV8: 90.203M total, 18.932M active).
  """
  c = config
  d, D = c.d_model, c.route_dim
  tables = sum(c.table_rows(n) * c.mem_dim for n in c.orders)
  dense = (
      d * c.routes * c.bits                      # router_w
      + d + d * c.q_heads * c.head_dim           # q_norm, w_q
      + D + D * 2 * c.kv_heads * c.head_dim      # mem_norm, w_kv
      + c.q_heads * c.head_dim * d               # w_o
      + d + c.conv_kernel * d                    # conv_norm, conv_kernel
  )
  active_rows = c.routes * len(c.orders) * c.mem_dim
  return {"total": tables + dense, "active": dense + active_rows,
          "tables": tables, "dense": dense}
