"""Tests of counts: Monte-Carlo permutation p-values, the exact binomial test and the
Clopper–Pearson interval of a rate."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as sps


def permutation_p(observed, null) -> float:
  """Monte-Carlo p of `observed` against `null` draws (larger = more extreme).

  p = (1 + #{null >= observed}) / (1 + n): the observed labelling counts as one
  of the permutations, so p >= 1 / (n + 1) (1/501 with 500 permutations).
  """
  null = np.asarray(null, np.float64).reshape(-1)
  if null.size == 0:
    raise ValueError("permutation_p: no null draws.")
  return float((1 + np.sum(null >= observed)) / (1 + null.size))


def permutation_p_interval(observed, null, level: float = 0.95) -> tuple[float, float]:
  """Clopper–Pearson bounds on the exact permutation p from n Monte-Carlo draws.

  #{null >= observed} ~ Binomial(n, p); with zero exceedances out of 500 the
  upper bound is ~0.0074, so "p = 1/501" means "p < 0.0074" at 95%.
  """
  null = np.asarray(null, np.float64).reshape(-1)
  lo, hi = clopper_pearson(np.sum(null >= observed), null.size, level)
  return float(lo), float(hi)


def clopper_pearson(k, n, level: float = 0.95):
  """Exact (Clopper–Pearson) interval (lo, hi) for a binomial rate k / n.

  Arrays broadcast; NaN where n == 0.
  """
  k = np.asarray(k, np.float64)
  n = np.asarray(n, np.float64)
  a = (1 - level) / 2
  with np.errstate(invalid="ignore", divide="ignore"):
    lo = np.where(k > 0, sps.beta.ppf(a, k, n - k + 1), 0.0)
    hi = np.where(k < n, sps.beta.ppf(1 - a, k + 1, n - k), 1.0)
  bad = n <= 0
  return np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)


class BinomialTest(NamedTuple):
  """Result of `binomial_test`; arrays broadcast like the inputs (floats for scalars)."""
  rate: np.ndarray      # k / n
  p_value: np.ndarray
  lo: np.ndarray        # Clopper–Pearson bounds of the rate
  hi: np.ndarray


def binomial_test(k, n, p0, *, level: float = 0.95,
                  alternative: str = "two-sided") -> BinomialTest:
  """Exact binomial test of k successes in n trials against a FIXED rate p0.

  Vectorised over arrays (thousands of candidate associations at once).
  Two-sided p is twice the smaller tail (capped at 1): the test that the
  Clopper–Pearson interval inverts, so p < 1 - level exactly when the interval
  excludes p0 (scipy's `binomtest` sums the less likely outcomes instead; the two
  agree for p0 = 1/2). "greater"/"less" are the one-sided tails, for a test in a
  direction fixed beforehand. The interval of Δ = rate - p0 is (lo - p0, hi - p0).
  NaN where n == 0.
  """
  k = np.asarray(k, np.float64)
  n = np.asarray(n, np.float64)
  p0 = np.asarray(p0, np.float64)
  if ((k < 0) | (k > n)).any():
    raise ValueError("binomial_test: need 0 <= k <= n.")
  with np.errstate(invalid="ignore", divide="ignore"):
    upper = sps.binom.sf(k - 1, n, p0)  # P(X >= k)
    lower = sps.binom.cdf(k, n, p0)     # P(X <= k)
    rate = k / n
  if alternative == "two-sided":
    p_value = np.minimum(1.0, 2 * np.minimum(upper, lower))
  elif alternative == "greater":
    p_value = upper
  elif alternative == "less":
    p_value = lower
  else:
    raise ValueError(f"binomial_test: alternative={alternative!r}; use 'two-sided', "
                     "'greater' or 'less'.")
  lo, hi = clopper_pearson(k, n, level)
  p_value = np.where(n > 0, p_value, np.nan)
  return BinomialTest(*(_scalar(np.asarray(a, np.float64)) for a in (rate, p_value, lo, hi)))


def _scalar(a: np.ndarray):
  """0-d arrays as Python floats (JSON-able), other arrays unchanged."""
  return float(a) if a.ndim == 0 else a
