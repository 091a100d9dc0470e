"""experiments.stats: the t distribution, the tests over seeds, Holm, MDE, the document
bootstrap, on hand-computable cases and published values."""

import math

import numpy as np
import pytest

from experiments import stats


@pytest.mark.parametrize("t, df, want", [
    (0.0, 3, 0.5), (1.0, 1, 0.75),                   # Cauchy: 1/2 + atan(t)/pi
    (2.0, 4, 0.9419417382415922),                    # scipy.stats.t.cdf(2, 4)
    (-2.5, 10, 0.01572342211830441),               # scipy.stats.t.cdf(-2.5, 10)
    (1.5, 2, 1 / 2 + 1.5 / (2 * math.sqrt(2 + 1.5 ** 2))),   # closed form at df = 2
])
def test_t_cdf_known_values(t, df, want):
  assert stats.t_cdf(t, df) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("q, df, want", [
    (0.975, 1, 12.706204736174694), (0.975, 4, 2.7764451051977987),
    (0.975, 29, 2.045229642132703), (0.8, 4, 0.9409645772), (0.5, 7, 0.0)])
def test_t_ppf_is_the_inverse_and_matches_tables(q, df, want):
  got = stats.t_ppf(q, df)
  assert got == pytest.approx(want, abs=1e-9)
  assert stats.t_cdf(got, df) == pytest.approx(q, abs=1e-12)
  assert stats.t_ppf(1 - q, df) == pytest.approx(-got, abs=1e-9)


def test_betainc_hand_cases():
  # I_x(1, 1) = x; I_x(2, 3) = 6x^2/2 - 8x^3/3 + 3x^4/4 ... = sum form: 0.5248 at x = 0.4.
  assert stats.betainc(1, 1, 0.3) == pytest.approx(0.3, abs=1e-14)
  assert stats.betainc(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-12)
  assert stats.betainc(3, 2, 0.6) == pytest.approx(1 - stats.betainc(2, 3, 0.4), abs=1e-12)


def test_paired_t_by_hand():
  d = [1.0, 2.0, 3.0, 4.0, 5.5]
  r = stats.paired_t(d)
  sd = np.std(d, ddof=1)
  assert (r["n"], r["df"]) == (5, 4) and r["mean"] == pytest.approx(3.1)
  assert r["t"] == pytest.approx(3.1 / (sd / math.sqrt(5)))
  assert r["p"] == pytest.approx(2 * (1 - stats.t_cdf(r["t"], 4)))
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


def test_holm_matches_r_and_skips_nan():
  # p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02
  assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
  got = stats.holm([0.01, math.nan, 0.02])
  assert got[0] == pytest.approx(0.02) and math.isnan(got[1]) and got[2] == pytest.approx(0.02)
  assert stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])   # capped at 1, monotone


def test_minimum_detectable_effect():
  want = (2.7764451051977987 + 0.9409645772) * 0.02 / math.sqrt(5)
  assert stats.min_detectable_effect(0.02, 5) == pytest.approx(want, rel=1e-8)
  assert stats.min_detectable_effect(0.02, 5, alpha=0.0025) > want
  assert math.isnan(stats.min_detectable_effect(0.02, 1))


def test_document_bootstrap_ci():
  tokens = np.array([100.0, 200.0, 300.0])
  # The same nats difference per token in every document: every resample gives it.
  delta = np.stack([tokens * 0.1, tokens * 0.3])          # seeds 0.1 and 0.3 nats/token
  point, lo, hi = stats.doc_bootstrap_ci(delta, tokens)
  assert point == pytest.approx(0.2 / math.log(2)) and lo == pytest.approx(hi)
  assert lo == pytest.approx(point)
  # Documents that disagree give a spread that holds the point.
  delta = np.array([[10.0, -5.0, 40.0]])
  point, lo, hi = stats.doc_bootstrap_ci(delta, tokens, resamples=4000)
  assert lo < point < hi and point == pytest.approx(45 / 600 / math.log(2))
  with pytest.raises(ValueError, match="must be"):
    stats.doc_bootstrap_ci(np.zeros((2, 4)), tokens)


def test_verdicts_follow_the_numbers():
  ok = stats.paired_t([0.05, 0.06, 0.04, 0.05, 0.055])
  assert stats.verdict(ok, 0.01) == "supported"
  assert stats.verdict(stats.paired_t([-0.05, -0.06, -0.04]), 0.01) == "reversed"
  assert stats.verdict(ok, 0.2) == "not shown"
  assert stats.verdict(stats.paired_t([0.1]), math.nan) == "pending"
