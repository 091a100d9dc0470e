"""The null of the ID reader's permutation test (experiments/analysis/id_readers.py).

The reference signatures are permuted among reference DOCUMENTS within cells (the
nuisance strata, or nuisance stratum x current byte): per cell a bijection that keeps
each file's signatures together. `PermutedHammingKnn` computes the query-reference
distances once, so each permutation is a gather rather than a search.
"""

from __future__ import annotations

import numpy as np

PERM_STRATA = ("nuisance", "nuisance_byte")


def stratum_document_permutation(strata_P: np.ndarray, docs_P: np.ndarray,
                                 rng: np.random.Generator) -> np.ndarray:
  """int [P]: src, so that position i takes the signature of position src[i].

  Within each stratum, the documents are put in a random order and the
  positions of the stratum, listed document by document, take the signatures
  of the same list in the shuffled document order: a bijection inside every
  stratum under which each file's signatures stay together (they land on one
  or a few other files), so within-file correlation survives the shuffle.
  """
  strata = np.asarray(strata_P)
  docs = np.asarray(docs_P)
  order = np.arange(len(docs))
  u = rng.random(int(docs.max()) + 1 if len(docs) else 0)
  a = np.lexsort((order, docs, strata))
  b = np.lexsort((order, docs, u[docs], strata))
  src = np.empty(len(docs), np.int64)
  src[a] = b
  return src


def permutation_strata(records, kind: str = "nuisance") -> np.ndarray:
  """int64 [P]: the cells the permutation test moves signatures within."""
  if kind not in PERM_STRATA:
    raise ValueError(f"perm_strata={kind!r} is not one of {PERM_STRATA}.")
  strata = np.asarray(records.nuisance, np.int64)
  if kind == "nuisance_byte":   # x the current byte (a token run's: token id)
    current = np.asarray(records.surface, np.int64)[:, 0]
    width = max(257, int(current.max(initial=0)) + 2)   # 257 for bytes, wider for tokens
    strata = strata * width + (current + 1)
  return strata


def movable_share(strata_P: np.ndarray, docs_P: np.ndarray) -> float:
  """Share of positions whose cell holds two or more documents (the ones a
  within-cell document permutation can move)."""
  if len(strata_P) == 0:
    return float("nan")
  pairs = np.unique(np.stack([np.asarray(strata_P, np.int64), np.asarray(docs_P, np.int64)]),
                    axis=1)
  cells, n_docs = np.unique(pairs[0], return_counts=True)
  many = cells[n_docs >= 2]
  return float(np.isin(strata_P, many).mean())


class PermutedHammingKnn:
  """`knn.distinct_doc_knn(..., "hamming")` of fixed queries against permuted reference codes.

  A permutation only reorders the reference codes (position j gets the codes
  of src[j]), so the query-reference distances are computed once and each
  permutation is a column gather, a per-document minimum of the key
  distance·P + index (the (distance, reference index) order of `knn`) and a
  top-k over documents: the permutation test's inner loop without a search.
  Memory: Q·P int32 (int64 for very large P).
  """

  def __init__(self, query_codes_QxR, ref_codes_PxR, query_docs, ref_docs, k: int,
               n_codes: int):
    q = np.asarray(query_codes_QxR, np.int64)
    r = np.asarray(ref_codes_PxR, np.int64)
    eye = np.eye(n_codes, dtype=np.float32)
    F = q.shape[1] * n_codes
    same = eye[q].reshape(len(q), F) @ eye[r].reshape(len(r), F).T   # routes that agree
    P = len(r)
    dtype = np.int32 if (q.shape[1] + 1) * P < np.iinfo(np.int32).max else np.int64
    # [P, Q]: a permutation gathers whole rows (contiguous), cheaper than columns.
    self.dist_PxQ = np.ascontiguousarray((q.shape[1] - np.rint(same)).T.astype(dtype))
    ref_docs = np.asarray(ref_docs)
    self.order = np.argsort(ref_docs, kind="stable")   # documents contiguous, index order kept
    sorted_docs = ref_docs[self.order]
    self.starts = np.flatnonzero(np.r_[True, sorted_docs[1:] != sorted_docs[:-1]])
    self.own_QxN = np.asarray(query_docs)[:, None] == sorted_docs[self.starts][None, :]
    self.k = k

  def __call__(self, src_P: np.ndarray | None = None) -> np.ndarray:
    """int [Q, k]: neighbours when reference position j carries the codes of src[j]."""
    P = len(self.order)
    rows = self.order if src_P is None else np.asarray(src_P)[self.order]
    key_PxQ = self.dist_PxQ[rows]
    key_PxQ *= P
    key_PxQ += self.order[:, None].astype(key_PxQ.dtype)
    best_QxN = np.minimum.reduceat(key_PxQ, self.starts, axis=0).T
    none = np.iinfo(best_QxN.dtype).max
    best_QxN[self.own_QxN] = none
    kk = min(self.k, best_QxN.shape[1])
    top = np.sort(np.partition(best_QxN, kk - 1, axis=1)[:, :kk], axis=1)
    idx = np.full((len(best_QxN), self.k), -1, np.int64)
    idx[:, :kk] = np.where(top == none, -1, top % P)
    return idx
