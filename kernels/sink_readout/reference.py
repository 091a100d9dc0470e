"""XLA reference of the sink readout: the obviously-correct twin of the kernels.

Per token n and query head h, with scores s_r = scale·q_h·mem_r:

    lse_h = log(exp(b0) + Σ_r exp(s_r)),   α_r = exp(s_r)/exp(lse_h),
    out_h = Σ_r α_r mem_r.

The sink has logit b0 and a zero value, so it only enters the denominator.
Everything after the score matmul is in the statistics dtype: float32 for
float32 and narrower inputs, the input dtype when it is wider (a float64 caller
stays float64); the output is cast back to q's dtype. Gradients come from XLA's
autodiff of this function.

This is the one XLA definition of the readout contract: `lngram_jax`'s
absorbed readout uses it as its multi-query core. `fused_reference` is the
twin of the fused kernel (`fused_triton.py`): gather, RMSNorm, then the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def stat_dtype(dtype):
  """The dtype of scores and softmax statistics: at least float32, never below `dtype`."""
  return jnp.promote_types(dtype, jnp.float32)


def sink_readout_reference(q_BTxHqxDr, mem_BTxRxDr, *, sink_logit, scale: float = 1.0):
  """(out_BTxHqxDr in q's dtype, lse_BTxHq in `stat_dtype(q.dtype)`) of the readout.

  sink_logit: b0, a float or a scalar (differentiable here).
  """
  acc = stat_dtype(q_BTxHqxDr.dtype)
  s_BTxHqxR = jnp.einsum("nhd,nrd->nhr", q_BTxHqxDr, mem_BTxRxDr,
                        preferred_element_type=acc) * scale
  # Shift by the largest logit (sink included) before exp, and normalise by the
  # sum rather than through exp(s - lse): at scores ~1e4 the latter loses
  # ~1e-4 relative precision to the rounding of lse.
  m_BTxHq = jnp.maximum(jnp.max(s_BTxHqxR, axis=-1), sink_logit)
  e_BTxHqxR = jnp.exp(s_BTxHqxR - m_BTxHq[..., None])
  denom_BTxHq = jnp.exp(sink_logit - m_BTxHq) + jnp.sum(e_BTxHqxR, axis=-1)
  lse_BTxHq = m_BTxHq + jnp.log(denom_BTxHq)
  p_BTxHqxR = e_BTxHqxR / denom_BTxHq[..., None]
  out_BTxHqxDr = jnp.einsum("nhr,nrd->nhd", p_BTxHqxR, mem_BTxRxDr.astype(acc),
                          preferred_element_type=acc)
  return out_BTxHqxDr.astype(q_BTxHqxDr.dtype), lse_BTxHq


def sink_readout_reference_bwd(q_BTxHqxDr, mem_BTxRxDr, sink_logit, dout_BTxHqxDr, dlse_BTxHq, *,
                               scale: float = 1.0):
  """(dq, dmem, d_sink_logit) by XLA autodiff of the reference: the kernels' fallback."""
  _, vjp = jax.vjp(
      lambda q, m, b0: sink_readout_reference(q, m, sink_logit=b0, scale=scale),
      q_BTxHqxDr, mem_BTxRxDr, jnp.asarray(sink_logit, stat_dtype(q_BTxHqxDr.dtype)))
  return vjp((dout_BTxHqxDr, dlse_BTxHq))


def gather_rows(tables, rows, dtype):
  """Per table [BT, R, Dm]: table[rows] rounded to `dtype`, zero where the row id is -1."""
  return [jnp.where((r >= 0)[..., None], jnp.take(t, jnp.maximum(r, 0), axis=0), 0).astype(dtype)
          for t, r in zip(tables, rows, strict=True)]


def fused_reference(q_BTxHqxDr, xs, norm_scale_Dr, sink_logit, *, scale: float, eps: float):
  """(out, lse) of the fused kernel given its gathered rows `xs` (`gather_rows`).

  x̂ = concat(xs)·rsqrt(mean(x²) + eps)·γ with statistics in `stat_dtype`, rounded
  to q's dtype, then `sink_readout_reference(q, x̂)`.
  """
  acc = stat_dtype(q_BTxHqxDr.dtype)
  x_BTxRxDr = jnp.concatenate(xs, axis=-1).astype(acc)
  inv_BTxRx1 = jax.lax.rsqrt(jnp.mean(x_BTxRxDr * x_BTxRxDr, axis=-1, keepdims=True) + eps)
  xhat_BTxRxDr = (x_BTxRxDr * inv_BTxRx1 * norm_scale_Dr.astype(acc)).astype(q_BTxHqxDr.dtype)
  return sink_readout_reference(q_BTxHqxDr, xhat_BTxRxDr, sink_logit=sink_logit, scale=scale)
