"""experiments.analysis.knn: the JAX search equals a brute-force loop, ties included."""

import numpy as np
import pytest

from experiments.analysis import knn


def _brute(query, ref, qdocs, rdocs, k, metric):
  """Scan the reference in (distance, index) order, one position per new document."""
  out = np.full((len(query), k), -1)
  for i, q in enumerate(query):
    if metric == "hamming":
      d = (ref != q).sum(1).astype(np.float64)
    elif metric == "cosine":
      qq, rr = q.astype(np.float64), ref.astype(np.float64)
      d = 1 - rr @ qq / (np.linalg.norm(rr, axis=1) * np.linalg.norm(qq))
    else:
      d = ((ref.astype(np.float64) - q) ** 2).sum(1)
    seen, j = {qdocs[i]}, 0
    for r in sorted(range(len(ref)), key=lambda r: (d[r], r)):
      if rdocs[r] not in seen and j < k:
        seen.add(rdocs[r])
        out[i, j] = r
        j += 1
  return out


def test_hamming_equals_brute_force_with_ties():
  rng = np.random.default_rng(0)
  R, K = 4, 3  # few routes and codes: many equal distances, so tie-breaking is exercised
  ref = rng.integers(0, K, size=(90, R))
  rdocs = rng.integers(0, 12, size=90)
  query = rng.integers(0, K, size=(37, R))
  qdocs = rng.integers(0, 12, size=37)  # same id space: a query's own document is excluded
  for k in (1, 5):
    got = knn.distinct_doc_knn(query, ref, qdocs, rdocs, k, "hamming", block=16)
    np.testing.assert_array_equal(got, _brute(query, ref, qdocs, rdocs, k, "hamming"))
    # Distinct documents, never the query's own.
    docs = rdocs[got]
    assert all(len(set(row)) == k for row in docs)
    assert not (docs == qdocs[:, None]).any()


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_continuous_metrics_equal_brute_force(metric):
  rng = np.random.default_rng(1)
  ref = rng.normal(size=(70, 6)).astype(np.float32)
  rdocs = rng.integers(0, 15, size=70)
  query = rng.normal(size=(20, 6)).astype(np.float32)
  qdocs = rng.integers(0, 15, size=20)
  got, dist = knn.distinct_doc_knn(query, ref, qdocs, rdocs, 4, metric, block=8,
                                   return_distances=True)
  np.testing.assert_array_equal(got, _brute(query, ref, qdocs, rdocs, 4, metric))
  assert (np.diff(dist, axis=1) >= 0).all()


def test_documents_match_by_value_and_missing_neighbours_are_minus_one():
  ref = np.array([[0, 0], [0, 1], [1, 1], [0, 0]])
  rdocs = np.array(["a.py", "b.py", "b.py", "c.py"])
  query = np.array([[0, 0]])
  got, dist = knn.distinct_doc_knn(query, ref, np.array(["a.py"]), rdocs, 4, "hamming",
                                   return_distances=True)
  # a.py is the query's own file; c.py matches exactly; b.py offers its nearer index 1.
  np.testing.assert_array_equal(got, [[3, 1, -1, -1]])
  np.testing.assert_array_equal(dist[0, :2], [0, 1])
  assert np.isinf(dist[0, 2:]).all()
  # A held-out file of another name excludes nothing.
  got = knn.distinct_doc_knn(query, ref, np.array(["z.py"]), rdocs, 2, "hamming")
  np.testing.assert_array_equal(got, [[0, 3]])


def test_neighbour_scores():
  labels_PxZ = np.array([[1, 0], [1, 1], [0, 1], [0, 0]], bool)
  idx_QxK = np.array([[0, 1, 2], [3, 2, -1], [-1, -1, -1]])
  np.testing.assert_allclose(knn.neighbour_scores(idx_QxK, labels_PxZ),
                             [[2 / 3, 2 / 3], [0, 0.5], [0, 0]])


def test_bad_arguments():
  codes = np.zeros((3, 2), int)
  with pytest.raises(ValueError, match="metric"):
    knn.distinct_doc_knn(codes, codes, [0, 1, 2], [0, 1, 2], 1, "manhattan")
  with pytest.raises(ValueError, match="integer"):
    knn.distinct_doc_knn(codes * 1.0, codes, [0, 1, 2], [0, 1, 2], 1, "hamming")
  with pytest.raises(ValueError, match=r"\[0, 2\)"):
    knn.distinct_doc_knn(codes + 2, codes, [0, 1, 2], [0, 1, 2], 1, "hamming", n_codes=2)
