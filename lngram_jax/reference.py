"""The slow, obviously-correct references of the Lngram v2 equations (DESIGN.md §2).

Each function transcribes one equation with Python loops over windows, slots, codes,
bits, taps or heads, and calls nothing it checks. Which windows exist is bookkeeping
in numpy (so segment ids and masks must be concrete arrays: close over them when
jitting); values that must be differentiable are jnp. Nothing is rounded below the
input dtype: with jax x64 enabled a float64 input is computed in float64 end to end
(statistics are at least float32 for narrower inputs). The tests of the package
import their references from here.

  codes                    a = Σ_j [z_j > 0]·2^j                        §2.1
  window_ok, windows       whole, inside one segment, unpadded          §2.3
  rows                     r·C^n + Σ_i a[t-n+1+i]·C^i                   §2.2
  lookup                   E^(n)[row] (0 at invalid windows), with the
                           surrogate as its router gradient              §2.3, §2.7
  exact_logit_grad,        the router-logit gradients of the exact,
  onebit_logit_grad,       one-bit and straight-through surrogates, in
  ste_logit_grad           closed form                                  §2.7
  sink_gqa_reference       α_r = exp(s_r)/(exp(b0) + Σ_r' exp(s_r'))    §2.4
                           (grouped-query, over K and V)
  readout                  the same over x̂, through W_K and W_V         §2.4
  softmax_readout          the same without a sink                      §2.12
  rms_norm, short_conv     the norms and y[t] = Σ_i w[i]·x[t-(W-1-i)·d]  §2.4, §2.6
  forward                  the whole layer                              §2

Shape legend: DESIGN.md §1 (B, T, R, M, C, N, Dm, Dr, Hq, Hkv, G, Dh, D, W, E; n one
order, also the slots of its window); `win` the real windows of one order.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _stat_dtype(dtype):
  """At least float32, never below the input dtype."""
  return jnp.promote_types(dtype, jnp.float32)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


# --- §2.1-§2.3: codes, windows, rows --------------------------------------------------


def codes(logits_BxTxRxM):
  """a[b, t, r] = Σ_j [z_j > 0]·2^j: bit j weighs 2^j, and a zero logit is bit 0 (§2.1).

  numpy in, numpy out; jnp (also traced) in, jnp out.
  """
  code_BxTxR = 0
  for j in range(logits_BxTxRxM.shape[-1]):
    code_BxTxR = code_BxTxR + (logits_BxTxRxM[..., j] > 0).astype(np.int32) * 2**j
  return code_BxTxR


def code_bits(code: int, bits: int) -> list[int]:
  """β(c): bit j of code c, j = 0..M-1."""
  return [(code >> j) & 1 for j in range(bits)]


def window_ok(b: int, t: int, order: int, segment_ids=None, valid=None) -> bool:
  """Whether the order-n window [t-n+1, t] of row b is a real n-gram (§2.3).

  It is not when it starts before the sequence, spans two segment ids, or holds a
  padding position (valid False).
  """
  start = t - order + 1
  if start < 0:
    return False
  span = range(start, t + 1)
  if segment_ids is not None and len({int(segment_ids[b, s]) for s in span}) != 1:
    return False
  if valid is not None and not all(bool(valid[b, s]) for s in span):
    return False
  return True


def window_valid(batch_time: tuple[int, int], *, order: int, segment_ids=None,
                 valid=None) -> np.ndarray:
  """ok_BxT: `window_ok` at every (b, t)."""
  B, T = batch_time
  segment_ids = None if segment_ids is None else np.asarray(segment_ids)
  valid = None if valid is None else np.asarray(valid)
  ok_BxT = np.zeros((B, T), bool)
  for b in range(B):
    for t in range(T):
      ok_BxT[b, t] = window_ok(b, t, order, segment_ids, valid)
  return ok_BxT


def windows(batch_time: tuple[int, int], *, order: int, segment_ids=None,
            valid=None) -> list[tuple[int, int]]:
  """[(b, t)] of every real order-n window, named by its row and last position."""
  ok_BxT = window_valid(batch_time, order=order, segment_ids=segment_ids, valid=valid)
  return [(int(b), int(t)) for b, t in zip(*np.nonzero(ok_BxT), strict=True)]


def window_digits(codes_BxTxR, b: int, t: int, r: int, order: int) -> list[int]:
  """The window's symbols, oldest first: digit i is the code at t-n+1+i."""
  return [int(codes_BxTxR[b, t - order + 1 + i, r]) for i in range(order)]


