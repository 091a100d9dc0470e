"""Route-parallel readout: partial online-softmax states merged across shards.

The absorbed readout is a multi-query attention of Hq queries q̃ of width Dr
over R keys = values = x̂_r, plus a sink of fixed logit b0 and zero value. Split
the routes over the `table` axis; shard s sees routes R_s and computes, per
token and query head,

    m_s = max_{r∈R_s} s_r,   l_s = Σ_{r∈R_s} e^{s_r - m_s},   u_s = Σ_{r∈R_s} e^{s_r - m_s} x̂_r

(float32 statistics). The log-sum-exp merge over shards is

    m = max(b0, max_s m_s),  l = e^{b0 - m} + Σ_s l_s e^{m_s - m},  u = Σ_s u_s e^{m_s - m} / l,

with the sink added once, after the reduction. Only (m, l, u), Hq·(Dr + 2)
values per token, cross the network instead of the R·Dr route tokens. The
merged maximum is a stabiliser: the result does not depend on it, so it carries
no gradient (`stop_gradient`), and the backward is the exact gradient.

With `kernel=True` (the layer's `readout="pallas"` or `"pallas_fused"`) a shard's
state comes, in a program lowered for TPU or GPU, from the Pallas sink-readout
kernel run without a sink (b0 = -inf): its (out_s, lse_s) is the state (m = lse_s,
l = 1, u = out_s), the same merge, with the gradient flowing through lse_s and
out_s into the kernel's backward.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from kernels.out_shapes import vary_like
from lngram_jax.readout import absorb_query, project_values
from lngram_jax.sharding.mesh import ShardingConfig, route_spec, token_spec


def _stat_dtype(dtype):
  return jnp.promote_types(dtype, jnp.float32)


def partial_sink_attention_reference(q_BxTxHqxDr, mem_BxTxRxDr, *, scale):
  """The online-softmax state of one shard's routes, without the sink, differentiated
  by jax: the twin of `partial_sink_attention`.

  Returns m_BxTxHq (no gradient), l_BxTxHq and u_BxTxHqxDr, all float32 or wider.
  """
  acc = _stat_dtype(q_BxTxHqxDr.dtype)
  s_BxTxHqxR = jnp.einsum("bthd,btrd->bthr", q_BxTxHqxDr, mem_BxTxRxDr,
                          preferred_element_type=acc) * scale
  m_BxTxHq = jax.lax.stop_gradient(jnp.max(s_BxTxHqxR, axis=-1))
  e_BxTxHqxR = jnp.exp(s_BxTxHqxR - m_BxTxHq[..., None])
  l_BxTxHq = jnp.sum(e_BxTxHqxR, axis=-1)
  u_BxTxHqxDr = jnp.einsum("bthr,btrd->bthd", e_BxTxHqxR.astype(mem_BxTxRxDr.dtype),
                          mem_BxTxRxDr, preferred_element_type=acc)
  return m_BxTxHq, l_BxTxHq, u_BxTxHqxDr


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _partial_state(q_BxTxHqxDr, mem_BxTxRxDr, scale):
  return partial_sink_attention_reference(q_BxTxHqxDr, mem_BxTxRxDr, scale=scale)


def _partial_state_fwd(q_BxTxHqxDr, mem_BxTxRxDr, scale):
  state = partial_sink_attention_reference(q_BxTxHqxDr, mem_BxTxRxDr, scale=scale)
  return state, (q_BxTxHqxDr, mem_BxTxRxDr, state[0])


def _partial_state_bwd(scale, res, cts):
  """The gradient of the reference, with the route tokens' gradient made by ONE matmul
  in their own dtype: dx̂_r = Σ_h [scale·ds_hr, e_hr]·[q̃_h; du_h]. jax's autodiff of the
  reference writes the two terms as two float32 [B, T, R, Dr] products and their sum:
  3 × 8 GiB a device for Keye30B's route tokens (32,768 tokens × 128 routes × 512) where
  the tokens themselves are 4 GiB in bfloat16. The scores are recomputed from q̃ and x̂
  (an [B, T, Hq, R] matmul, R·Dr/Dr times smaller than x̂)."""
  q_BxTxHqxDr, mem_BxTxRxDr, m_BxTxHq = res
  _, dl_BxTxHq, du_BxTxHqxDr = cts   # m carries no gradient (a stabiliser)
  acc = _stat_dtype(q_BxTxHqxDr.dtype)
  s_BxTxHqxR = jnp.einsum("bthd,btrd->bthr", q_BxTxHqxDr, mem_BxTxRxDr,
                          preferred_element_type=acc) * scale
  e_BxTxHqxR = jnp.exp(s_BxTxHqxR - m_BxTxHq[..., None])
  # u = Σ_r cast(e_r) x̂_r: de_r = du·x̂_r (through the cast), dl adds 1 per route.
  de_BxTxHqxR = jnp.einsum("bthd,btrd->bthr", du_BxTxHqxDr.astype(mem_BxTxRxDr.dtype),
                           mem_BxTxRxDr, preferred_element_type=acc) + dl_BxTxHq[..., None]
  ds_BxTxHqxR = de_BxTxHqxR * e_BxTxHqxR * scale
  dq_BxTxHqxDr = jnp.einsum("bthr,btrd->bthd", ds_BxTxHqxR.astype(mem_BxTxRxDr.dtype),
                            mem_BxTxRxDr, preferred_element_type=acc)
  dt = mem_BxTxRxDr.dtype
  left_BxTxHqxRx2 = jnp.stack([ds_BxTxHqxR, e_BxTxHqxR], axis=-1).astype(dt)
  right_BxTxHqx2xDr = jnp.stack([q_BxTxHqxDr.astype(dt), du_BxTxHqxDr.astype(dt)], axis=-2)
  dmem_BxTxRxDr = jnp.einsum("bthrc,bthcd->btrd", left_BxTxHqxRx2, right_BxTxHqx2xDr)
  return dq_BxTxHqxDr.astype(q_BxTxHqxDr.dtype), dmem_BxTxRxDr


_partial_state.defvjp(_partial_state_fwd, _partial_state_bwd)


def partial_sink_attention(q_BxTxHqxDr, mem_BxTxRxDr, *, scale):
  """`partial_sink_attention_reference` with its own backward (`_partial_state_bwd`):
  the same values; the same gradients, the route tokens' in their own dtype.

  Returns m_BxTxHq (no gradient), l_BxTxHq and u_BxTxHqxDr, all float32 or wider.
  """
  # Both inputs vary over every axis either does (a shard's routes over `table`, its
  # tokens over data and seq): the backward's gradients then have their inputs' types,
  # and the casts' transposes sum q̃'s gradient over the route shards.
  q_BxTxHqxDr = vary_like(q_BxTxHqxDr, mem_BxTxRxDr)
  mem_BxTxRxDr = vary_like(mem_BxTxRxDr, q_BxTxHqxDr)
  return _partial_state(q_BxTxHqxDr, mem_BxTxRxDr, scale)


def merge_partial_attention(m_BxTxHq, l_BxTxHq, u_BxTxHqxDr, *, sink_logit,
                            axis_name: str | None):
  """Log-sum-exp merge of the shards' states over `axis_name`; the sink once.

  Returns the normalised u_BxTxHqxDr and lse_BxTxHq over {sink, all routes}.
  With `axis_name` None the state is merged with the sink only (one shard).
  """
  m_all = jax.lax.stop_gradient(m_BxTxHq)   # a stabiliser (module docstring)
  m_all = m_all if axis_name is None else jax.lax.pmax(m_all, axis_name)
  m_all = jnp.maximum(m_all, jax.lax.stop_gradient(sink_logit))
  rescale_BxTxHq = jnp.exp(m_BxTxHq - m_all)
  l_scaled = l_BxTxHq * rescale_BxTxHq
  u_scaled = u_BxTxHqxDr * rescale_BxTxHq[..., None]
  if axis_name is not None:
    l_scaled = jax.lax.psum(l_scaled, axis_name)
    u_scaled = jax.lax.psum(u_scaled, axis_name)
  total_BxTxHq = l_scaled + jnp.exp(sink_logit - m_all)
  return u_scaled / total_BxTxHq[..., None], m_all + jnp.log(total_BxTxHq)


def kernel_partial_sink_attention(q_BxTxHqxDr, mem_BxTxRxDr, *, scale, interpret=None):
  """`partial_sink_attention`'s state from the Pallas kernel run without a sink:
  (m = lse, l = 1, u = out), gradients through lse and out (module docstring).

  In a program lowered for TPU or GPU the kernel runs compiled; elsewhere (CPU) this is
  `partial_sink_attention` itself, because a Pallas kernel in interpret mode cannot run
  inside shard_map (its interpreter's loops drop the varying-axes types). `interpret=True`
  runs the kernel interpreted everywhere, for tests outside shard_map."""
  kernel = functools.partial(_kernel_state, scale=scale, interpret=interpret)
  if interpret:
    return kernel(q_BxTxHqxDr, mem_BxTxRxDr)
  xla = functools.partial(partial_sink_attention, scale=scale)
  return jax.lax.platform_dependent(q_BxTxHqxDr, mem_BxTxRxDr, tpu=kernel, cuda=kernel,
                                    rocm=kernel, default=xla)


def _kernel_state(q_BxTxHqxDr, mem_BxTxRxDr, *, scale, interpret):
  from kernels.sink_readout import sink_readout_kernel  # the Pallas backends load on first use
  B, T, Hq, Dr = q_BxTxHqxDr.shape
  out_BTxHqxDr, lse_BTxHq = sink_readout_kernel(
      q_BxTxHqxDr.reshape(B * T, Hq, Dr), mem_BxTxRxDr.reshape(B * T, -1, Dr),
      sink_logit=-jnp.inf, scale=scale, interpret=interpret)
  acc = _stat_dtype(q_BxTxHqxDr.dtype)
  lse_BxTxHq = lse_BTxHq.reshape(B, T, Hq).astype(acc)
  return (lse_BxTxHq, jnp.ones_like(lse_BxTxHq),
          out_BTxHqxDr.reshape(B, T, Hq, Dr).astype(acc))


def route_parallel_readout(q_BxTxHqxDh, mem_local_BxTxRsxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *,
                           sink_logit, axis_name: str | None, kernel: bool | str = False):
  """Inside `shard_map`: the absorbed readout over this shard's routes R_s, merged.

  `mem_local_BxTxRsxDr` is x̂ = RMSNorm_m(x) of the local routes; q, W_K, W_V are
  the full (replicated) ones. Returns o_BxTxHqxDh and lse_BxTxHq, identical on
  every shard of `axis_name` and equal to `absorbed_readout` over all routes.
  `kernel`: each shard's partial state from the Pallas kernel (module docstring); with
  `kernel="interpret"` the kernel interpreted on any platform (tests, outside shard_map).
  """
  Dh = q_BxTxHqxDh.shape[-1]
  q_abs_BxTxHqxDr = absorb_query(q_BxTxHqxDh, w_k_DrxHkvxDh).astype(mem_local_BxTxRsxDr.dtype)
  scale = 1.0 / math.sqrt(Dh)
  if kernel:
    state = kernel_partial_sink_attention(q_abs_BxTxHqxDr, mem_local_BxTxRsxDr, scale=scale,
                                          interpret=True if kernel == "interpret" else None)
  else:
    state = partial_sink_attention(q_abs_BxTxHqxDr, mem_local_BxTxRsxDr, scale=scale)
  u_BxTxHqxDr, lse_BxTxHq = merge_partial_attention(*state, sink_logit=sink_logit,
                                                   axis_name=axis_name)
  u_BxTxHqxDr = u_BxTxHqxDr.astype(q_abs_BxTxHqxDr.dtype)
  o_BxTxHqxDh = project_values(u_BxTxHqxDr, w_v_DrxHkvxDh).astype(q_BxTxHqxDh.dtype)
  return o_BxTxHqxDh, lse_BxTxHq


def sharded_readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *, sink_logit,
                    mesh, sharding: ShardingConfig | None = None):
  """The route-parallel twin of `absorbed_readout(..., return_lse=True)`.

  mem (= x̂) is split by routes over `table`, tokens over `data` and `seq`;
  q and the projections are replicated over `table`. Returns (o, lse).
  """
  s = sharding or ShardingConfig()
  body = functools.partial(
      route_parallel_readout, sink_logit=sink_logit,
      axis_name=s.table_axis if s.table_axis in mesh.axis_names else None)
  fn = jax.shard_map(
      body, mesh=mesh,
      in_specs=(token_spec(mesh, s, None, None), route_spec(mesh, s, None),
                jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec()),
      out_specs=(token_spec(mesh, s, None, None), token_spec(mesh, s, None)))
  return fn(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)
