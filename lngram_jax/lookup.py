"""Exact n-gram lookup with counterfactual surrogate gradients (paper §2.5, App. A).

The forward is always the hard lookup. A `jax.custom_vjp` keeps the ordinary
gradient of the table (a scatter-add onto the rows that were read) and replaces
only the gradient to the router logits z with one of:

  exact   ∂z_j += λτ Σ_c P(c|z)(β_j(c) - p_j)⟨g, E_c⟩ over the C codes c of one
          slot, the other slots of the window held at their hard symbols;
  onebit  ∂z_j += λτ p_j(1-p_j)⟨g, E_j^(1) - E_j^(0)⟩, one flipped row per bit;
  ste     the direct straight-through baseline of App. A.5 (see `_ste_grad`);
  none    no gradient to the router.

with p = σ(τz), g the cotangent of the retrieved vector, E_c the table row the
window would read if the slot held code c. Every window (end t, slot u, order n)
that contains a position adds into that position's logits. Counterfactual rows
are constants: they never receive table gradient. Invalid windows contribute
nothing anywhere.

Two implementations of the exact and one-bit router gradients compute the same
maths (DESIGN.md §2.7): "gather" (below: one gather of B·T·R rows per
candidate) and "blocks" (`surrogate_blocks`: one gather of all of a window's
candidate rows, windows in chunks). The brute-force loops they are both tested
against are `lngram_jax.reference`. A third, "triton" (`surrogate_pallas`,
one-bit only, opt-in), computes the one-bit scores and the table gradient in one
Pallas kernel; for the other surrogates it runs what "auto" runs. The choice is
the argument `surrogate_impl=` (the layer's `surrogate_impl` attribute passes it
down), default "auto": whichever `experiments.tools.bench.layer` measured faster
for that surrogate. It is an argument, not a global switch, so a jitted function
runs the implementation it was given.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lngram_jax import checks
from lngram_jax.addressing import codes_from_logits, ngram_rows, shift_left, shift_right
from lngram_jax.config import SURROGATES
from lngram_jax.surrogate_blocks import surrogate_logit_grad_blocks, table_cotangent
from lngram_jax.surrogate_pallas import onebit_cotangents

SURROGATE_IMPLS = ("auto", "gather", "blocks", "triton")
# What "auto" runs: what experiments.tools.bench.layer measured faster (BENCHMARKS.md,
# "Surrogate backward in blocks"). fwd+bwd over `none`, same run, CPU: shape
# cpu_r16 onebit 1.36-1.43x blocks vs 1.84-1.89x gather; exact 1.76x vs 2.05x in
# one run of three, even within noise in the other two; gpu_width onebit 1.02x
# vs 1.17x, exact 1.28x vs 1.62x.
_AUTO_IMPL = {"onebit": "blocks", "exact": "blocks"}


def resolve_surrogate_impl(impl: str, surrogate: str) -> str:
  """The implementation ("gather", "blocks" or "triton") that `impl` runs for `surrogate`.

  "triton" has a one-bit kernel only: for the other surrogates it runs "auto"'s choice.
  """
  check_surrogate_impl(impl)
  if impl == "triton" and surrogate != "onebit":
    impl = "auto"
  return _AUTO_IMPL.get(surrogate, "gather") if impl == "auto" else impl


def check_surrogate_impl(impl) -> None:
  """Refuses anything but one of `SURROGATE_IMPLS`."""
  if impl not in SURROGATE_IMPLS:
    raise ValueError(f"surrogate_impl={impl!r} is not one of {SURROGATE_IMPLS}.")


def ngram_lookup(
    table_ExDm: jnp.ndarray,
    logits_BxTxRxM: jnp.ndarray,
    *,
    order: int,
    bits: int,
    segment_ids=None,
    valid=None,
    surrogate: str = "onebit",
    tau: float = 1.0,
    scale: float = 1.0,
    surrogate_impl: str = "auto",
) -> jnp.ndarray:
  """Hard n-gram lookup mem[b, t, r] = E[row(b, t, r)], zero at invalid windows.

  Args:
    table_ExDm: the table of this order, E = R·C^n rows.
    logits_BxTxRxM: router logits z; codes are taken as z > 0.
    order, bits: n and M.
    segment_ids: optional int [B, T] packed-sequence ids.
    valid: optional bool [B, T] token mask (padding reads nothing).
    surrogate: "exact", "onebit", "ste" or "none" (router gradient only).
    tau, scale: τ and λ.
    surrogate_impl: "auto", "gather", "blocks" (same values) or "triton" (the
      one-bit backward as one Pallas kernel, GPU or CPU interpret mode).

  Returns:
    mem_BxTxRxDm in the table's dtype.
  """
  checks.check_rank("table", table_ExDm, 2, "[E, Dm]")
  checks.check_float("table", table_ExDm)
  checks.check_rank("logits", logits_BxTxRxM, 4, "[B, T, R, M]")
  checks.check_float("logits", logits_BxTxRxM)
  if surrogate not in SURROGATES:
    raise ValueError(f"ngram_lookup: surrogate={surrogate!r} is not one of {SURROGATES}.")
  R, M = logits_BxTxRxM.shape[2:]
  if M != bits:
    raise ValueError(f"ngram_lookup: logits last dim M={M} must equal bits={bits}.")
  rows_expected = R * 2 ** (bits * order)
  if table_ExDm.shape[0] != rows_expected:
    raise ValueError(
        f"ngram_lookup: table has {table_ExDm.shape[0]} rows; order={order}, "
        f"R={R}, bits={bits} need R*C^n = {rows_expected}.")
  impl = surrogate_impl
  check_surrogate_impl(impl)
  codes_BxTxR = codes_from_logits(logits_BxTxRxM)
  rows_BxTxR, valid_BxT = ngram_rows(
      codes_BxTxR, order=order, bits=bits, segment_ids=segment_ids, valid=valid)
  return _lookup(order, bits, surrogate, float(tau), float(scale), impl,
                 table_ExDm, logits_BxTxRxM, codes_BxTxR, rows_BxTxR, valid_BxT)


def gather_rows(table_ExDm, rows_BxTxR, valid_BxT):
  """E[rows] with invalid windows zeroed (selected, never multiplied: DESIGN.md §2.6)."""
  mem_BxTxRxDm = jnp.take(table_ExDm, rows_BxTxR, axis=0, mode="clip")
  return jnp.where(valid_BxT[:, :, None, None], mem_BxTxRxDm, 0).astype(table_ExDm.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _lookup(order, bits, surrogate, tau, scale, impl, table, logits, codes, rows, valid):
  del order, bits, surrogate, tau, scale, impl, logits, codes
  return gather_rows(table, rows, valid)


def _lookup_fwd(order, bits, surrogate, tau, scale, impl, table, logits, codes, rows, valid):
  del order, bits, tau, scale
  mem = gather_rows(table, rows, valid)
  # The hard rows' scores ⟨g, E[row]⟩ of the backward read `mem` (which the readout
  # keeps alive anyway) instead of the table, where that path takes them.
  keep = mem if _hard_from_forward(surrogate, impl) else None
  return mem, (table, logits, codes, rows, valid, keep)


def _hard_from_forward(surrogate: str, impl: str) -> bool:
  """ste, and one-bit in blocks: the backward's hard-row scores come from the forward's
  rows (the "gather" one-bit form reads them from the table itself)."""
  return surrogate == "ste" or (surrogate == "onebit"
                                and resolve_surrogate_impl(impl, surrogate) == "blocks")


def _lookup_bwd(order, bits, surrogate, tau, scale, impl, residuals, g_BxTxRxDm):
  table_ExDm, logits_BxTxRxM, codes_BxTxR, rows_BxTxR, valid_BxT, mem = residuals
  if resolve_surrogate_impl(impl, surrogate) == "triton":
    # Both cotangents in one kernel, which masks invalid windows and widens g itself:
    # no float32 copy of g is written for it.
    d_table, d_logits = onebit_cotangents(
        table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, order=order, bits=bits, tau=tau,
        scale=scale, valid_BxT=valid_BxT)
    return d_table, d_logits.astype(logits_BxTxRxM.dtype), None, None, None
  acc = jnp.promote_types(table_ExDm.dtype, jnp.float32)
  g_BxTxRxDm = g_BxTxRxDm.astype(acc) * valid_BxT[:, :, None, None].astype(acc)
  d_table = table_cotangent(table_ExDm, rows_BxTxR, g_BxTxRxDm)
  hard = None
  if mem is not None:   # mem = E[rows] (zero where g is zero): ⟨g, E[rows]⟩ exactly
    hard = jnp.einsum("btrd,btrd->btr", mem.astype(acc), g_BxTxRxDm)
  d_logits = surrogate_logit_grad(
      table_ExDm, logits_BxTxRxM, codes_BxTxR, rows_BxTxR, g_BxTxRxDm,
      order=order, bits=bits, surrogate=surrogate, tau=tau, scale=scale, impl=impl,
      hard_BxTxR=hard)
  return d_table, d_logits.astype(logits_BxTxRxM.dtype), None, None, None


_lookup.defvjp(_lookup_fwd, _lookup_bwd)


def _row_scores(table_ExDm, rows_BxTxR, g_BxTxRxDm):
  """⟨g, E[rows]⟩ per (b, t, r), accumulated in g's dtype (>= f32)."""
  rows_BxTxRxDm = jnp.take(table_ExDm, rows_BxTxR, axis=0, mode="clip")
  return jnp.einsum("btrd,btrd->btr", rows_BxTxRxDm.astype(g_BxTxRxDm.dtype), g_BxTxRxDm)