def row_of(route: int, digits, bits: int) -> int:
  """r·C^n + Σ_i digit_i·C^i: the oldest symbol is the least-significant digit (§2.2)."""
  C = 2**bits
  return route * C ** len(digits) + sum(int(d) * C**i for i, d in enumerate(digits))


def rows(codes_BxTxR, *, order: int, bits: int, segment_ids=None, valid=None):
  """(rows_BxTxR int64 with -1 at invalid windows, ok_BxT) from concrete codes."""
  codes_BxTxR = np.asarray(codes_BxTxR)
  B, T, R = codes_BxTxR.shape
  rows_BxTxR = np.full((B, T, R), -1, np.int64)
  ok_BxT = window_valid((B, T), order=order, segment_ids=segment_ids, valid=valid)
  for b, t in zip(*np.nonzero(ok_BxT), strict=True):
    for r in range(R):
      rows_BxTxR[b, t, r] = row_of(r, window_digits(codes_BxTxR, b, t, r, order), bits)
  return rows_BxTxR, ok_BxT


# --- §2.3, §2.7: the lookup and its router gradients -------------------------------


def lookup(table_ExDm, logits_BxTxRxM, *, order: int, bits: int, segment_ids=None,
           valid=None, surrogate: str = "onebit", tau: float = 1.0, scale: float = 1.0):
  """mem[b, t, r] = E^(n)[row] at real windows, 0 elsewhere, in the table's dtype.

  Differentiable (jnp): the value is the hard row; the router gradient is the
  surrogate of DESIGN.md §2.7, written as hard + λ(S - stop_gradient(S)) where S(z)
  adds, over the slots u of the window, constant table rows weighted by functions of
  p = σ(τz) whose derivative is that surrogate:

    exact   S = Σ_u Σ_c P(c|z_u)·E[row, slot u := c],
            P(c|z) = Π_j (β_j(c) ? p_j : 1 - p_j), so ∂P/∂z_j = τP(β_j(c) - p_j);
    onebit  S = Σ_u Σ_j p_j·(E[row, bit j of slot u := 1] - E[row, bit j := 0]);
    ste     S = Σ_u Σ_j p_j·(2b̂_j - 1)·E[row];
    none    S = 0.

  The table gradient flows through the hard rows only (counterfactual rows are
  constants). segment_ids, valid: concrete [B, T] arrays or None.
  """
  B, T, R, M = logits_BxTxRxM.shape
  if M != bits:
    raise ValueError(f"reference.lookup: logits last dim M={M} must equal bits={bits}.")
  C = 2**bits
  acc = _stat_dtype(table_ExDm.dtype)
  mem_BxTxRxDm = jnp.zeros((B, T, R, table_ExDm.shape[1]), table_ExDm.dtype)
  real = windows((B, T), order=order, segment_ids=segment_ids, valid=valid)
  if not real:
    return mem_BxTxRxDm
  b_win = np.array([b for b, _ in real])
  t_win = np.array([t for _, t in real])
  pos_winxn = t_win[:, None] - order + 1 + np.arange(order)     # slot u holds t-n+1+u
  code_BxTxR = codes(jax.lax.stop_gradient(logits_BxTxRxM))
  digit_winxnxR = code_BxTxR[b_win[:, None], pos_winxn]
  stride_n = [C**u for u in range(order)]
  row_winxR = jnp.arange(R) * C**order
  for u in range(order):
    row_winxR = row_winxR + digit_winxnxR[:, u] * stride_n[u]
  hard_winxRxDm = table_ExDm[row_winxR].astype(acc)
  const_ExDm = jax.lax.stop_gradient(table_ExDm).astype(acc)
  p_winxnxRxM = jax.nn.sigmoid(tau * logits_BxTxRxM[b_win[:, None], pos_winxn].astype(acc))
  s_winxRxDm = jnp.zeros_like(hard_winxRxDm)
  for u in range(order):
    digit_winxR, p_winxRxM = digit_winxnxR[:, u], p_winxnxRxM[:, u]
    if surrogate == "exact":
      for c in range(C):
        prob_winxR = 1.0
        for j, beta in enumerate(code_bits(c, M)):
          prob_winxR = prob_winxR * (p_winxRxM[..., j] if beta else 1.0 - p_winxRxM[..., j])
        row_c_winxR = row_winxR + (c - digit_winxR) * stride_n[u]
        s_winxRxDm = s_winxRxDm + prob_winxR[..., None] * const_ExDm[row_c_winxR]
    elif surrogate in ("onebit", "ste"):
      for j in range(M):
        bit_winxR = (digit_winxR >> j) & 1
        if surrogate == "onebit":
          row_1 = row_winxR + (1 - bit_winxR) * 2**j * stride_n[u]
          row_0 = row_winxR - bit_winxR * 2**j * stride_n[u]
          delta_winxRxDm = const_ExDm[row_1] - const_ExDm[row_0]
        else:
          delta_winxRxDm = ((2 * bit_winxR - 1).astype(acc)[..., None]
                           * jax.lax.stop_gradient(hard_winxRxDm))
        s_winxRxDm = s_winxRxDm + p_winxRxM[..., j, None] * delta_winxRxDm
    elif surrogate != "none":
      raise ValueError(f"reference.lookup: unknown surrogate={surrogate!r}.")
  mem_winxRxDm = hard_winxRxDm + scale * (s_winxRxDm - jax.lax.stop_gradient(s_winxRxDm))
  return mem_BxTxRxDm.at[b_win, t_win].set(mem_winxRxDm.astype(table_ExDm.dtype))


