"""Surrogate router gradients that read each window's candidate rows as one block.

The same maths as `lookup.surrogate_logit_grad` (its gather twin, DESIGN.md
§2.7), arranged for memory access. The C = 2^M candidates of slot u of an
order-n window differ only in that slot's digit, which weighs C^u (§2.2): they
are the rows base_u + c·C^u, contiguous for the oldest slot. Instead of one
gather of B·T·R rows per candidate (C per slot for exact, M + 1 for one-bit),
each window reads all the rows it needs, over all its slots, in one gather:

  exact    n·C rows (every code of every slot),
  onebit   1 + n·M rows (the hard row, then each slot's M one-bit flips),

and contracts them with its cotangent g at once (`block_scores`). Windows go in
chunks (`lax.map`) sized so the gathered rows stay in cache until the dot reads
them: on CPU the cost is the memory traffic of the gathered rows, and writing a
[B, T, R, rows per window, Dm] block and reading it back costs more than the
gather form saves. Both the chunks and their layout are the lowering platform's
(`jax.lax.platform_dependent`). On CPU: ~2 MiB of rows, contiguous runs of windows
(cache). Elsewhere: 256 MiB, which only bounds memory, and a chunk takes every n-th
window (n the number of chunks): with the batch split over devices and left to XLA
(no shard_map) each device then works on its own windows in every chunk, where a
contiguous run sits on one device and XLA gathers the whole [windows, cand] array
onto every device for every chunk (the TPU compiler's plan of the Lngram v1 MoE
recipe on data=4 moved 58 TiB per step that way). On one CPU the strided layout's
transposes cost 1.35x the contiguous chunks' time (a block of 4,096 windows). The surrogate maths then runs on all windows' scores
together. The slot digits come from the row itself, so an invalid window (its
route's first row, g = 0) reads inside the table and adds exactly zero.

Shapes (DESIGN.md §1): BTR the windows flattened over (b, t, r); n the slots of
an order-n window; `cand` the candidate rows one window reads (n·C or 1 + n·M);
`chunk` the windows of one chunk.
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
  if budget is None:   # eager calls: this process's backend (traced: the caller chooses)
    budget = _CHUNK_BYTES.get(jax.default_backend(), _CHUNK_BYTES_DEFAULT)
  count = max(1, budget // max(1, rows_per_window * row_bytes))
  count = 1 << (count.bit_length() - 1)
  return min(count, 1 << max(0, (windows - 1).bit_length()))


def _code_bits(bits: int, dtype):
  """β: [C, M] with β[c, j] = bit j of c."""
  codes_C = jnp.arange(2**bits, dtype=jnp.int32)
  return ((codes_C[:, None] >> jnp.arange(bits, dtype=jnp.int32)) & 1).astype(dtype)


def _slot_digits(rows_BTR, n: int, bits: int):
  """Slot u's digit of each row, and its weight C^u: [BTR, n], [n]."""
  C = 2**bits
  stride_n = C ** jnp.arange(n, dtype=jnp.int32)
  return (rows_BTR[:, None] // stride_n) % C, stride_n


def _exact_rows(rows_BTR, n: int, bits: int):
  """The C candidates of every slot: [BTR, n·C] rows, slot-major (base_u + c·C^u)."""
  C = 2**bits
  digit_BTRxn, stride_n = _slot_digits(rows_BTR, n, bits)
  base_BTRxn = rows_BTR[:, None] - digit_BTRxn * stride_n
  cand_BTRxnxC = base_BTRxn[..., None] + jnp.arange(C, dtype=jnp.int32) * stride_n[:, None]
  return cand_BTRxnxC.reshape(-1, n * C)


def _onebit_rows(rows_BTR, n: int, bits: int, *, with_hard: bool = True):
  """The hard row (unless `with_hard` is False), then the n·M rows with one bit
  flipped: [BTR, 1 + n·M] (or [BTR, n·M]).

  Flipping bit j of slot u moves the row by (1 - 2b_j)·2^j·C^u.
  """
  digit_BTRxn, stride_n = _slot_digits(rows_BTR, n, bits)
  sign_BTRxnxM = 1 - 2 * _hard_bits(digit_BTRxn, bits)  # +1 if the hard bit is 0
  step_nxM = stride_n[:, None] * (2 ** jnp.arange(bits, dtype=jnp.int32))
  flipped_BTRxnM = (rows_BTR[:, None, None] + sign_BTRxnxM * step_nxM).reshape(-1, n * bits)
  if not with_hard:
    return flipped_BTRxnM
  return jnp.concatenate([rows_BTR[:, None], flipped_BTRxnM], axis=1)


def _hard_bits(digit_BTRxn, bits: int):
  return (digit_BTRxn[..., None] >> jnp.arange(bits, dtype=jnp.int32)) & 1


def _exact_from_scores(scores_BTRxnxC, z_BTRxnxM, tau):
  """λ-free exact surrogate of every slot: τ Σ_c P(c|z_u)(β(c) - p_u)s_c, [BTR, n, M]."""
  M = z_BTRxnxM.shape[-1]
  beta_CxM = _code_bits(M, z_BTRxnxM.dtype)
  p_BTRxnxM = jax.nn.sigmoid(tau * z_BTRxnxM)
  q_BTRxnxM = jax.nn.sigmoid(-tau * z_BTRxnxM)   # 1 - p without its cancellation
  # P(c|z) = Π_j (β_j(c) ? p_j : q_j) for all c at once: bit by bit, the codes seen so
  # far split into bit j = 0 (× q_j) and 1 (× p_j), so code c = Σ_j β_j(c)·2^j lands at
  # index c. Products, not exp(Σ log): 5x less work at the same values.
  prob = jnp.ones(z_BTRxnxM.shape[:-1] + (1,), z_BTRxnxM.dtype)
  for j in range(M):
    prob = jnp.stack([prob * q_BTRxnxM[..., j:j + 1], prob * p_BTRxnxM[..., j:j + 1]],
                     axis=-2).reshape(*z_BTRxnxM.shape[:-1], -1)
  ps_BTRxnxC = prob * scores_BTRxnxC
  weighted_BTRxnxM = jnp.einsum("iuc,cm->ium", ps_BTRxnxC, beta_CxM)
  total_BTRxn = jnp.sum(ps_BTRxnxC, axis=-1)
  # Σ_c P_c(β_c - p)s_c = Σ_c P_c β_c s_c - p Σ_c P_c s_c
  return tau * (weighted_BTRxnxM - p_BTRxnxM * total_BTRxn[..., None])


def onebit_from_scores(scores_BTRxcand, rows_BTR, z_BTRxnxM, *, bits, tau):
  """λ-free one-bit surrogate of every slot: τ p(1-p)·s_j, [BTR, n, M].

  s_j = (1 - 2b_j)(⟨g, E_flip⟩ - ⟨g, E_hard⟩) (App. A.3), from `_onebit_rows`' scores.
  """
  n, M = z_BTRxnxM.shape[1:]
  digit_BTRxn, _ = _slot_digits(rows_BTR, n, bits)
  sign_BTRxnxM = (1 - 2 * _hard_bits(digit_BTRxn, bits)).astype(scores_BTRxcand.dtype)
  hard_BTR, flip_BTRxnxM = scores_BTRxcand[:, 0], scores_BTRxcand[:, 1:].reshape(-1, n, M)
  s_BTRxnxM = sign_BTRxnxM * (flip_BTRxnxM - hard_BTR[:, None, None])
  p_BTRxnxM = jax.nn.sigmoid(tau * z_BTRxnxM)
  return tau * p_BTRxnxM * (1 - p_BTRxnxM) * s_BTRxnxM


def _map_chunks(one, xs, chunk: int, strided: bool):
  """`lax.map` of `one` over chunks of `chunk` windows: contiguous runs, or with
  `strided` chunk j holding windows j, j + n, j + 2n, ... (n chunks; module
  docstring). Returns [windows, ...] in window order."""
  n = xs[0].shape[0] // chunk
  if not strided:
    out = jax.lax.map(one, tuple(x.reshape(n, chunk, *x.shape[1:]) for x in xs))
    return out.reshape(n * chunk, *out.shape[2:])
  spread = tuple(jnp.swapaxes(x.reshape(chunk, n, *x.shape[1:]), 0, 1) for x in xs)
  out_nxchunk = jax.lax.map(one, spread)
  return jnp.swapaxes(out_nxchunk, 0, 1).reshape(chunk * n, *out_nxchunk.shape[2:])


def block_scores(table_ExDm, read_BTRxcand, g_BTRxDm, chunk: int, strided: bool = False):
  """⟨g_i, E[read_ik]⟩: [BTR, cand] in g's dtype, BTR a multiple of `chunk`.

  Chunks of windows run one after another (`lax.map`; `strided`: every n-th window a
  chunk); each reads all `cand` rows of its windows in one gather and contracts them
  with g while they are in cache.
  """
  windows, cand = read_BTRxcand.shape

  def one(args):
    read_chunkxcand, g_chunkxDm = args
    rows_chunkxcandxDm = jnp.take(table_ExDm, read_chunkxcand, axis=0, mode="clip")
    return jnp.einsum("ikd,id->ik", rows_chunkxcandxDm.astype(g_chunkxDm.dtype), g_chunkxDm)

  return _map_chunks(one, (read_BTRxcand, g_BTRxDm), chunk, strided).reshape(windows, cand)


def slot_block_scores(table_ExDm, rows_BTR, g_BTRxDm, *, slot: int, bits: int, chunk: int,
                      strided: bool = False):
  """⟨g_i, E[base_u + c·C^u]⟩ for the C candidates c of slot u: [BTR, C], BTR a multiple
  of `chunk`.

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
    rows_chunk, g_chunkxDm = args
    zero_chunk = jnp.zeros_like(rows_chunk)
    start_chunkx4 = jnp.stack([rows_chunk // (C * inner), zero_chunk, rows_chunk % inner,
                               zero_chunk], axis=-1)
    cand_chunkxCxDm = jax.lax.gather(table_4d, start_chunkx4, dims,
                                     slice_sizes=(1, C, 1, Dm), mode="clip")
    return jnp.einsum("icd,id->ic", cand_chunkxCxDm.astype(g_chunkxDm.dtype), g_chunkxDm)

  return _map_chunks(one, (rows_BTR, g_BTRxDm), chunk, strided).reshape(-1, C)


def surrogate_logit_grad_blocks(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, *,
                                order: int, bits: int, surrogate: str, tau: float,
                                scale: float, chunk_bytes: int | None = None,
                                hard_scores_BxTxR=None):
  """`_surrogate_logit_grad_blocks` with the chunk budget of the lowering platform when
  `chunk_bytes` is None (module docstring)."""
  options = dict(order=order, bits=bits, surrogate=surrogate, tau=tau, scale=scale)
  if chunk_bytes is not None:
    return _surrogate_logit_grad_blocks(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm,
                                        hard_scores_BxTxR, chunk_bytes=chunk_bytes,
                                        strided=False, **options)

  def chunked(budget, strided):
    return lambda *args: _surrogate_logit_grad_blocks(*args, chunk_bytes=budget,
                                                      strided=strided, **options)

  return jax.lax.platform_dependent(
      table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm, hard_scores_BxTxR,
      cpu=chunked(_CHUNK_BYTES["cpu"], False), default=chunked(_CHUNK_BYTES_DEFAULT, True))


def _surrogate_logit_grad_blocks(table_ExDm, logits_BxTxRxM, rows_BxTxR, g_BxTxRxDm,
                                 hard_scores_BxTxR, *, order: int, bits: int, surrogate: str,
                                 tau: float, scale: float, chunk_bytes: int, strided: bool):
  """`lookup.surrogate_logit_grad` for "exact" and "onebit", rows read in blocks.

  Every window (b, t, r) reads all its candidate rows, over all slots, in one
  gather (`block_scores`, in chunks of `chunk_windows`); the surrogate maths then
  runs on all windows' scores at once. `g_BxTxRxDm` must already be zero at
  invalid windows. `hard_scores_BxTxR`: ⟨g, E[hard row]⟩ if the caller has it
  (the lookup's backward takes it from the forward's retrieved rows), so that
  the one-bit surrogate reads only the n·M flipped rows.
  """
  if surrogate not in ("exact", "onebit"):
    raise ValueError(f"surrogate_logit_grad_blocks: surrogate={surrogate!r} has no block form.")
  acc = g_BxTxRxDm.dtype
  z_BxTxRxM = logits_BxTxRxM.astype(acc)
  B, T, R, M = z_BxTxRxM.shape
  Dm = table_ExDm.shape[1]
  n = order
  windows = B * T * R
  rows_BTR = rows_BxTxR.reshape(-1)
  row_bytes = Dm * jnp.dtype(acc).itemsize
  if surrogate == "exact":   # slot by slot, C rows per gather index
    chunk = chunk_windows(windows, 2**bits, row_bytes, chunk_bytes)
    pad = -windows % chunk
    rows_pad, g_pad = jnp.pad(rows_BTR, (0, pad)), jnp.pad(g_BxTxRxDm.reshape(-1, Dm),
                                                            ((0, pad), (0, 0)))
    scores_BTRxcand = jnp.concatenate(
        [slot_block_scores(table_ExDm, rows_pad, g_pad, slot=u, bits=bits, chunk=chunk,
                           strided=strided) for u in range(n)], axis=1)[:windows]
  else:
    given = hard_scores_BxTxR is not None
    read_BTRxcand = _onebit_rows(rows_BTR, n, bits, with_hard=not given)
    chunk = chunk_windows(windows, read_BTRxcand.shape[1], row_bytes, chunk_bytes)
    pad = -windows % chunk
    # Padding windows read row 0 against g = 0 and are dropped.
    scores_BTRxcand = block_scores(
        table_ExDm, jnp.pad(read_BTRxcand, ((0, pad), (0, 0))),
        jnp.pad(g_BxTxRxDm.reshape(-1, Dm), ((0, pad), (0, 0))), chunk, strided)[:windows]
    if given:
      scores_BTRxcand = jnp.concatenate(
          [hard_scores_BxTxR.reshape(-1, 1).astype(scores_BTRxcand.dtype), scores_BTRxcand],
          axis=1)
  # Slot u of the window ending at t holds the symbol at t - (n-1-u).
  z_at_BTRxnxM = jnp.stack([shift_right(z_BxTxRxM, n - 1 - u) for u in range(n)],
                           axis=3).reshape(-1, n, M)
  if surrogate == "exact":
    contrib_BTRxnxM = _exact_from_scores(scores_BTRxcand.reshape(-1, n, 2**bits),
                                         z_at_BTRxnxM, tau)
  else:
    contrib_BTRxnxM = onebit_from_scores(scores_BTRxcand, rows_BTR, z_at_BTRxnxM,
                                          bits=bits, tau=tau)
  contrib_BxTxRxnxM = contrib_BTRxnxM.reshape(B, T, R, n, M)
  d_z = jnp.zeros_like(z_BxTxRxM)
  for u in range(n):
    # The window ending at t wrote slot u's gradient for position t - (n-1-u).
    d_z += shift_left(contrib_BxTxRxnxM[:, :, :, u], n - 1 - u)
  return scale * d_z


def table_cotangent(table_ExDm, rows_BxTxR, g_BxTxRxDm):
  """Scatter-add of g onto the rows that were read (accumulated in >= f32)."""
  Dm = table_ExDm.shape[1]
  acc = jnp.promote_types(table_ExDm.dtype, jnp.float32)
  d_table = jnp.zeros(table_ExDm.shape, acc).at[rows_BxTxR.reshape(-1)].add(
      g_BxTxRxDm.reshape(-1, Dm).astype(acc), mode="promise_in_bounds")
  return d_table.astype(table_ExDm.dtype)
