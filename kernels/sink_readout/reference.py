"""XLA reference of the sink readout: the obviously-correct twin of the kernels.

Per token n and query head h, with scores s_r = scale·q_h·mem_r:

    lse_h = log(exp(b0) + Σ_r exp(s_r)),   α_r = exp(s_r - lse_h),
    out_h = Σ_r α_r mem_r.

The sink has logit b0 and a zero value, so it only enters the denominator.
Everything after the score matmul is float32; the output is cast back to q's
dtype. Gradients come from XLA's autodiff of this function.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sink_readout_reference(q_NxHqxD, mem_NxRxD, *, sink_logit, scale: float = 1.0):
  """(out_NxHqxD in q's dtype, lse_NxHq float32) of the sink-softmax readout.

  sink_logit: b0, a float or a float32 scalar (differentiable here).
  """
  s_NxHqxR = jnp.einsum("nhd,nrd->nhr", q_NxHqxD, mem_NxRxD,
                        preferred_element_type=jnp.float32) * scale
  sink_NxHqx1 = jnp.full((*s_NxHqxR.shape[:2], 1), sink_logit, jnp.float32)
  lse_NxHq = jax.nn.logsumexp(jnp.concatenate([sink_NxHqx1, s_NxHqxR], axis=-1), axis=-1)
  p_NxHqxR = jnp.exp(s_NxHqxR - lse_NxHq[..., None])
  out_NxHqxD = jnp.einsum("nhr,nrd->nhd", p_NxHqxR, mem_NxRxD.astype(jnp.float32),
                          preferred_element_type=jnp.float32)
  return out_NxHqxD.astype(q_NxHqxD.dtype), lse_NxHq


def sink_readout_reference_bwd(q_NxHqxD, mem_NxRxD, sink_logit, dout_NxHqxD, dlse_NxHq, *,
                               scale: float = 1.0):
  """(dq, dmem, d_sink_logit) by XLA autodiff of the reference: the kernels' fallback."""
  _, vjp = jax.vjp(
      lambda q, m, b0: sink_readout_reference(q, m, sink_logit=b0, scale=scale),
      q_NxHqxD, mem_NxRxD, jnp.asarray(sink_logit, jnp.float32))
  return vjp((dout_NxHqxD, dlse_NxHq))