def _grad_inputs(table_ExDm, logits_BxTxRxM, g_BxTxRxDm, order, segment_ids, valid):
  table, z, g = (np.asarray(x, np.float64) for x in (table_ExDm, logits_BxTxRxM, g_BxTxRxDm))
  B, T = z.shape[:2]
  real = windows((B, T), order=order, segment_ids=segment_ids, valid=valid)
  return table, z, g, codes(z), real


def exact_logit_grad(table_ExDm, logits_BxTxRxM, g_BxTxRxDm, *, order: int, bits: int,
                     segment_ids=None, valid=None, tau: float = 1.0, scale: float = 1.0):
  """∂z_j += λτ Σ_c P(c|z)(β_j(c) - p_j)⟨g, E_c⟩ per real window and slot (§2.7, exact).

  E_c is the row the window would read with that slot's code set to c, the other
  slots at their hard symbols; the sum goes to the slot's position. float64 numpy.
  """
  table, z, g, code_BxTxR, real = _grad_inputs(table_ExDm, logits_BxTxRxM, g_BxTxRxDm,
                                               order, segment_ids, valid)
  R, M = z.shape[2:]
  d_z = np.zeros_like(z)
  for b, t in real:
    for r in range(R):
      digits = window_digits(code_BxTxR, b, t, r, order)
      for u in range(order):
        pos = t - order + 1 + u
        p_M = _sigmoid(tau * z[b, pos, r])
        for c in range(2**bits):
          beta_M = np.array(code_bits(c, M), np.float64)
          prob = np.prod(np.where(beta_M == 1, p_M, 1.0 - p_M))
          with_c = list(digits)
          with_c[u] = c
          score = g[b, t, r] @ table[row_of(r, with_c, bits)]
          d_z[b, pos, r] += scale * tau * prob * (beta_M - p_M) * score
  return d_z


