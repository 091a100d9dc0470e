"""experiments.analysis.stats: hand cases, published values and scipy's for every statistic."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from experiments.analysis import stats

# --- ranking and multiple testing ----------------------------------------------------------

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


def test_holm_matches_r_and_skips_nan():
  # p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02
  assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
  got = stats.holm([0.01, math.nan, 0.02])
  assert got[0] == pytest.approx(0.02) and math.isnan(got[1]) and got[2] == pytest.approx(0.02)
  assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])   # capped at 1, monotone


# --- tests over seeds ----------------------------------------------------------------------

def _diffs_with_t(t, df):
  """df + 1 differences whose paired t statistic is `t` (sd 1, mean t / sqrt(n))."""
  x = np.arange(df + 1, dtype=np.float64)
  z = (x - x.mean()) / x.std(ddof=1)
  return z + t / math.sqrt(df + 1)


def _t_975(df):
  """t_{0.975, df} as paired_t's CI uses it: the CI's half-width over the standard error."""
  r = stats.paired_t(_diffs_with_t(1.0, df))
  return (r["ci"][1] - r["mean"]) / r["se"]


@pytest.mark.parametrize("t, df, want", [
    (0.0, 3, 0.5), (1.0, 1, 0.75),                   # Cauchy: 1/2 + atan(t)/pi
    (2.0, 4, 0.9419417382415922),                    # scipy.stats.t.cdf(2, 4)
    (-2.5, 10, 0.01572342211830441),               # scipy.stats.t.cdf(-2.5, 10)
    (1.5, 2, 1 / 2 + 1.5 / (2 * math.sqrt(2 + 1.5 ** 2))),   # closed form at df = 2
])
def test_paired_t_p_is_the_t_distribution_at_known_values(t, df, want):
  # want = P(T <= t) with df degrees of freedom; the two-sided p is twice the smaller tail.
  d = _diffs_with_t(t, df)
  r = stats.paired_t(d)
  assert r["t"] == pytest.approx(t, abs=1e-12) and r["df"] == df
  assert r["p"] == pytest.approx(2 * min(want, 1 - want), abs=1e-12)
  assert r["p"] == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue, abs=1e-12)


@pytest.mark.parametrize("df, want", [
    (1, 12.706204736174694), (4, 2.7764451051977987), (29, 2.045229642132703)])
def test_paired_t_ci_is_the_t_quantile_and_inverts_the_test(df, want):
  d = _diffs_with_t(0.7, df)
  r = stats.paired_t(d)
  assert _t_975(df) == pytest.approx(want, abs=1e-9)
  assert (r["ci"][1] - r["mean"]) / r["se"] == pytest.approx(want, abs=1e-9)
  assert r["mean"] - r["ci"][0] == pytest.approx(r["ci"][1] - r["mean"], rel=1e-12)
  # The CI's edges are where the test's p reaches alpha = 0.05.
  for edge in r["ci"]:
    assert stats.paired_t(d - edge)["p"] == pytest.approx(0.05, abs=1e-12)


def test_paired_t_by_hand():
  d = [1.0, 2.0, 3.0, 4.0, 5.5]
  r = stats.paired_t(d)
  sd = np.std(d, ddof=1)
  assert (r["n"], r["df"]) == (5, 4) and r["mean"] == pytest.approx(3.1)
  assert r["t"] == pytest.approx(3.1 / (sd / math.sqrt(5)))
  assert r["p"] == pytest.approx(2 * (1 - sps.t.cdf(r["t"], 4)))
  assert r["p"] == pytest.approx(0.016550539701, abs=1e-9)   # scipy.stats.ttest_1samp
  half = 2.7764451051977987 * sd / math.sqrt(5)
  assert r["ci"] == pytest.approx((3.1 - half, 3.1 + half))
  assert math.isnan(stats.paired_t([1.0])["p"]) and stats.paired_t([])["n"] == 0
  assert stats.paired_t([0.2, 0.2, 0.2])["p"] == 0.0


def test_exact_sign_flip_and_sign_tests():
  # n = 3: the 8 signed sums of (1, -1, 2) are ±2, ±2, ±4, 0, 0; |sum| >= |2| in 6.
  assert stats.sign_flip_p([1.0, -1.0, 2.0]) == pytest.approx(6 / 8)
  assert stats.sign_flip_p([1, 2, 3, 4, 5]) == pytest.approx(2 / 32) == stats.min_flip_p(5)
  assert stats.sign_test_p([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)
  assert stats.sign_test_p([1, -2, 3, 0]) == pytest.approx(1.0)   # 2 of 3, zero dropped
  assert stats.sign_test_p([1, 2, 3, 4, -5, 6]) == pytest.approx(2 * 7 / 64)


# G*Power 3.1 ("t tests - Means: difference from constant (one sample case)", two tails,
# α 0.05): the actual power it prints for these (n, effect size dz) pairs.
@pytest.mark.parametrize("n, dz, want", [(34, 0.5, 0.8077775), (10, 1.0, 0.8030969)])
def test_t_power_matches_published_values(n, dz, want):
  assert stats.t_power(dz, 1.0, n) == pytest.approx(want, abs=5e-7)
  assert stats.t_power(dz * 0.03, 0.03, n) == pytest.approx(want, abs=5e-7)   # effect / sd


def _simulated_power(effect, sd, n, alpha, *, one_sided=False, draws=200_000, seed=0):
  """Share of simulated paired samples whose t-test rejects (the test the report runs)."""
  d = np.random.default_rng(seed).normal(effect, sd, size=(draws, n))
  t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
  if one_sided:
    return float(np.mean(t > sps.t.ppf(1 - alpha, n - 1)))
  return float(np.mean(np.abs(t) > sps.t.ppf(1 - alpha / 2, n - 1)))


@pytest.mark.parametrize("n, alpha", [(3, 0.05 / 21), (5, 0.05 / 21), (3, 0.05), (5, 0.05)])
def test_minimum_detectable_effect_has_the_power_it_claims(n, alpha):
  mde = stats.min_detectable_effect(0.02, n, alpha=alpha)
  assert stats.t_power(mde, 0.02, n, alpha) == pytest.approx(0.8, abs=1e-9)
  assert _simulated_power(mde, 0.02, n, alpha) == pytest.approx(0.8, abs=0.004)
  # The normal-shift shortcut it replaces is smaller, and has less than 80% power.
  old = (sps.t.ppf(1 - alpha / 2, n - 1) + sps.t.ppf(0.8, n - 1)) * 0.02 / math.sqrt(n)
  assert old < mde and stats.t_power(old, 0.02, n, alpha) < 0.8


def test_minimum_detectable_effect_edges_and_one_sided():
  assert math.isnan(stats.min_detectable_effect(0.02, 1))
  assert math.isnan(stats.min_detectable_effect(math.nan, 5))
  assert stats.min_detectable_effect(0.0, 5) == 0.0
  assert stats.min_detectable_effect(0.02, 5, alpha=0.0025) > stats.min_detectable_effect(0.02, 5)
  assert stats.min_detectable_effect(1.0, 5, power=0.01) == 0.0   # below the test's size
  # Scales with sd; more seeds detect less.
  assert stats.min_detectable_effect(0.04, 5) == pytest.approx(
      2 * stats.min_detectable_effect(0.02, 5))
  assert stats.min_detectable_effect(0.02, 10) < stats.min_detectable_effect(0.02, 5)
  one = stats.min_detectable_effect(0.02, 4, alternative="greater")
  assert one < stats.min_detectable_effect(0.02, 4)
  assert _simulated_power(one, 0.02, 4, 0.05, one_sided=True) == pytest.approx(0.8, abs=0.004)
  with pytest.raises(ValueError):
    stats.min_detectable_effect(0.02, 5, alternative="less")


def test_power_and_mde_agree_with_statsmodels():
  """statsmodels' TTestPower where it is finite: its lower tail is scipy's nct.cdf, NaN
  deep in the tail (scipy 1.17), and its solver then stops at a wrong root at α = 0.05/21
  (n = 5: 2.94, whose simulated power is 0.54); so the MDE is compared at α = 0.05."""
  power = pytest.importorskip("statsmodels.stats.power").TTestPower()
  for n, alpha, effect in ((3, 0.05 / 21, 5.0), (5, 0.05 / 21, 2.0), (8, 0.01, 1.2),
                           (5, 0.05, 0.7)):
    want = power.power(effect, n, alpha, alternative="two-sided")
    if math.isfinite(want):
      assert stats.t_power(effect, 1.0, n, alpha) == pytest.approx(want, rel=1e-8)
  for n in (3, 5, 10):
    want = power.solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    assert stats.min_detectable_effect(1.0, n) == pytest.approx(want, rel=1e-5)


def test_noninferiority_t_is_scipy_s_one_sided_test_against_the_margin():
  d = np.array([-0.004, 0.003, -0.001, 0.002, -0.006])
  r = stats.noninferiority_t(d, 0.01)
  want = sps.ttest_1samp(d, -0.01, alternative="greater")
  assert r["p"] == pytest.approx(want.pvalue, rel=1e-10)
  assert r["t"] == pytest.approx(want.statistic, rel=1e-10) and r["null"] == -0.01
  assert r["p_two_sided"] == pytest.approx(sps.ttest_1samp(d, -0.01).pvalue, rel=1e-10)
  # The one-sided 95% lower bound clears -margin exactly when p < 0.05.
  assert r["lower"] == pytest.approx(want.confidence_interval(0.95).low, rel=1e-10)
  assert (r["lower"] > -0.01) == (r["p"] < 0.05)
  # Far worse than the margin: p near 1, and the verdict reads "reversed" (worse beyond it).
  bad = stats.noninferiority_t(d - 0.05, 0.01)
  assert bad["p"] > 0.99 and stats.verdict(bad, bad["p_two_sided"]) == "reversed"
  assert stats.verdict(r, r["p_two_sided"]) == "supported"
  # Equal differences, tiny samples, a margin that is not positive.
  assert stats.noninferiority_t([0.0, 0.0, 0.0], 0.01)["p"] == 0.0
  assert math.isnan(stats.noninferiority_t([0.1], 0.01)["p"])
  with pytest.raises(ValueError):
    stats.noninferiority_t(d, 0.0)


def test_tost_is_the_larger_of_two_scipy_one_sided_tests():
  d = np.array([0.001, -0.002, 0.0015, 0.0005, -0.001])
  r = stats.tost(d, -0.01, 0.01)
  lo = sps.ttest_1samp(d, -0.01, alternative="greater").pvalue
  hi = sps.ttest_1samp(d, 0.01, alternative="less").pvalue
  assert (r["p_low"], r["p_high"]) == (pytest.approx(lo, rel=1e-10), pytest.approx(hi, rel=1e-10))
  assert r["p"] == pytest.approx(max(lo, hi), rel=1e-10) and r["p"] < 0.05
  # Equivalent at α exactly when the (1 - 2α) CI lies inside the bounds.
  assert -0.01 < r["ci"][0] < r["ci"][1] < 0.01
  wide = stats.tost(d * 20, -0.01, 0.01)
  assert wide["p"] > 0.05 and not (-0.01 < wide["ci"][0] and wide["ci"][1] < 0.01)
  assert math.isnan(stats.tost([0.1], -1, 1)["p"])
  with pytest.raises(ValueError):
    stats.tost(d, 0.01, -0.01)


def test_paired_t_against_a_nonzero_null():
  d = [1.0, 2.0, 3.0, 4.0, 5.5]
  assert stats.paired_t(d, null=1.0)["p"] == pytest.approx(sps.ttest_1samp(d, 1.0).pvalue)
  assert stats.paired_t(d, null=1.0)["ci"] == stats.paired_t(d)["ci"]
  assert stats.paired_t([0.2, 0.2], null=0.2)["p"] == 1.0


def test_verdicts_follow_the_numbers():
  ok = stats.paired_t([0.05, 0.06, 0.04, 0.05, 0.055])
  assert stats.verdict(ok, 0.01) == "supported"
  assert stats.verdict(stats.paired_t([-0.05, -0.06, -0.04]), 0.01) == "reversed"
  assert stats.verdict(ok, 0.2) == "not shown"
  assert stats.verdict(stats.paired_t([0.1]), math.nan) == "pending"


# --- counts --------------------------------------------------------------------------------

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


# --- resampling documents ------------------------------------------------------------------

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


def test_document_bootstrap_ci():
  tokens = np.array([100.0, 200.0, 300.0])
  # The same nats difference per token in every document: every resample gives it.
  delta = np.stack([tokens * 0.1, tokens * 0.3])          # seeds 0.1 and 0.3 nats/token
  point, lo, hi = stats.doc_bootstrap_ci(delta, tokens)
  assert point == pytest.approx(0.2 / math.log(2)) and lo == pytest.approx(hi)
  assert lo == pytest.approx(point)
  # Documents that disagree give a spread that holds the point.
  delta = np.array([[10.0, -5.0, 40.0]])
  point, lo, hi = stats.doc_bootstrap_ci(delta, tokens, n_boot=4000)
  assert lo < point < hi and point == pytest.approx(45 / 600 / math.log(2))
  with pytest.raises(ValueError, match="must be"):
    stats.doc_bootstrap_ci(np.zeros((2, 4)), tokens)


def test_document_bootstrap_ci_is_the_mean_bootstrap_in_bits():
  # One document bootstrap: the seed-mean nats of each document spread over its tokens,
  # as positions, give bootstrap_mean_ci the same resamples and the same interval in nats.
  rng = np.random.default_rng(6)
  tokens = rng.integers(1, 40, 25)
  delta_SxD = rng.normal(size=(3, 25)) * tokens
  bits = stats.doc_bootstrap_ci(delta_SxD, tokens, n_boot=700, seed=2)
  per_token = np.repeat(delta_SxD.mean(0) / tokens, tokens)
  nats = stats.bootstrap_mean_ci(per_token, np.repeat(np.arange(25), tokens), n_boot=700, seed=2)
  assert tuple(bits) == pytest.approx(tuple(np.array(nats) / math.log(2)), rel=1e-9)
  # The draws do not depend on how many are drawn at once.
  assert stats.doc_bootstrap_ci(delta_SxD, tokens, n_boot=700, seed=2, chunk=64) == bits


def test_group_bootstrap_point_strata_and_errors():
  delta = np.array([[0.1, 0.3, 0.5, 0.7], [0.3, 0.1, 0.7, 0.5]])   # seed means .2 .2 .6 .6
  groups = ["a", "a", "b", "b"]
  point, lo, hi = stats.group_bootstrap_ci(delta, groups, {"*": 1.0})
  assert point == pytest.approx(0.4) and lo <= point <= hi
  # b minus a: each stratum is constant after the seed mean, so every resample agrees.
  point, lo, hi = stats.group_bootstrap_ci(delta, groups, {"b": 1.0, "a": -1.0})
  assert point == pytest.approx(0.4) and lo == pytest.approx(0.4) and hi == pytest.approx(0.4)
  # Resampling all items together would mix the strata; the interval is then wide.
  _, lo, hi = stats.group_bootstrap_ci(delta, groups, {"*": 1.0})
  assert hi - lo > 0.1
  assert all(math.isnan(x) for x in stats.group_bootstrap_ci(delta, groups, {"c": 1.0}))
  with pytest.raises(ValueError, match=r"\[S, N\]"):
    stats.group_bootstrap_ci(delta[0], groups, {"*": 1.0})


# --- code use ------------------------------------------------------------------------------

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
