"""experiments.analysis.stats: hand cases and known values for every statistic."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from experiments.analysis import stats


def _ap_loop(scores, labels):
  """sklearn's definition written out: one step per distinct threshold, highest first."""
  npos = labels.sum()
  ap, prev_recall = 0.0, 0.0
  for t in sorted(set(scores.tolist()), reverse=True):
    sel = scores >= t
    tp = labels[sel].sum()
    recall = tp / npos
    ap += (recall - prev_recall) * tp / sel.sum()
    prev_recall = recall
  return ap


def test_average_precision_hand_cases():
  # sklearn's documented example.
  assert stats.average_precision([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(5 / 6)
  # One tie group of three holding two positives: precision 2/3 at recall 1.
  assert stats.average_precision([0.5, 0.5, 0.5, 0.1], [1, 0, 1, 0]) == pytest.approx(2 / 3)
  # Recall 1/2 at precision 1, then the rest as one group at precision 2/4.
  assert stats.average_precision([1.0, 0.5, 0.5, 0.5], [1, 0, 0, 1]) == pytest.approx(0.75)
  # A tie does not get the benefit of the order inside it.
  assert stats.average_precision([1.0, 1.0], [1, 0]) == pytest.approx(0.5)
  assert stats.average_precision([3, 2, 1], [1, 1, 1]) == 1.0
  assert math.isnan(stats.average_precision([1.0, 2.0], [0, 0]))


def test_average_precision_columns_match_the_loop():
  rng = np.random.default_rng(0)
  scores_PxZ = rng.integers(0, 5, size=(60, 4)) / 4  # many ties, like k/K shares
  labels_PxZ = rng.random((60, 4)) < 0.3
  labels_PxZ[:, 3] = False
  ap_Z = stats.average_precision(scores_PxZ, labels_PxZ)
  assert ap_Z.shape == (4,)
  for z in range(3):
    assert ap_Z[z] == pytest.approx(_ap_loop(scores_PxZ[:, z], labels_PxZ[:, z]))
    assert ap_Z[z] == pytest.approx(stats.average_precision(scores_PxZ[:, z], labels_PxZ[:, z]))
  assert np.isnan(ap_Z[3])
  with pytest.raises(ValueError, match="shape|!="):
    stats.average_precision(scores_PxZ, labels_PxZ[:, :2])


def test_bh_adjust_hand_cases():
  np.testing.assert_allclose(stats.bh_adjust([0.01, 0.02, 0.03, 0.04, 0.05]), [0.05] * 5)
  # sorted 0.01, 0.03, 0.04, 0.2 -> 4p/i = 0.04, 0.06, 0.0533, 0.2 -> running min from the top.
  np.testing.assert_allclose(stats.bh_adjust([0.01, 0.04, 0.03, 0.2]),
                             [0.04, 0.16 / 3, 0.16 / 3, 0.2])
  np.testing.assert_allclose(stats.bh_adjust([0.5, 0.9, 1.0]), [1.0, 1.0, 1.0])
  # NaN (not evaluable) stays NaN and is not counted in m.
  out = stats.bh_adjust([0.01, np.nan, 0.04])
  assert np.isnan(out[1])
  np.testing.assert_allclose(out[[0, 2]], [0.02, 0.04])
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    stats.bh_adjust([1.5])


def test_bh_adjust_matches_scipy():
  p = np.random.default_rng(1).random(200) ** 3
  np.testing.assert_allclose(stats.bh_adjust(p), sps.false_discovery_control(p, method="bh"))


def test_permutation_p_and_bounds():
  assert stats.permutation_p(5.0, [1, 2, 5, 6]) == pytest.approx(3 / 5)
  null = np.linspace(0, 1, 500)
  assert stats.permutation_p(2.0, null) == pytest.approx(1 / 501)
  assert stats.permutation_p(-1.0, null) == 1.0
  lo, hi = stats.permutation_p_interval(2.0, null)
  assert lo == 0.0
  assert hi == pytest.approx(1 - 0.025 ** (1 / 500))  # ~0.0074
  with pytest.raises(ValueError, match="no null"):
    stats.permutation_p(1.0, [])


def test_binomial_test_known_values():
  r = stats.binomial_test(10, 10, 0.5)
  assert r.p_value == pytest.approx(2 * 0.5**10)
  assert stats.binomial_test(8, 10, 0.5, alternative="greater").p_value == pytest.approx(56 / 1024)
  assert stats.binomial_test(2, 10, 0.5, alternative="less").p_value == pytest.approx(56 / 1024)
  for k, n in [(0, 7), (3, 20), (17, 40), (50, 50)]:
    ref = sps.binomtest(k, n, 0.5)
    got = stats.binomial_test(k, n, 0.5)
    assert got.rate == pytest.approx(k / n)
    assert got.p_value == pytest.approx(ref.pvalue)  # the two-sided rules agree at 1/2
    ci = ref.proportion_ci(0.95, method="exact")
    assert (got.lo, got.hi) == pytest.approx((ci.low, ci.high))
  assert np.isnan(stats.binomial_test(0, 0, 0.3).p_value)


def test_binomial_test_rejects_exactly_when_the_interval_excludes_p0():
  k = np.arange(31)
  r = stats.binomial_test(k, 30, 0.2)  # vectorised over k
  excludes = (r.lo > 0.2) | (r.hi < 0.2)
  np.testing.assert_array_equal(r.p_value < 0.05, excludes)
  assert excludes.any() and not excludes.all()


def test_bootstrap_is_document_level_and_seeded():
  rng = np.random.default_rng(2)
  doc_values = rng.normal(size=200)
  one = stats.bootstrap_mean_ci(doc_values, np.arange(200), n_boot=2000, seed=3)
  # Fifty identical positions per document: no more information, same interval.
  many = stats.bootstrap_mean_ci(np.repeat(doc_values, 50), np.repeat(np.arange(200), 50),
                                 n_boot=2000, seed=3)
  assert many.estimate == pytest.approx(one.estimate)
  assert (many.lo, many.hi) == pytest.approx((one.lo, one.hi))
  assert one.lo < one.estimate < one.hi
  assert 0.2 < one.hi - one.lo < 0.35  # ~2 * 1.96 / sqrt(200) = 0.277
  again = stats.bootstrap_mean_ci(doc_values, np.arange(200), n_boot=2000, seed=3)
  assert again == one


def test_bootstrap_columns_share_resamples():
  rng = np.random.default_rng(4)
  values_PxV = rng.random((300, 2))
  docs = rng.integers(0, 30, 300)
  both = stats.bootstrap_mean_ci(values_PxV, docs, n_boot=500, seed=5, chunk=128)
  for v in range(2):
    single = stats.bootstrap_mean_ci(values_PxV[:, v], docs, n_boot=500, seed=5, chunk=128)
    assert both.estimate[v] == pytest.approx(values_PxV[:, v].mean())
    assert (both.lo[v], both.hi[v]) == pytest.approx((single.lo, single.hi))
  const = stats.bootstrap_mean_ci(np.full(10, 0.25), np.arange(10) % 3, n_boot=100)
  assert const == pytest.approx((0.25, 0.25, 0.25))


def test_histogram_stats_known_distributions():
  out = stats.histogram_stats([[5, 5, 5, 5], [2, 1, 1, 0], [7, 0, 0, 0]])
  np.testing.assert_allclose(out["n_eff"], [4.0, 2**1.5, 1.0])
  np.testing.assert_allclose(out["normalised_entropy"], [1.0, 1.5 * np.log(2) / np.log(4), 0.0],
                             atol=1e-12)
  np.testing.assert_allclose(out["top_freq"], [0.25, 0.5, 1.0])


def test_code_utilisation():
  K = 4
  codes_PxR = np.stack([np.zeros(8, int), np.arange(8) % K], axis=1)
  out = stats.code_utilisation(codes_PxR, K)
  np.testing.assert_allclose(out["n_eff"], [1.0, 4.0])
  np.testing.assert_array_equal(out["dead"], [3, 0])
  assert out["dead_codes"] == 3 and out["total_codes"] == 8
  assert out["mean_top_freq"] == pytest.approx((1.0 + 0.25) / 2)
  np.testing.assert_array_equal(out["counts"], [[8, 0, 0, 0], [2, 2, 2, 2]])
  with pytest.raises(ValueError, match="outside"):
    stats.code_utilisation(codes_PxR, 2)