def surrogate_logit_grad(table_ExDm, logits_BxTxRxM, codes_BxTxR, rows_BxTxR,
                         g_BxTxRxDm, *, order, bits, surrogate, tau, scale, impl="auto",
                         hard_BxTxR=None):
  """The router-logit cotangent of one order, summed over windows and slots.

  `g_BxTxRxDm` must already be zero at invalid windows. `impl` as
  `ngram_lookup`'s `surrogate_impl`; "gather" is the code below. `hard_BxTxR`:
  ⟨g, E[rows]⟩ if the caller has it (ste and one-bit in blocks use it; the
  one-bit "gather" form always reads the hard rows itself).
  """
  acc = g_BxTxRxDm.dtype
  z_BxTxRxM = logits_BxTxRxM.astype(acc)
  if surrogate == "none":
    return jnp.zeros_like(z_BxTxRxM)
  if resolve_surrogate_impl(impl, surrogate) == "triton":  # the kernel's scores, no table add
    return onebit_cotangents(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, order=order,
                             bits=bits, tau=tau, scale=scale, with_table_grad=False)[1]
  if resolve_surrogate_impl(impl, surrogate) == "blocks" and surrogate in ("exact", "onebit"):
    return surrogate_logit_grad_blocks(
        table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, order=order, bits=bits,
        surrogate=surrogate, tau=tau, scale=scale,
        hard_scores_BxTxR=hard_BxTxR if surrogate == "onebit" else None)
  C = 2**bits
  if surrogate == "onebit" or (surrogate == "ste" and hard_BxTxR is None):
    hard_BxTxR = _row_scores(table_ExDm, rows_BxTxR, g_BxTxRxDm)
  d_z = jnp.zeros_like(z_BxTxRxM)
  for slot in range(order):
    back = order - 1 - slot  # the slot's symbol sits `back` steps before t
    stride = C**slot
    digit_BxTxR = shift_right(codes_BxTxR, back)
    z_at_BxTxRxM = shift_right(z_BxTxRxM, back)
    if surrogate == "exact":
      base_BxTxR = rows_BxTxR - digit_BxTxR * stride
      contrib = _exact_grad(table_ExDm, base_BxTxR, stride, z_at_BxTxRxM, g_BxTxRxDm, tau)
    elif surrogate == "onebit":
      contrib = _onebit_grad(table_ExDm, rows_BxTxR, digit_BxTxR, stride,
                             z_at_BxTxRxM, g_BxTxRxDm, hard_BxTxR, tau)
    else:
      contrib = _ste_grad(digit_BxTxR, z_at_BxTxRxM, hard_BxTxR, tau)
    # The window ending at t wrote its slot's gradient for position t - back.
    d_z += shift_left(contrib, back)
  return scale * d_z


