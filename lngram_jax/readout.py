"""The grouped-query readout with a zero-value sink, in three equal forms (paper §2.4).

For query head a (KV head κ(a) = a // G) at one position:

    s_r = Q_a·K_{r,κ(a)}/√dh,   α_r = exp(s_r)/(exp(b0) + Σ_r' exp(s_r')),
    o_a = Σ_r α_r V_{r,κ(a)}.

The sink has the fixed logit b0 and a zero value, so 1 - Σ_r α_r is the mass the
head puts on "read nothing". Softmax statistics are in float32, or in the input
dtype when it is wider (a float64 readout stays float64).
Without a sink (`LngramConfig(sink=False)`) b0 = -inf: exp(b0) = 0, so every
form below, the kernels included, is the plain softmax over the routes with no
special case (each online softmax starts at max = -inf, sum = 1, and the
first route block rescales that sum by exp(-inf - max) = 0).

Forms, all given (q, x̂, W_K, W_V) with K = x̂W_K, V = x̂W_V:
  literal    materialises K, V: [B, T, R, Hkv, dh] (`sink_readout` on them);
  streaming  route chunks, online softmax from (max = b0, sum = 1), every chunk
             rematerialised in the backward: O(chunk) memory instead of O(R);
  absorbed   s = (W_K^κ Q_a)·x̂_r/√dh and o_a = (Σ_r α_r x̂_r)W_V^κ: a multi-query
             attention of Hq queries of width Dr over R keys = values = x̂, whose
             core is the kernels' XLA twin `sink_readout_reference` (one
             definition of that maths);
  pallas     the absorbed form with the Pallas kernel as its core (`pallas.py`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kernels.sink_readout.reference import sink_readout_reference
from lngram_jax import checks


def _stat_dtype(dtype):
  return jnp.promote_types(dtype, jnp.float32)


def sink_readout(q_BxTxHqxDh, k_BxTxRxHkvxDh, v_BxTxRxHkvxDh, *, sink_logit,
                 return_lse: bool = False):
  """The sink readout over explicit keys and values (the core of the literal form).

  Returns o_BxTxHqxDh (q's dtype) and, with `return_lse`, the log-sum-exp over
  {sink, routes} in float32 or wider: lse_BxTxHq (route mass = 1 - exp(b0 - lse)).
  """
  checks.check_rank("q", q_BxTxHqxDh, 4, "[B, T, Hq, dh]")
  checks.check_rank("k", k_BxTxRxHkvxDh, 5, "[B, T, R, Hkv, dh]")
  checks.check_rank("v", v_BxTxRxHkvxDh, 5, "[B, T, R, Hkv, dh]")
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  Hkv = k_BxTxRxHkvxDh.shape[3]
  if k_BxTxRxHkvxDh.shape != v_BxTxRxHkvxDh.shape:
    raise ValueError(f"k {k_BxTxRxHkvxDh.shape} and v {v_BxTxRxHkvxDh.shape} differ.")
  if k_BxTxRxHkvxDh.shape[-1] != Dh or Hq % Hkv:
    raise ValueError(
        f"q {q_BxTxHqxDh.shape} does not fit k {k_BxTxRxHkvxDh.shape}: need equal dh "
        "and Hq a multiple of Hkv.")
  G = Hq // Hkv
  acc = _stat_dtype(q_BxTxHqxDh.dtype)
  q_BxTxHkvxGxDh = q_BxTxHqxDh.reshape(B, T, Hkv, G, Dh)
  s_BxTxHkvxGxR = jnp.einsum("btkgd,btrkd->btkgr", q_BxTxHkvxGxDh, k_BxTxRxHkvxDh,
                           preferred_element_type=acc) / math.sqrt(Dh)
  p_BxTxHkvxGxR, lse_BxTxHkvxG = _sink_softmax(s_BxTxHkvxGxR, sink_logit)
  o_BxTxHkvxGxDh = jnp.einsum("btkgr,btrkd->btkgd", p_BxTxHkvxGxR,
                            v_BxTxRxHkvxDh.astype(acc), preferred_element_type=acc)
  o_BxTxHqxDh = o_BxTxHkvxGxDh.reshape(B, T, Hq, Dh).astype(q_BxTxHqxDh.dtype)
  if return_lse:
    return o_BxTxHqxDh, lse_BxTxHkvxG.reshape(B, T, Hq)
  return o_BxTxHqxDh


def _sink_softmax(s_xR, sink_logit):
  """α = exp(s)/(exp(b0) + Σ exp(s)) along the last axis, and its lse."""
  m = jnp.maximum(jnp.max(s_xR, axis=-1), sink_logit)
  e_xR = jnp.exp(s_xR - m[..., None])
  denom = jnp.exp(sink_logit - m) + jnp.sum(e_xR, axis=-1)
  return e_xR / denom[..., None], m + jnp.log(denom)


def route_mass_from_lse(lse, sink_logit):
  """Σ_r α_r = 1 - exp(b0 - lse): the probability mass on real routes (1 if b0 = -inf)."""
  return 1.0 - jnp.exp(sink_logit - lse)


def _check_projection_inputs(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh):
  checks.check_rank("q", q_BxTxHqxDh, 4, "[B, T, Hq, dh]")
  checks.check_rank("mem", mem_BxTxRxDr, 4, "[B, T, R, Dr]")
  checks.check_rank("w_k", w_k_DrxHkvxDh, 3, "[Dr, Hkv, dh]")
  if w_k_DrxHkvxDh.shape != w_v_DrxHkvxDh.shape:
    raise ValueError(f"w_k {w_k_DrxHkvxDh.shape} and w_v {w_v_DrxHkvxDh.shape} differ.")
  Dr, Hkv, Dh = w_k_DrxHkvxDh.shape
  if mem_BxTxRxDr.shape[-1] != Dr or q_BxTxHqxDh.shape[-1] != Dh:
    raise ValueError(
        f"mem {mem_BxTxRxDr.shape} / q {q_BxTxHqxDh.shape} do not fit w_k {w_k_DrxHkvxDh.shape}.")
  if q_BxTxHqxDh.shape[2] % Hkv:
    raise ValueError(f"Hq={q_BxTxHqxDh.shape[2]} must be a multiple of Hkv={Hkv}.")


def literal_readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *,
                    sink_logit, return_lse=False):
  """Project x̂ to K, V: [B, T, R, Hkv, dh], then `sink_readout`."""
  _check_projection_inputs(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)
  k_BxTxRxHkvxDh = jnp.einsum("btrd,dkh->btrkh", mem_BxTxRxDr, w_k_DrxHkvxDh)
  v_BxTxRxHkvxDh = jnp.einsum("btrd,dkh->btrkh", mem_BxTxRxDr, w_v_DrxHkvxDh)
  return sink_readout(q_BxTxHqxDh, k_BxTxRxHkvxDh, v_BxTxRxHkvxDh,
                      sink_logit=sink_logit, return_lse=return_lse)


def streaming_readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *,
                      sink_logit, chunk=64, return_lse=False):
  """The literal readout over route chunks with an online sink softmax.

  The running state starts at (max = b0, sum = 1, acc = 0): the sink counted
  once. Each chunk projects its own K, V and is rematerialised in the backward,
  so at most `chunk` routes of K, V are alive at once. A ragged last chunk is
  padded with routes whose scores are -inf. Shapes: `chunks` the number of
  chunks, Rc the routes of one chunk.
  """
  _check_projection_inputs(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  R, Dr = mem_BxTxRxDr.shape[2:]
  Hkv = w_k_DrxHkvxDh.shape[1]
  G = Hq // Hkv
  acc = _stat_dtype(q_BxTxHqxDh.dtype)
  chunk = max(1, min(chunk, R))
  n_chunks = -(-R // chunk)
  pad = n_chunks * chunk - R
  padded_BxTxRxDr = jnp.pad(mem_BxTxRxDr, ((0, 0), (0, 0), (0, pad), (0, 0)))  # R + pad routes
  mem_chunksxBxTxRcxDr = jnp.moveaxis(padded_BxTxRxDr.reshape(B, T, n_chunks, chunk, Dr), 2, 0)
  real_chunksxRc = (jnp.arange(n_chunks * chunk) < R).reshape(n_chunks, chunk)
  q_BxTxHkvxGxDh = q_BxTxHqxDh.reshape(B, T, Hkv, G, Dh)
  neg_inf = jnp.finfo(acc).min

  @jax.checkpoint
  def chunk_step(state, inputs):
    m_run, l_run, o_run = state
    mem_BxTxRcxDr, real_Rc = inputs
    k_BxTxRcxHkvxDh = jnp.einsum("btrd,dkh->btrkh", mem_BxTxRcxDr, w_k_DrxHkvxDh)
    v_BxTxRcxHkvxDh = jnp.einsum("btrd,dkh->btrkh", mem_BxTxRcxDr, w_v_DrxHkvxDh)
    s = jnp.einsum("btkgd,btrkd->btkgr", q_BxTxHkvxGxDh, k_BxTxRcxHkvxDh,
                   preferred_element_type=acc) / math.sqrt(Dh)
    s = jnp.where(real_Rc, s, neg_inf)
    m_new = jnp.maximum(m_run, jnp.max(s, axis=-1))
    correction = jnp.exp(m_run - m_new)
    e = jnp.exp(s - m_new[..., None])
    l_new = l_run * correction + jnp.sum(e, axis=-1)
    o_new = o_run * correction[..., None] + jnp.einsum(
        "btkgr,btrkd->btkgd", e, v_BxTxRcxHkvxDh.astype(acc), preferred_element_type=acc)
    return (m_new, l_new, o_new), None

  # Built from q (`*_like`) so that inside shard_map the carry has q's
  # varying-axes type, as scan requires.
  o0 = jnp.zeros_like(q_BxTxHkvxGxDh, dtype=acc)
  m0 = jnp.full_like(o0[..., 0], sink_logit)
  l0 = jnp.ones_like(o0[..., 0])
  (m, total, o), _ = jax.lax.scan(chunk_step, (m0, l0, o0), (mem_chunksxBxTxRcxDr, real_chunksxRc))
  o_BxTxHqxDh = (o / total[..., None]).reshape(B, T, Hq, Dh).astype(q_BxTxHqxDh.dtype)
  if return_lse:
    return o_BxTxHqxDh, (m + jnp.log(total)).reshape(B, T, Hq)
  return o_BxTxHqxDh


def mqa_sink_attention(q_BxTxHqxDr, mem_BxTxRxDr, *, sink_logit, scale, core=None):
  """Multi-query sink attention with keys = values = mem (the absorbed core).

  u_a = Σ_r α_r mem_r with α over {sink, routes} and scores scale·q_a·mem_r.
  The maths is the kernels' XLA twin (`kernels.sink_readout.
  sink_readout_reference`) on BT = B·T flattened tokens; `core` swaps in another op with
  that [BT, ...] contract (the Pallas kernel, `lngram_jax.pallas`).
  Returns u_BxTxHqxDr (q's dtype) and lse_BxTxHq (float32, float64 for float64 q).
  """
  core = sink_readout_reference if core is None else core
  B, T, Hq, Dr = q_BxTxHqxDr.shape
  R = mem_BxTxRxDr.shape[2]
  u_BTxHqxDr, lse_BTxHq = core(q_BxTxHqxDr.reshape(B * T, Hq, Dr),
                             mem_BxTxRxDr.reshape(B * T, R, Dr),
                             sink_logit=sink_logit, scale=scale)
  return u_BTxHqxDr.reshape(B, T, Hq, Dr), lse_BTxHq.reshape(B, T, Hq)


def absorb_query(q_BxTxHqxDh, w_k_DrxHkvxDh):
  """q̃_a = W_K^{κ(a)} Q_a: [B, T, Hq, Dr], the query in the route-token space."""
  B, T, Hq, Dh = q_BxTxHqxDh.shape
  Hkv = w_k_DrxHkvxDh.shape[1]
  q_BxTxHkvxGxDh = q_BxTxHqxDh.reshape(B, T, Hkv, Hq // Hkv, Dh)
  q_abs = jnp.einsum("btkgh,dkh->btkgd", q_BxTxHkvxGxDh, w_k_DrxHkvxDh)
  return q_abs.reshape(B, T, Hq, -1)


def project_values(u_BxTxHqxDr, w_v_DrxHkvxDh):
  """o_a = u_a W_V^{κ(a)}: [B, T, Hq, dh]."""
  B, T, Hq, Dr = u_BxTxHqxDr.shape
  Hkv = w_v_DrxHkvxDh.shape[1]
  u_BxTxHkvxGxDr = u_BxTxHqxDr.reshape(B, T, Hkv, Hq // Hkv, Dr)
  o = jnp.einsum("btkgd,dkh->btkgh", u_BxTxHkvxGxDr, w_v_DrxHkvxDh)
  return o.reshape(B, T, Hq, -1)


def absorbed_readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *,
                     sink_logit, return_lse=False, attention=None):
  """The absorbed form: no [B, T, R, Hkv, dh] tensor is ever built.

  `attention` swaps the multi-query core (default `mqa_sink_attention`) for a
  kernel with the same contract.
  """
  _check_projection_inputs(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)
  Dh = q_BxTxHqxDh.shape[-1]
  attention = mqa_sink_attention if attention is None else attention
  q_abs_BxTxHqxDr = absorb_query(q_BxTxHqxDh, w_k_DrxHkvxDh).astype(mem_BxTxRxDr.dtype)
  u_BxTxHqxDr, lse_BxTxHq = attention(
      q_abs_BxTxHqxDr, mem_BxTxRxDr, sink_logit=sink_logit, scale=1.0 / math.sqrt(Dh))
  o_BxTxHqxDh = project_values(u_BxTxHqxDr, w_v_DrxHkvxDh).astype(q_BxTxHqxDh.dtype)
  if return_lse:
    return o_BxTxHqxDh, lse_BxTxHq
  return o_BxTxHqxDh


READOUT_FORMS = {
    "literal": literal_readout,
    "streaming": streaming_readout,
    "absorbed": absorbed_readout,
}
