"""Surrogate router gradients that read each window's candidate rows as one block.

The same maths as `lookup.surrogate_logit_grad` (its reference twin, DESIGN.md
§2.7), arranged for memory access. The C = 2^M candidates of slot u of an
order-n window differ only in that slot's digit, which weighs C^u (§2.2): they
are the rows base_u + c·C^u, contiguous for the oldest slot. Instead of one
gather of B·T·R rows per candidate (C per slot for exact, M + 1 for one-bit),
each window reads all the rows it needs, over all its slots, in one gather:

  exact    n·C rows (every code of every slot),
  onebit   1 + n·M rows (the hard row, then each slot's M one-bit flips),

and contracts them with its cotangent g at once (`block_scores`). Windows go in
chunks (`lax.map`) sized so the gathered rows stay in cache until the dot reads
them: on CPU the cost is the memory traffic of the gathered rows, and a
[B, T, R, K, Dm] block written and read back is what made the first, unchunked
version of this module slower than the reference. The surrogate maths then runs
on all windows' scores [W, K] together. The slot digits come from the row
itself, so an invalid window (its route's first row, g = 0) reads inside the
table and adds exactly zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lngram_jax.addressing import shift_left, shift_right

# Bytes of gathered candidate rows alive at once. On CPU the rows of a chunk stay
# in cache between the gather and the dot: 3-4x faster than gathering all
# B·T·R windows first (shape cpu_r16 of the layer bench; 1-4 MiB measured alike). Elsewhere
# chunks only bound memory (the exact surrogate's rows at the gpu shape would
# be ~13 GB at once).
_CHUNK_BYTES = {"cpu": 2 << 20}
_CHUNK_BYTES_DEFAULT = 256 << 20


def chunk_windows(windows: int, rows_per_window: int, row_bytes: int,
                  budget: int | None = None) -> int:
  """Windows per chunk: a power of two whose candidate rows fit `budget` bytes."""
  if budget is None:
    budget = _CHUNK_BYTES.get(jax.default_backend(), _CHUNK_BYTES_DEFAULT)
  n = max(1, budget // max(1, rows_per_window * row_bytes))
  n = 1 << (n.bit_length() - 1)
  return min(n, 1 << max(0, (windows - 1).bit_length()))


def _code_bits(bits: int, dtype):
  """β: [C, M] with β[c, j] = bit j of c."""
  codes_C = jnp.arange(2**bits, dtype=jnp.int32)
  return ((codes_C[:, None] >> jnp.arange(bits, dtype=jnp.int32)) & 1).astype(dtype)


def _slot_digits(rows_N, U: int, bits: int):
  """Slot u's digit of each row, and its weight C^u: [N, U], [U]."""
  C = 2**bits
  stride_U = C ** jnp.arange(U, dtype=jnp.int32)
  return (rows_N[:, None] // stride_U) % C, stride_U


def _exact_rows(rows_N, U: int, bits: int):
  """The C candidates of every slot: [N, U·C] rows, slot-major (base_u + c·C^u)."""
  C = 2**bits
  digit_NxU, stride_U = _slot_digits(rows_N, U, bits)
  base_NxU = rows_N[:, None] - digit_NxU * stride_U
  cand_NxUxC = base_NxU[..., None] + jnp.arange(C, dtype=jnp.int32) * stride_U[:, None]
  return cand_NxUxC.reshape(-1, U * C)


def _onebit_rows(rows_N, U: int, bits: int, *, with_hard: bool = True):
  """The hard row (unless `with_hard` is False), then the U·M rows with one bit
  flipped: [N, 1 + U·M] (or [N, U·M]).

  Flipping bit j of slot u moves the row by (1 - 2b_j)·2^j·C^u.
  """
  digit_NxU, stride_U = _slot_digits(rows_N, U, bits)
  sign_NxUxM = 1 - 2 * _hard_bits(digit_NxU, bits)  # +1 if the hard bit is 0
  step_UxM = stride_U[:, None] * (2 ** jnp.arange(bits, dtype=jnp.int32))
  flipped_NxUM = (rows_N[:, None, None] + sign_NxUxM * step_UxM).reshape(-1, U * bits)
  if not with_hard:
    return flipped_NxUM
  return jnp.concatenate([rows_N[:, None], flipped_NxUM], axis=1)


def _hard_bits(digit_NxU, bits: int):
  return (digit_NxU[..., None] >> jnp.arange(bits, dtype=jnp.int32)) & 1


def _exact_from_scores(scores_NxUxC, z_NxUxM, tau):
  """λ-free exact surrogate of every slot: τ Σ_c P(c|z_u)(β(c) - p_u)s_c, [N, U, M]."""
  M = z_NxUxM.shape[-1]
  beta_CxM = _code_bits(M, z_NxUxM.dtype)
  p_NxUxM = jax.nn.sigmoid(tau * z_NxUxM)
  q_NxUxM = jax.nn.sigmoid(-tau * z_NxUxM)   # 1 - p without its cancellation
  # P(c|z) = Π_j (β_j(c) ? p_j : q_j) for all c at once: bit by bit, the codes seen so
  # far split into bit j = 0 (× q_j) and 1 (× p_j), so code c = Σ_j β_j(c)·2^j lands at
  # index c. Products, not exp(Σ log): 5x less work at the same values.
  prob = jnp.ones(z_NxUxM.shape[:-1] + (1,), z_NxUxM.dtype)
  for j in range(M):
    prob = jnp.stack([prob * q_NxUxM[..., j:j + 1], prob * p_NxUxM[..., j:j + 1]],
                     axis=-2).reshape(*z_NxUxM.shape[:-1], -1)
  ps_NxUxC = prob * scores_NxUxC
  weighted_NxUxM = jnp.einsum("nuc,cm->num", ps_NxUxC, beta_CxM)
  total_NxU = jnp.sum(ps_NxUxC, axis=-1)
  # Σ_c P_c(β_c - p)s_c = Σ_c P_c β_c s_c - p Σ_c P_c s_c
  return tau * (weighted_NxUxM - p_NxUxM * total_NxU[..., None])


def _onebit_from_scores(scores_NxK, rows_N, z_NxUxM, *, bits, tau):
  """λ-free one-bit surrogate of every slot: τ p(1-p)·s_j, [N, U, M].

  s_j = (1 - 2b_j)(⟨g, E_flip⟩ - ⟨g, E_hard⟩) (App. A.3), from `_onebit_rows`' scores.
  """
  U, M = z_NxUxM.shape[1:]
  digit_NxU, _ = _slot_digits(rows_N, U, bits)
  sign_NxUxM = (1 - 2 * _hard_bits(digit_NxU, bits)).astype(scores_NxK.dtype)
  hard_N, flip_NxUxM = scores_NxK[:, 0], scores_NxK[:, 1:].reshape(-1, U, M)
  s_NxUxM = sign_NxUxM * (flip_NxUxM - hard_N[:, None, None])
  p_NxUxM = jax.nn.sigmoid(tau * z_NxUxM)
  return tau * p_NxUxM * (1 - p_NxUxM) * s_NxUxM


def block_scores(table_ExDm, read_WxK, g_WxDm, chunk: int):
  """⟨g_w, E[read_wk]⟩: [W, K] in g's dtype, W a multiple of `chunk`.

  Chunks of windows run one after another (`lax.map`); each reads all K rows of
  its windows in one gather and contracts them with g while they are in cache.
  """
  W, K = read_WxK.shape
  Dm = g_WxDm.shape[-1]

  def one(args):
    read_NxK, g_NxDm = args
    rows_NxKxDm = jnp.take(table_ExDm, read_NxK, axis=0, mode="clip")
    return jnp.einsum("nkd,nd->nk", rows_NxKxDm.astype(g_NxDm.dtype), g_NxDm)

  xs = (read_WxK.reshape(-1, chunk, K), g_WxDm.reshape(-1, chunk, Dm))
  return jax.lax.map(one, xs).reshape(W, K)


def slot_block_scores(table_ExDm, rows_W, g_WxDm, *, slot: int, bits: int, chunk: int):
  """⟨g_w, E[base_u + c·C^u]⟩ for the C candidates c of slot u: [W, C], W a multiple of
  `chunk`.

  The table seen as [E / C^(u+1), C, C^u, Dm] holds slot u's candidates of a row at
  [row // C^(u+1), :, row % C^u]: one gather index per window fetches all C rows (a
  contiguous block for u = 0, rows C^u apart otherwise), where `block_scores` needs C
  indices; XLA's CPU gather costs per index as much as per byte.
  """
  C = 2**bits
  E, Dm = table_ExDm.shape
  inner = C**slot
  table_4d = table_ExDm.reshape(E // (C * inner), C, inner, Dm)
  dims = jax.lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(0, 2),
                                        start_index_map=(0, 1, 2, 3))

  def one(args):
    rows_N, g_NxDm = args
    zero_N = jnp.zeros_like(rows_N)
    start_Nx4 = jnp.stack([rows_N // (C * inner), zero_N, rows_N % inner, zero_N], axis=-1)
    cand_NxCxDm = jax.lax.gather(table_4d, start_Nx4, dims, slice_sizes=(1, C, 1, Dm),
                                 mode="clip")
    return jnp.einsum("ncd,nd->nc", cand_NxCxDm.astype(g_NxDm.dtype), g_NxDm)

  xs = (rows_W.reshape(-1, chunk), g_WxDm.reshape(-1, chunk, Dm))
  return jax.lax.map(one, xs).reshape(-1, C)


def surrogate_logit_grad_blocks(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, *,
                                order: int, bits: int, surrogate: str, tau: float,
                                scale: float, chunk_bytes: int | None = None,
                                hard_scores_BxTxR=None):
  """`lookup.surrogate_logit_grad` for "exact" and "onebit", rows read in blocks.

  Every window (b, t, r) reads all its candidate rows, over all slots, in one
  gather (`block_scores`, in chunks of `chunk_windows`); the surrogate maths then
  runs on all windows' scores at once. `g_BxTxRxDm` must already be zero at
  invalid windows. `hard_scores_BxTxR`: ⟨g, E[hard row]⟩ if the caller has it
  (the lookup's backward takes it from the forward's retrieved rows), so that
  the one-bit surrogate reads only the U·M flipped rows.
  """
  if surrogate not in ("exact", "onebit"):
    raise ValueError(f"surrogate_logit_grad_blocks: surrogate={surrogate!r} has no block form.")
  acc = g_BxTxRxDm.dtype
  z_BxTxRxM = logits_BxTxRxM.astype(acc)
  B, T, R, M = z_BxTxRxM.shape
  Dm = table_ExDm.shape[1]
  U = order
  windows = B * T * R
  rows_W = rows_BxTxR.reshape(-1)
  row_bytes = Dm * jnp.dtype(acc).itemsize
  if surrogate == "exact":   # slot by slot, C rows per gather index
    n = chunk_windows(windows, 2**bits, row_bytes, chunk_bytes)
    pad = -windows % n
    rows_pad, g_pad = jnp.pad(rows_W, (0, pad)), jnp.pad(g_BxTxRxDm.reshape(-1, Dm),
                                                          ((0, pad), (0, 0)))
    scores_WxK = jnp.concatenate(
        [slot_block_scores(table_ExDm, rows_pad, g_pad, slot=u, bits=bits, chunk=n)
         for u in range(U)], axis=1)[:windows]
  else:
    given = hard_scores_BxTxR is not None
    read_WxK = _onebit_rows(rows_W, U, bits, with_hard=not given)
    n = chunk_windows(windows, read_WxK.shape[1], row_bytes, chunk_bytes)
    pad = -windows % n
    # Padding windows read row 0 against g = 0 and are dropped.
    scores_WxK = block_scores(
        table_ExDm, jnp.pad(read_WxK, ((0, pad), (0, 0))),
        jnp.pad(g_BxTxRxDm.reshape(-1, Dm), ((0, pad), (0, 0))), n)[:windows]
    if given:
      scores_WxK = jnp.concatenate(
          [hard_scores_BxTxR.reshape(-1, 1).astype(scores_WxK.dtype), scores_WxK], axis=1)
  # Slot u of the window ending at t holds the symbol at t - (U-1-u).
  z_at_WxUxM = jnp.stack([shift_right(z_BxTxRxM, U - 1 - u) for u in range(U)],
                         axis=3).reshape(-1, U, M)
  if surrogate == "exact":
    contrib_WxUxM = _exact_from_scores(scores_WxK.reshape(-1, U, 2**bits), z_at_WxUxM, tau)
  else:
    contrib_WxUxM = _onebit_from_scores(scores_WxK, rows_W, z_at_WxUxM, bits=bits, tau=tau)
  contrib_BxTxRxUxM = contrib_WxUxM.reshape(B, T, R, U, M)
  d_z = jnp.zeros_like(z_BxTxRxM)
  for u in range(U):
    # The window ending at t wrote slot u's gradient for position t - (U-1-u).
    d_z += shift_left(contrib_BxTxRxUxM[:, :, :, u], U - 1 - u)
  return scale * d_z