def onebit_logit_grad(table_ExDm, logits_BxTxRxM, g_BxTxRxDm, *, order: int, bits: int,
                      segment_ids=None, valid=None, tau: float = 1.0, scale: float = 1.0):
  """∂z_j += λτ p_j(1-p_j)⟨g, E_j^(1) - E_j^(0)⟩ per real window and slot (§2.7, onebit).

  E_j^(1), E_j^(0): the rows with bit j of that slot set to 1 and to 0. float64 numpy.
  """
  table, z, g, code_BxTxR, real = _grad_inputs(table_ExDm, logits_BxTxRxM, g_BxTxRxDm,
                                               order, segment_ids, valid)
  R, M = z.shape[2:]
  d_z = np.zeros_like(z)
  for b, t in real:
    for r in range(R):
      digits = window_digits(code_BxTxR, b, t, r, order)
      for u in range(order):
        pos = t - order + 1 + u
        for j in range(M):
          p = _sigmoid(tau * z[b, pos, r, j])
          with_1, with_0 = list(digits), list(digits)
          with_1[u] = digits[u] | (1 << j)
          with_0[u] = digits[u] & ~(1 << j)
          score = g[b, t, r] @ (table[row_of(r, with_1, bits)] - table[row_of(r, with_0, bits)])
          d_z[b, pos, r, j] += scale * tau * p * (1 - p) * score
  return d_z


def ste_logit_grad(table_ExDm, logits_BxTxRxM, g_BxTxRxDm, *, order: int, bits: int,
                   segment_ids=None, valid=None, tau: float = 1.0, scale: float = 1.0):
  """∂z_j += λτ p_j(1-p_j)(2b̂_j - 1)⟨g, E_hard⟩ per real window and slot (§2.7, ste)."""
  table, z, g, code_BxTxR, real = _grad_inputs(table_ExDm, logits_BxTxRxM, g_BxTxRxDm,
                                               order, segment_ids, valid)
  R, M = z.shape[2:]
  d_z = np.zeros_like(z)
  for b, t in real:
    for r in range(R):
      digits = window_digits(code_BxTxR, b, t, r, order)
      hard = g[b, t, r] @ table[row_of(r, digits, bits)]
      for u in range(order):
        pos = t - order + 1 + u
        for j in range(M):
          p = _sigmoid(tau * z[b, pos, r, j])
          sign = 2 * ((digits[u] >> j) & 1) - 1
          d_z[b, pos, r, j] += scale * tau * p * (1 - p) * sign * hard
  return d_z


def surrogate_logit_grad(table_ExDm, logits_BxTxRxM, g_BxTxRxDm, *, surrogate: str, **kw):
  """The closed-form router-logit gradient of one order for `surrogate` (§2.7)."""
  if surrogate == "none":
    return np.zeros(np.shape(logits_BxTxRxM), np.float64)
  grads = {"exact": exact_logit_grad, "onebit": onebit_logit_grad, "ste": ste_logit_grad}
  return grads[surrogate](table_ExDm, logits_BxTxRxM, g_BxTxRxDm, **kw)


# --- §2.4, §2.12: the readout -----------------------------------------------------------


