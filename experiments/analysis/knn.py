"""K nearest reference positions from distinct documents, batched in JAX.

The readers of "Lngram v2: Latent N-Gram Memory with Interpretable Discrete
Representations" §3.2 score a held-out position by its K nearest reference
positions, one per document: K neighbours from one file would mostly repeat that
file's concepts and measure the file, not the representation. The rule here:
the K neighbours come from K different documents, never the query's own; each
document offers its best position; order is (distance, reference index), so
ties go to the lower reference index and the result is deterministic.

Metrics
  "hamming"    codes [P, R] (int in [0, K)): number of routes whose code differs,
               R - onehot(q) . onehot(r) as one matmul (exact: 0/1 products).
  "cosine"     1 - cos(q, r) on continuous vectors (h).
  "euclidean"  squared euclidean distance (same order as euclidean).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

METRICS = ("hamming", "cosine", "euclidean")


def _distances(q_QxF, ref_PxF, metric: str, n_codes: int):
  hp = jax.lax.Precision.HIGHEST
  if metric == "hamming":
    R = q_QxF.shape[-1]
    q1h = jax.nn.one_hot(q_QxF, n_codes, dtype=jnp.float32).reshape(q_QxF.shape[0], -1)
    r1h = jax.nn.one_hot(ref_PxF, n_codes, dtype=jnp.float32).reshape(ref_PxF.shape[0], -1)
    return R - jnp.dot(q1h, r1h.T, precision=hp)
  q = q_QxF.astype(jnp.float32)
  r = ref_PxF.astype(jnp.float32)
  if metric == "cosine":
    # Zero vectors get norm 1 (distance 1 to everything) instead of NaN.
    qn = q / jnp.maximum(jnp.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
    rn = r / jnp.maximum(jnp.linalg.norm(r, axis=-1, keepdims=True), 1e-12)
    return 1.0 - jnp.dot(qn, rn.T, precision=hp)
  sq = (jnp.sum(q * q, -1)[:, None] + jnp.sum(r * r, -1)[None, :]
        - 2.0 * jnp.dot(q, r.T, precision=hp))
  return jnp.maximum(sq, 0.0)


@functools.partial(jax.jit, static_argnames=("k", "metric", "n_codes", "n_docs"))
def _knn_block(q_QxF, ref_PxF, qdoc_Q, rdoc_P, *, k, metric, n_codes, n_docs):
  """Indices [Q, k] and distances [Q, k] of one query block (-1 / inf: none left)."""
  dist_QxP = _distances(q_QxF, ref_PxF, metric, n_codes)
  P = ref_PxF.shape[0]
  dist_PxQ = dist_QxP.T
  # Each document's best distance, then its lowest reference index at that distance.
  best_NxQ = jax.ops.segment_min(dist_PxQ, rdoc_P, num_segments=n_docs)
  at_best_PxQ = dist_PxQ == best_NxQ[rdoc_P]
  ridx_PxQ = jnp.where(at_best_PxQ, jnp.arange(P, dtype=jnp.int32)[:, None], P)
  idx_NxQ = jax.ops.segment_min(ridx_PxQ, rdoc_P, num_segments=n_docs)
  best_QxN = best_NxQ.T
  idx_QxN = idx_NxQ.T
  own_QxN = qdoc_Q[:, None] == jnp.arange(n_docs, dtype=jnp.int32)[None, :]
  empty_QxN = idx_QxN >= P  # document with no reference position
  best_QxN = jnp.where(own_QxN | empty_QxN, jnp.inf, best_QxN)
  idx_QxN = jnp.where(own_QxN | empty_QxN, P, idx_QxN)
  # Lexicographic (distance, reference index) sort over documents.
  best_QxN, idx_QxN = jax.lax.sort((best_QxN, idx_QxN), dimension=1, num_keys=2)
  best_QxK = best_QxN[:, :k]
  idx_QxK = jnp.where(idx_QxN[:, :k] >= P, -1, idx_QxN[:, :k])
  return idx_QxK, best_QxK


def _doc_ids(query_docs, ref_docs):
  """Query and reference documents as ids in one space (matched by value)."""
  q = np.asarray(query_docs).reshape(-1)
  r = np.asarray(ref_docs).reshape(-1)
  uniq, inv = np.unique(np.concatenate([q, r]), return_inverse=True)
  inv = inv.reshape(-1).astype(np.int32)
  return inv[:q.size], inv[q.size:], len(uniq)


def distinct_doc_knn(query, ref, query_docs, ref_docs, k: int, metric: str, *,
                     n_codes: int | None = None, block: int = 256,
                     return_distances: bool = False):
  """The k nearest reference positions of each query, from k distinct documents.

  Parameters
  ----------
  query : [Q, F] queries (int codes [Q, R] for "hamming", floats otherwise).
  ref : [P, F] reference positions, same F.
  query_docs, ref_docs : [Q], [P] documents. Matched BY VALUE across the two:
    pass file paths (e.g. `np.asarray(rec.files)[rec.file_ids]`) when query and
    reference come from different splits, whose integer ids are not comparable.
  k : neighbours per query.
  metric : "hamming", "cosine" or "euclidean".
  n_codes : codes per route for "hamming" (default: max code + 1 of both).
  block : queries per JAX call; the last block is padded so one compile serves all.
  return_distances : also return the distances [Q, k] (float32).

  Returns
  -------
  int64 [Q, k] reference indices, nearest first; -1 where fewer than k other
  documents exist (their distances are inf).
  """
  if metric not in METRICS:
    raise ValueError(f"distinct_doc_knn: metric={metric!r}; use one of {METRICS}.")
  query = np.asarray(query)
  ref = np.asarray(ref)
  if query.ndim != 2 or ref.ndim != 2 or query.shape[1] != ref.shape[1]:
    raise ValueError(f"distinct_doc_knn: query {query.shape} and ref {ref.shape} must be "
                     "[Q, F] and [P, F].")
  if k < 1:
    raise ValueError(f"distinct_doc_knn: k={k} must be >= 1.")
  qdoc, rdoc, n_docs = _doc_ids(query_docs, ref_docs)
  if qdoc.size != query.shape[0] or rdoc.size != ref.shape[0]:
    raise ValueError("distinct_doc_knn: one document per query and per reference position.")
  if metric == "hamming":
    if not (np.issubdtype(query.dtype, np.integer) and np.issubdtype(ref.dtype, np.integer)):
      raise ValueError("distinct_doc_knn: 'hamming' needs integer codes.")
    top = int(max(query.max(initial=0), ref.max(initial=0)))
    if n_codes is None:
      n_codes = top + 1
    if min(query.min(initial=0), ref.min(initial=0)) < 0 or top >= n_codes:
      # one_hot would silently map such a code to all zeros (a wrong distance).
      raise ValueError(f"distinct_doc_knn: codes must lie in [0, {n_codes}).")
    query = query.astype(np.int32)
    ref = ref.astype(np.int32)
  else:
    n_codes = 0
    query = query.astype(np.float32)
    ref = ref.astype(np.float32)
  Q = query.shape[0]
  kk = min(k, n_docs)  # top-k over documents cannot ask for more than exist
  idx = np.full((Q, k), -1, np.int64)
  dist = np.full((Q, k), np.inf, np.float32)
  if Q == 0 or ref.shape[0] == 0:
    return (idx, dist) if return_distances else idx
  block = max(1, min(block, Q))
  ref_j = jnp.asarray(ref)
  rdoc_j = jnp.asarray(rdoc)
  for lo in range(0, Q, block):
    hi = min(Q, lo + block)
    q_blk = np.zeros((block,) + query.shape[1:], query.dtype)
    q_blk[:hi - lo] = query[lo:hi]
    d_blk = np.full(block, -1, np.int32)  # padding rows: no own document
    d_blk[:hi - lo] = qdoc[lo:hi]
    i_b, d_b = _knn_block(jnp.asarray(q_blk), ref_j, jnp.asarray(d_blk), rdoc_j,
                          k=kk, metric=metric, n_codes=n_codes, n_docs=n_docs)
    idx[lo:hi, :kk] = np.asarray(i_b)[:hi - lo]
    dist[lo:hi, :kk] = np.asarray(d_b)[:hi - lo]
  return (idx, dist) if return_distances else idx


def neighbour_scores(idx_QxK, ref_labels_PxZ) -> np.ndarray:
  """Share of each query's neighbours that carry each concept.

  Parameters
  ----------
  idx_QxK : int reference indices from `distinct_doc_knn` (-1 = no neighbour).
  ref_labels_PxZ : bool (or 0/1) labels of the reference positions.

  Returns
  -------
  float32 [Q, Z]: mean label over the valid neighbours (0 where there are none).
  """
  idx_QxK = np.asarray(idx_QxK)
  labels_PxZ = np.asarray(ref_labels_PxZ, np.float32)
  valid_QxK = idx_QxK >= 0
  n_Q = valid_QxK.sum(1)
  Q, Z = idx_QxK.shape[0], labels_PxZ.shape[1]
  out = np.zeros((Q, Z), np.float32)
  # Rows in chunks so [chunk, K, Z] stays small for many concepts.
  chunk = max(1, 2**22 // max(1, idx_QxK.shape[1] * Z))
  for lo in range(0, Q, chunk):
    sl = slice(lo, lo + chunk)
    gathered = labels_PxZ[np.where(valid_QxK[sl], idx_QxK[sl], 0)]
    gathered *= valid_QxK[sl][..., None]
    out[sl] = gathered.sum(1) / np.maximum(n_Q[sl], 1)[:, None]
  return out
