"""The permutation test's null: document permutations within cells, and the Hamming
search over permuted reference codes against `knn.distinct_doc_knn`."""

import numpy as np
import pytest

from experiments.analysis import id_permutation, knn


def test_stratum_document_permutation_moves_whole_blocks_within_strata():
  rng = np.random.default_rng(0)
  strata = rng.integers(0, 3, 200)
  docs = rng.integers(0, 7, 200)
  src = id_permutation.stratum_document_permutation(strata, docs, np.random.default_rng(1))
  assert sorted(src) == list(range(200))               # a bijection
  np.testing.assert_array_equal(strata[src], strata)   # within strata
  moved = 0
  for s in range(3):
    for d in range(7):
      sel = (strata == s) & (docs == d)
      moved += (docs[src[sel]] != d).sum()
  assert moved > 100                                   # signatures change documents
  # Document blocks stay together: listed document by document, a stratum's
  # positions take their signatures from one document after another.
  for s in range(3):
    order = np.lexsort((np.arange(200), docs, strata))
    source_docs = docs[src[order[strata[order] == s]]]
    runs = 1 + (np.diff(source_docs) != 0).sum()
    assert runs == len(set(source_docs))
  again = id_permutation.stratum_document_permutation(strata, docs, np.random.default_rng(1))
  np.testing.assert_array_equal(src, again)


def test_permuted_hamming_search_equals_knn():
  rng = np.random.default_rng(0)
  ref = rng.integers(0, 3, (80, 3)).astype(np.int32)    # few codes: many ties
  ref_docs = rng.integers(0, 9, 80)                      # documents not contiguous
  query = rng.integers(0, 3, (30, 3)).astype(np.int32)
  query_docs = rng.integers(0, 12, 30)                   # some own documents in the reference
  for k in (4, 12):                                      # 12 > 9 documents: -1 padding
    search = id_permutation.PermutedHammingKnn(query, ref, query_docs, ref_docs, k, 3)
    for src in (None, rng.permutation(80)):
      codes = ref if src is None else ref[src]
      want = knn.distinct_doc_knn(query, codes, query_docs, ref_docs, k, "hamming", n_codes=3)
      np.testing.assert_array_equal(search(src), want)


def test_movable_share_by_hand():
  strata = np.array([0, 0, 1, 1, 2])
  docs = np.array([0, 1, 2, 2, 3])
  assert id_permutation.movable_share(strata, docs) == pytest.approx(2 / 5)