def sink_gqa_reference(q_BxTxHqxDh, k_BxTxRxHkvxDh, v_BxTxRxHkvxDh, *, sink_logit):
  """(o_BxTxHqxDh, lse_BxTxHq) of the sink readout, one query head at a time (§2.4).

  Head a reads KV head a // G: s_r = Q_a·K_r/√Dh, α_r = exp(s_r)/(exp(b0) + Σ exp(s_r')),
  o_a = Σ_r α_r V_r, lse = log(exp(b0) + Σ_r exp(s_r)). Exponents are shifted by
  m = max(b0, max_r s_r), which leaves α unchanged and keeps exp finite; b0 = -inf
  is the plain softmax.
  """
  acc = _stat_dtype(q_BxTxHqxDh.dtype)
  q, k, v = (x.astype(acc) for x in (q_BxTxHqxDh, k_BxTxRxHkvxDh, v_BxTxRxHkvxDh))
  Hq, Dh = q.shape[2:]
  G = Hq // k.shape[3]
  o_heads, lse_heads = [], []
  for a in range(Hq):
    s_BxTxR = jnp.einsum("btd,btrd->btr", q[:, :, a], k[:, :, :, a // G]) / math.sqrt(Dh)
    m_BxT = jnp.maximum(jnp.max(s_BxTxR, axis=-1), sink_logit)
    e_BxTxR = jnp.exp(s_BxTxR - m_BxT[..., None])
    denom_BxT = jnp.exp(sink_logit - m_BxT) + jnp.sum(e_BxTxR, axis=-1)
    alpha_BxTxR = e_BxTxR / denom_BxT[..., None]
    o_heads.append(jnp.einsum("btr,btrd->btd", alpha_BxTxR, v[:, :, :, a // G]))
    lse_heads.append(m_BxT + jnp.log(denom_BxT))
  return jnp.stack(o_heads, axis=2), jnp.stack(lse_heads, axis=2)


def project_kv(mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh):
  """K = x̂ W_K, V = x̂ W_V: [B, T, R, Hkv, Dh] each (§2.4)."""
  acc = _stat_dtype(mem_BxTxRxDr.dtype)
  mem = mem_BxTxRxDr.astype(acc)
  return (jnp.einsum("btrd,dkh->btrkh", mem, w_k_DrxHkvxDh.astype(acc)),
          jnp.einsum("btrd,dkh->btrkh", mem, w_v_DrxHkvxDh.astype(acc)))


def readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh, *, sink_logit):
  """(o, lse) given x̂: the projections of §2.4, then `sink_gqa_reference`."""
  k, v = project_kv(mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)
  return sink_gqa_reference(q_BxTxHqxDh, k, v, sink_logit=sink_logit)


def softmax_readout(q_BxTxHqxDh, mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh):
  """(o, lse) of the readout without a sink (§2.12): `jax.nn.softmax` over the routes.

  Written with the library softmax, not `sink_gqa_reference`, so that sink=False is checked
  against what it means rather than against b0 = -inf in the same code.
  """
  k, v = project_kv(mem_BxTxRxDr, w_k_DrxHkvxDh, w_v_DrxHkvxDh)
  q = q_BxTxHqxDh.astype(k.dtype)
  Hq, Dh = q.shape[2:]
  G = Hq // k.shape[3]
  k_BxTxRxHqxDh, v_BxTxRxHqxDh = jnp.repeat(k, G, axis=3), jnp.repeat(v, G, axis=3)
  s_BxTxHqxR = jnp.einsum("bthd,btrhd->bthr", q, k_BxTxRxHqxDh) / math.sqrt(Dh)
  o_BxTxHqxDh = jnp.einsum("bthr,btrhd->bthd", jax.nn.softmax(s_BxTxHqxR, axis=-1),
                           v_BxTxRxHqxDh)
  return o_BxTxHqxDh, jax.nn.logsumexp(s_BxTxHqxR, axis=-1)


# --- norms, conv, the whole forward -------------------------------------------------------


def rms_norm(x_xD, scale_D=None, *, eps: float):
  """x / sqrt(mean(x²) + eps) · scale over the last axis (scale None: affine-free)."""
  acc = _stat_dtype(x_xD.dtype)
  x = x_xD.astype(acc)
  y = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  return y if scale_D is None else y * scale_D.astype(acc)


def short_conv(x_BxTxD, kernel_WxD, *, dilation: int, segment_ids=None):
  """y[t] = Σ_i w[i]·x[t - (W-1-i)·dilation], one tap at a time (§2.6).

  Tap W-1 is the current step; a tap that reaches before the sequence or into
  another segment reads zero. segment_ids: a concrete [B, T] array or None.
  """
  B, T, D = x_BxTxD.shape
  W = kernel_WxD.shape[0]
  acc = _stat_dtype(x_BxTxD.dtype)
  segment_ids = None if segment_ids is None else np.asarray(segment_ids)
  y_BxTxD = jnp.zeros((B, T, D), acc)
  for i in range(W):
    src_T = np.arange(T) - (W - 1 - i) * dilation
    ok_BxT = np.broadcast_to(src_T >= 0, (B, T)).copy()
    if segment_ids is not None:
      ok_BxT &= segment_ids[:, np.maximum(src_T, 0)] == segment_ids
    x_src_BxTxD = x_BxTxD[:, np.maximum(src_T, 0)].astype(acc)
    y_BxTxD = y_BxTxD + jnp.where(ok_BxT[:, :, None],
                                  kernel_WxD[i].astype(acc) * x_src_BxTxD, 0.0)
  return y_BxTxD


def forward(p, config, h_BxTxD, *, segment_ids=None, valid=None, return_aux=False):
  """The layer's delta Y [B, T, D] (DESIGN.md §2), in `config.dtype`.

    z = RMSNorm(h) W_q;  x = concat_n lookup(E^(n), z);  Q = RMSNorm_q(h) W_Q
    o = sink_gqa_reference(Q, RMSNorm_m(x) W_K, RMSNorm_m(x) W_V);  ṽ = o W_O
    Y = ṽ + SiLU(conv(RMSNorm_c(ṽ))), the conv input and Y zero at padding.

  p: the layer's arrays (`LngramParams`); config: its `LngramConfig` (surrogate,
  τ, λ, b0, dilation, eps, dtype). segment_ids, valid: concrete [B, T] arrays or
  None. With `return_aux`, also {"logits", "lse", "route_mass"}.
  """
  c = config
  dtype = jnp.dtype(c.dtype)
  segment_ids = None if segment_ids is None else np.asarray(segment_ids)
  valid = None if valid is None else np.asarray(valid).astype(bool)
  h_BxTxD = h_BxTxD.astype(dtype)
  B, T, _ = h_BxTxD.shape
  weight = lambda w: w.astype(dtype)
  z_BxTxRxM = (rms_norm(h_BxTxD, eps=c.eps) @ weight(p.router_w)).reshape(
      B, T, c.routes, c.bits)
  mems = [lookup(table, z_BxTxRxM, order=n, bits=c.bits, segment_ids=segment_ids,
                 valid=valid, surrogate=c.surrogate, tau=c.surrogate_tau,
                 scale=c.surrogate_scale).astype(dtype)
          for n, table in zip(c.orders, p.tables, strict=True)]
  x_BxTxRxDr = jnp.concatenate(mems, axis=-1)
  q_BxTxHqxDh = (rms_norm(h_BxTxD, p.q_norm, eps=c.eps) @ weight(p.w_q)).reshape(
      B, T, c.q_heads, c.head_dim)
  w_kv = weight(p.w_kv).reshape(c.route_dim, 2, c.kv_heads, c.head_dim)
  o_BxTxHqxDh, lse_BxTxHq = readout(q_BxTxHqxDh, rms_norm(x_BxTxRxDr, p.mem_norm, eps=c.eps),
                                    w_kv[:, 0], w_kv[:, 1], sink_logit=c.sink_logit)
  v_BxTxD = o_BxTxHqxDh.reshape(B, T, -1) @ weight(p.w_o)
  conv_in_BxTxD = rms_norm(v_BxTxD, p.conv_norm, eps=c.eps)
  if valid is not None:
    conv_in_BxTxD = jnp.where(valid[:, :, None], conv_in_BxTxD, 0.0)
  conv_BxTxD = short_conv(conv_in_BxTxD, weight(p.conv_kernel), dilation=c.dilation,
                          segment_ids=segment_ids)
  y_BxTxD = v_BxTxD + jax.nn.silu(conv_BxTxD)
  if valid is not None:
    y_BxTxD = jnp.where(valid[:, :, None], y_BxTxD, 0.0)
  y_BxTxD = y_BxTxD.astype(dtype)
  if not return_aux:
    return y_BxTxD
  return y_BxTxD, {"logits": z_BxTxRxM, "lse": lse_BxTxHq,
                   "route_mass": 1.0 - jnp.exp(c.sink_logit - lse_BxTxHq)}