def _bits_of(code_BxTxR, bits: int):
  """β(c): [..., M] 0/1 in the code's bit order (bit j weighs 2^j)."""
  return (code_BxTxR[..., None] >> jnp.arange(bits, dtype=jnp.int32)) & 1


def _exact_grad(table_ExDm, base_BxTxR, stride, z_BxTxRxM, g_BxTxRxDm, tau):
  """λ-free exact surrogate for one slot: τ Σ_c P(c|z)(β(c) - p)⟨g, E_c⟩.

  Scans over the C codes so that only O(B·T·R·M) is alive at once.
  """
  M = z_BxTxRxM.shape[-1]
  C = 2**M
  log_p = jax.nn.log_sigmoid(tau * z_BxTxRxM)
  log_q = jax.nn.log_sigmoid(-tau * z_BxTxRxM)
  p_BxTxRxM = jax.nn.sigmoid(tau * z_BxTxRxM)

  def body(carry, code):
    weighted_BxTxRxM, total_BxTxR = carry
    beta_M = ((code >> jnp.arange(M, dtype=jnp.int32)) & 1).astype(z_BxTxRxM.dtype)
    prob_BxTxR = jnp.exp(jnp.sum(beta_M * log_p + (1 - beta_M) * log_q, axis=-1))
    score_BxTxR = _row_scores(table_ExDm, base_BxTxR + code * stride, g_BxTxRxDm)
    ps_BxTxR = prob_BxTxR * score_BxTxR
    return (weighted_BxTxRxM + ps_BxTxR[..., None] * beta_M, total_BxTxR + ps_BxTxR), None

  # zeros_like keeps the inputs' shard_map varying-axes type, so scan carries match.
  init = (jnp.zeros_like(z_BxTxRxM), jnp.zeros_like(z_BxTxRxM[..., 0]))
  (weighted, total), _ = jax.lax.scan(body, init, jnp.arange(C, dtype=jnp.int32))
  # Σ_c P_c(β_c - p)s_c = Σ_c P_c β_c s_c - p Σ_c P_c s_c
  return tau * (weighted - p_BxTxRxM * total[..., None])


