"""The Lngram v2 forward, written once, over a container of the layer's arrays.

    z = RMSNorm(h) W_q                     router logits [B, T, R, M]
    m^(n) = E^(n)[rows^(n)(z > 0)]         exact lookup per order (surrogate vjp)
    x = concat_n m^(n)                     route tokens [B, T, R, Dr]
    o = SinkGQA(RMSNorm_q(h) W_Q, RMSNorm_m(x) W_K, RMSNorm_m(x) W_V)
    ṽ = o W_O;  Y = ṽ + SiLU(DWConv(RMSNorm_c(ṽ))),  zero on padding tokens

(paper §2.4; conventions in DESIGN.md §2). Every caller runs `forward`; what
differs between them is passed in as one of three pieces, and nothing else:

  lookup(table_ExDm, logits_BxTxRxM, order) -> mem_BxTxRxDm
      plain `ngram_lookup` (the layer), a table shard's lookup with halo
      (`sharding/layer.py`), or the short history window (`decode.py`);
  readout(q_BxTxHqxDh, mem_hat_BxTxRxDr, w_k, w_v, *, sink_logit) -> (o, lse)
      one of the readout forms, or the route-parallel merge; `read` replaces
      lookup + norm + readout at once (the fused kernel, `fused.py`);
  conv(x_BxTxD, kernel_WxD, *, dilation) -> y_BxTxD
      plain `short_conv`, the halo conv of context parallelism, or the decode
      state's window.

`forward` returns the delta Y and a `Trace` (router logits, lse, conv input)
from which the layer builds its aux outputs and decode its state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from lngram_jax.addressing import codes_from_logits
from lngram_jax.config import LngramConfig
from lngram_jax.conv import short_conv
from lngram_jax.lookup import ngram_lookup
from lngram_jax.norms import rms_norm
from lngram_jax.readout import READOUT_FORMS, route_mass_from_lse

LookupFn = Callable[..., jax.Array]
ReadoutFn = Callable[..., tuple[jax.Array, jax.Array]]
ConvFn = Callable[..., jax.Array]

PARAM_NAMES = ("router_w", "tables", "q_norm", "w_q", "mem_norm", "w_kv", "w_o",
               "conv_norm", "conv_kernel")


@struct.dataclass
class LngramParams:
  """The arrays of one layer (names and shapes of `LngramV2`'s parameters).

  router_w [D, R·M]; tables: one [R·C^n, Dm] per order; q_norm [D];
  w_q [D, Hq·Dh]; mem_norm [Dr]; w_kv [Dr, 2·Hkv·Dh]; w_o [Hq·Dh, D];
  conv_norm [D]; conv_kernel [W, D]. Inside a route-parallel shard, R and
  the table rows are the shard's own.
  """

  router_w: Any
  tables: tuple
  q_norm: Any
  w_q: Any
  mem_norm: Any
  w_kv: Any
  w_o: Any
  conv_norm: Any
  conv_kernel: Any

  @classmethod
  def from_state(cls, state: dict) -> LngramParams:
    """From a pure-dict state (`nnx.to_pure_dict`); tables keyed 0, 1, ...

    Keys other than the layer's own (a subclass's extra state) are ignored.
    """
    tables = state["tables"]
    if isinstance(tables, dict):
      tables = [tables[i] for i in sorted(tables)]
    return cls(**{name: state[name] for name in PARAM_NAMES if name != "tables"},
               tables=tuple(tables))


class Trace(NamedTuple):
  """What the forward computed on the way, for aux outputs and decode states."""

  logits_BxTxRxM: jax.Array  # router logits z (float32, or the wider activation dtype)
  lse_BxTxHq: jax.Array      # readout log-sum-exp over {sink, routes}
  conv_in_BxTxD: jax.Array   # RMSNorm_c(ṽ), zero on padding tokens


# --- the stages ------------------------------------------------------------------


def router_logits(p: LngramParams, config: LngramConfig, h_BxTxD):
  """z: [B, T, R, M] in float32, or float64 for a float64 layer.

  At least float32 so that thresholds do not flip with a narrow activation dtype;
  never below the activation dtype, so that a float64 layer stays float64. The
  router norm is affine-free: a scale before a thresholded projection is absorbed
  by W_q (this also matches the paper's parameter counts).
  """
  c = config
  u_BxTxD = rms_norm(h_BxTxD, eps=c.eps)
  z = jnp.einsum("btd,dz->btz", u_BxTxD, p.router_w.astype(c.dtype),
                 preferred_element_type=jnp.promote_types(c.dtype, jnp.float32))
  return z.reshape(*h_BxTxD.shape[:2], -1, c.bits)


def query(p: LngramParams, config: LngramConfig, h_BxTxD):
  """Q = RMSNorm_q(h) W_Q: [B, T, Hq, Dh]."""
  c = config
  q = rms_norm(h_BxTxD, p.q_norm, eps=c.eps) @ p.w_q.astype(c.dtype)
  return q.reshape(*h_BxTxD.shape[:2], c.q_heads, c.head_dim)


def kv_weights(p: LngramParams, config: LngramConfig):
  """W_K, W_V: [Dr, Hkv, Dh] each; the first Hkv·Dh columns of w_kv are K."""
  c = config
  w = p.w_kv.astype(c.dtype).reshape(c.route_dim, 2, c.kv_heads, c.head_dim)
  return w[:, 0], w[:, 1]


def plain_lookup(config: LngramConfig, *, segment_ids=None, valid=None,
                 surrogate_impl: str = "auto") -> LookupFn:
  """The unsharded lookup piece: `ngram_lookup` with the config's surrogate, its
  backward computed by `surrogate_impl` (`ngram_lookup`'s argument)."""
  c = config

  def lookup(table_ExDm, logits_BxTxRxM, order):
    return ngram_lookup(table_ExDm, logits_BxTxRxM, order=order, bits=c.bits,
                        segment_ids=segment_ids, valid=valid, surrogate=c.surrogate,
                        tau=c.surrogate_tau, scale=c.surrogate_scale,
                        surrogate_impl=surrogate_impl)

  return lookup


def route_tokens(p: LngramParams, config: LngramConfig, logits_BxTxRxM, *, lookup: LookupFn):
  """x = concat_n E^(n)[rows]: [B, T, R, Dr] (orders ascending, activation dtype)."""
  mems = [lookup(table, logits_BxTxRxM, n)
          for n, table in zip(config.orders, p.tables, strict=True)]
  return jnp.concatenate(mems, axis=-1).astype(config.dtype)


def form_readout(config: LngramConfig) -> ReadoutFn:
  """The readout piece the config names (given x, "pallas_fused" is "pallas")."""
  c = config
  if c.readout in ("pallas", "pallas_fused"):
    from lngram_jax.pallas import pallas_readout  # imports the kernels only when used
    form = pallas_readout
  elif c.readout == "streaming":
    form = functools.partial(READOUT_FORMS["streaming"], chunk=c.route_chunk)
  else:
    form = READOUT_FORMS[c.readout]
  return functools.partial(form, return_lse=True)


def read_tokens(p: LngramParams, config: LngramConfig, q_BxTxHqxDh, x_BxTxRxDr, *,
                readout: ReadoutFn, sink_logit=None):
  """o: [B, T, Hq, Dh] and lse: [B, T, Hq] of the readout over x̂ = RMSNorm_m(x).

  sink_logit: b0; None = the config's constant (tests pass a traced one).
  """
  c = config
  mem_hat_BxTxRxDr = rms_norm(x_BxTxRxDr, p.mem_norm, eps=c.eps)
  w_k, w_v = kv_weights(p, c)
  return readout(q_BxTxHqxDh, mem_hat_BxTxRxDr, w_k, w_v,
                 sink_logit=c.sink_logit if sink_logit is None else sink_logit)


def read_memory(p: LngramParams, config: LngramConfig, q_BxTxHqxDh, logits_BxTxRxM, *,
                lookup: LookupFn, readout: ReadoutFn, sink_logit=None):
  """o: [B, T, Hq, Dh] and lse: [B, T, Hq]: lookup, RMSNorm_m, readout."""
  x_BxTxRxDr = route_tokens(p, config, logits_BxTxRxM, lookup=lookup)
  return read_tokens(p, config, q_BxTxHqxDh, x_BxTxRxDr, readout=readout,
                     sink_logit=sink_logit)


def output(p: LngramParams, config: LngramConfig, o_BxTxHqxDh, *, valid=None, conv: ConvFn):
  """(Y, conv input): Y = ṽ + SiLU(conv(RMSNorm_c(ṽ))), zero on padding tokens."""
  c = config
  B, T = o_BxTxHqxDh.shape[:2]
  v_BxTxD = o_BxTxHqxDh.reshape(B, T, -1) @ p.w_o.astype(c.dtype)
  conv_in_BxTxD = rms_norm(v_BxTxD, p.conv_norm, eps=c.eps)
  # Masks select, never multiply: NaN·0 = NaN would carry a padding position's
  # value into the taps of valid tokens, and a mask of 2s would scale Y.
  if valid is not None:
    valid_BxTx1 = valid.astype(bool)[:, :, None]
    conv_in_BxTxD = jnp.where(valid_BxTx1, conv_in_BxTxD, 0).astype(conv_in_BxTxD.dtype)
  conv_out_BxTxD = conv(conv_in_BxTxD, p.conv_kernel.astype(c.dtype), dilation=c.dilation)
  y_BxTxD = v_BxTxD + jax.nn.silu(conv_out_BxTxD)
  if valid is not None:
    y_BxTxD = jnp.where(valid_BxTx1, y_BxTxD, 0).astype(y_BxTxD.dtype)
  return y_BxTxD, conv_in_BxTxD


# --- the whole forward -------------------------------------------------------------


def forward(p: LngramParams, config: LngramConfig, h_BxTxD, *, segment_ids=None,
            valid=None, lookup: LookupFn | None = None, readout: ReadoutFn | None = None,
            read: Callable | None = None, conv: ConvFn | None = None,
            surrogate_impl: str = "auto"):
  """The delta Y: [B, T, D] and its `Trace`.

  Args:
    p, config: the layer's arrays and its config (R = the local routes
      inside a route-parallel shard).
    h_BxTxD: the layer input; cast to `config.dtype`.
    segment_ids, valid: packed-sequence ids and token mask [B, T] (bool);
      the default pieces use them, `valid` also selects zero for h, the conv
      input and Y at padding tokens.
    lookup, readout, conv: the pieces (module docstring); None = the plain
      layer's (`plain_lookup`, the config's readout form, `short_conv`).
    read: `read(p, config, q, logits) -> (o, lse)` replacing lookup, memory
      norm and readout together (the fused kernel).
    surrogate_impl: the default lookup's backward implementation (`ngram_lookup`'s
      argument); a `lookup` or `read` given passes its own.
  """
  c = config
  h_BxTxD = h_BxTxD.astype(c.dtype)
  if valid is not None:
    # Padding positions compute from zeros: whatever they hold (NaN, inf)
    # reaches neither valid outputs nor, through 0·NaN, any gradient.
    valid = valid.astype(bool)
    h_BxTxD = jnp.where(valid[:, :, None], h_BxTxD, 0).astype(c.dtype)
  logits_BxTxRxM = router_logits(p, c, h_BxTxD)
  q_BxTxHqxDh = query(p, c, h_BxTxD)
  if read is None:
    read = functools.partial(
        read_memory,
        lookup=plain_lookup(c, segment_ids=segment_ids, valid=valid,
                            surrogate_impl=surrogate_impl) if lookup is None else lookup,
        readout=form_readout(c) if readout is None else readout)
  o_BxTxHqxDh, lse_BxTxHq = read(p, c, q_BxTxHqxDh, logits_BxTxRxM)
  if conv is None:
    conv = functools.partial(short_conv, segment_ids=segment_ids)
  y_BxTxD, conv_in_BxTxD = output(p, c, o_BxTxHqxDh, valid=valid, conv=conv)
  return y_BxTxD, Trace(logits_BxTxRxM, lse_BxTxHq, conv_in_BxTxD)


def aux_outputs(config: LngramConfig, trace: Trace) -> dict:
  """codes [B, T, R] int32, route_mass [B, T, Hq] (1 - sink mass), logits [B, T, R, M]."""
  return {
      "codes": codes_from_logits(trace.logits_BxTxRxM),
      "route_mass": route_mass_from_lse(trace.lse_BxTxHq, config.sink_logit),
      "logits": trace.logits_BxTxRxM,
  }
