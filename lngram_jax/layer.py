"""The Lngram v2 layer as an NNX module: parameters over the functional core.

The maths is `lngram_jax.core.forward` (written once; the sharded layer and
decode run it too). The layer returns the delta Y; the caller adds it to the
residual stream before that layer's attention (paper §2.4, DESIGN.md §2).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from flax import nnx

from lngram_jax import checks, core
from lngram_jax.config import LngramConfig
from lngram_jax.lookup import check_surrogate_impl


def _normal(std):
  return nnx.initializers.normal(stddev=std)


class LngramV2(nnx.Module):
  """One Lngram v2 memory branch (paper §2; inits of Table 13).

  Parameters (names are stable: checkpoints and analyses use them):
    router_w      [D, R·M]            bit j of route r is column r·M + j. The
                                      router norm is affine-free: a scale before
                                      a thresholded projection is absorbed by W_q
                                      (this also matches the paper's counts).
    tables[i]     [R·C^n, Dm]         one per order, ascending.
    q_norm        [D], w_q [D, Hq·Dh]
    mem_norm      [Dr], w_kv [Dr, 2·Hkv·Dh]  first Hkv·Dh columns are K, rest V.
    w_o           [Hq·Dh, D]          zero-init.
    conv_norm     [D], conv_kernel [W, D]  zero-init.

  `surrogate_impl` ("auto", "gather", "blocks" or "triton"; `lngram_jax.lookup`,
  DESIGN.md §2.7) is how the router's surrogate gradient is computed (the same maths
  in each): an attribute of the layer, not a parameter and not in the config, so
  checkpoints do not depend on it. A jitted call runs the value it was traced with;
  `set_surrogate_impl` sets it on every layer of a model.
  """

  def __init__(self, config: LngramConfig, *, rngs: nnx.Rngs, surrogate_impl: str = "auto"):
    check_surrogate_impl(surrogate_impl)
    self.config = config
    self.surrogate_impl = surrogate_impl
    c = config
    d, R, M, Dr = c.d_model, c.routes, c.bits, c.route_dim
    pd = c.param_dtype
    self.router_w = nnx.Param(_normal(c.init_std)(rngs.params(), (d, R * M), pd))
    self.tables = nnx.List([
        nnx.Param(_normal(c.table_init_std)(rngs.params(), (c.table_rows(n), c.mem_dim), pd))
        for n in c.orders
    ])
    self.q_norm = nnx.Param(jnp.ones((d,), pd))
    self.w_q = nnx.Param(_normal(c.init_std)(rngs.params(), (d, c.q_heads * c.head_dim), pd))
    self.mem_norm = nnx.Param(jnp.ones((Dr,), pd))
    self.w_kv = nnx.Param(
        _normal(c.init_std)(rngs.params(), (Dr, 2 * c.kv_heads * c.head_dim), pd))
    self.w_o = nnx.Param(jnp.zeros((c.q_heads * c.head_dim, d), pd))
    self.conv_norm = nnx.Param(jnp.ones((d,), pd))
    self.conv_kernel = nnx.Param(jnp.zeros((c.conv_kernel, d), pd))

  def param_arrays(self) -> core.LngramParams:
    """The raw arrays as the functional core's container."""
    return core.LngramParams(
        router_w=self.router_w[...], tables=tuple(t[...] for t in self.tables),
        q_norm=self.q_norm[...], w_q=self.w_q[...], mem_norm=self.mem_norm[...],
        w_kv=self.w_kv[...], w_o=self.w_o[...], conv_norm=self.conv_norm[...],
        conv_kernel=self.conv_kernel[...])

  def router_logits(self, h_BxTxD):
    """z: [B, T, R, M], at least float32 (the analyses read the codes from it)."""
    return core.router_logits(self.param_arrays(), self.config, h_BxTxD)

  def __call__(self, h_BxTxD, *, segment_ids=None, valid=None, return_aux=False):
    """The delta Y: [B, T, D]; with `return_aux`, also a dict of diagnostics.

    aux: codes [B, T, R] int32; route_mass [B, T, Hq], the probability mass on
    real routes (1 - sink mass); logits [B, T, R, M].
    """
    c = self.config
    checks.check_layer_inputs(c.d_model, h_BxTxD, segment_ids, valid)
    impl = self.surrogate_impl
    check_surrogate_impl(impl)   # it may have been set after construction
    read = None
    if c.readout == "pallas_fused":
      from lngram_jax.fused import fused_read  # imports the kernels only when used
      read = functools.partial(fused_read, segment_ids=segment_ids, valid=valid,
                               surrogate_impl=impl)
    y_BxTxD, trace = core.forward(self.param_arrays(), c, h_BxTxD, segment_ids=segment_ids,
                                  valid=valid, read=read, surrogate_impl=impl)
    if not return_aux:
      return y_BxTxD
    return y_BxTxD, core.aux_outputs(c, trace)


def set_surrogate_impl(model: nnx.Module, impl: str) -> int:
  """Sets `surrogate_impl` on every `LngramV2` in `model` (itself included).

  For a model that builds its layers itself; set it before the model is split or
  jitted (a traced graph keeps the value it was traced with). Returns the number of
  layers set.
  """
  check_surrogate_impl(impl)
  layers = [m for _, m in nnx.iter_modules(model) if isinstance(m, LngramV2)]
  for layer in layers:
    layer.surrogate_impl = impl
  return len(layers)


def param_count(config: LngramConfig) -> dict[str, int]:
  """Parameters of one layer, with the paper's accounting (Table 3).

  total:  every parameter, tables included: Σ_n R·C^n·Dm table entries plus
          router_w D·R·M, q_norm D, w_q D·Hq·Dh, mem_norm Dr,
          w_kv Dr·2·Hkv·Dh, w_o Hq·Dh·D, conv_norm D and conv_kernel W·D.
  active: what one token touches: all non-table parameters plus one row of
          each order's table per route (R·|N|·Dm).
  Also "tables" and "dense" (total = tables + dense). The sink adds nothing
  (b0 is a constant), so sink=False counts the same. Twice these numbers
  (two layers) at d = 2048, orders (2, 3), Hq = 16, Dh = Dm = 128 (256 in the
  mem256 rows, where Hq·Dh = 4096 ≠ d) reproduce all seven rows of the
  paper's Table 3 to the printed 0.001M: r16/m4/KV8 35.939M / 18.121M,
  r64/m4/KV8 90.203M / 18.932M, r23/m4/KV8/mem256 89.400M / 38.175M,
  r512/m4/KV8/mem256 1187.014M / 46.687M, r16/m5/KV2 155.804M / 17.400M,
  r123/m4/KV2 156.115M / 19.143M, r121/m4/KV16 155.689M / 20.944M (total /
  active; tests/lngram_jax/test_layer.py).
  """
  c = config
  d, Dr = c.d_model, c.route_dim
  tables = sum(c.table_rows(n) * c.mem_dim for n in c.orders)
  dense = (
      d * c.routes * c.bits                      # router_w
      + d + d * c.q_heads * c.head_dim           # q_norm, w_q
      + Dr + Dr * 2 * c.kv_heads * c.head_dim    # mem_norm, w_kv
      + c.q_heads * c.head_dim * d               # w_o
      + d + c.conv_kernel * d                    # conv_norm, conv_kernel
  )
  active_rows = c.routes * len(c.orders) * c.mem_dim
  return {"total": tables + dense, "active": dense + active_rows,
          "tables": tables, "dense": dense}