def _onebit_grad(table_ExDm, rows_BxTxR, digit_BxTxR, stride, z_BxTxRxM,
                 g_BxTxRxDm, hard_BxTxR, tau):
  """λ-free one-bit surrogate for one slot: τ p(1-p)⟨g, E^(1) - E^(0)⟩ per bit.

  s_j = (1 - 2b_j)⟨g, E_flip - E_hard⟩ with E_flip the row whose bit j of this
  slot is flipped (App. A.3): one extra row per bit.
  """
  M = z_BxTxRxM.shape[-1]
  p_BxTxRxM = jax.nn.sigmoid(tau * z_BxTxRxM)
  hard_bits_BxTxRxM = _bits_of(digit_BxTxR, M)
  scores = []
  for j in range(M):
    sign_BxTxR = 1 - 2 * hard_bits_BxTxRxM[..., j]  # +1 if the hard bit is 0
    flipped_BxTxR = rows_BxTxR + sign_BxTxR * (2**j * stride)
    flip_BxTxR = _row_scores(table_ExDm, flipped_BxTxR, g_BxTxRxDm)
    scores.append(sign_BxTxR.astype(flip_BxTxR.dtype) * (flip_BxTxR - hard_BxTxR))
  s_BxTxRxM = jnp.stack(scores, axis=-1)
  return tau * p_BxTxRxM * (1 - p_BxTxRxM) * s_BxTxRxM


def _ste_grad(digit_BxTxR, z_BxTxRxM, hard_BxTxR, tau):
  """λ-free direct STE (App. A.5 baseline), defined precisely as follows.

  The hard retrieval is treated as switched on by its own bits,
  E(b) = E_hard · Π_j [b_j == b̂_j], and each bit passes straight through the
  threshold with the sigmoid slope ∂b_j/∂z_j = τ p_j(1-p_j). At b = b̂:

      ∂z_j = τ p_j(1-p_j)(2b̂_j - 1)⟨g, E_hard⟩.

  It is the one-bit surrogate with every counterfactual row replaced by zero:
  the gradient sees the threshold but never what a different address holds.
  """
  M = z_BxTxRxM.shape[-1]
  p_BxTxRxM = jax.nn.sigmoid(tau * z_BxTxRxM)
  sign_BxTxRxM = (2 * _bits_of(digit_BxTxR, M) - 1).astype(z_BxTxRxM.dtype)
  return tau * p_BxTxRxM * (1 - p_BxTxRxM) * sign_BxTxRxM * hard_BxTxR[..., None]
