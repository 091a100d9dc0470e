"""Tests over seeds: paired contrasts of two arms trained with the same seeds.

The per-seed differences d_s = loss_B(s) - loss_A(s) (positive: the claim's direction) are
tested with Student's t, the exact sign-flip and sign tests, non-inferiority and TOST; the
power and minimum detectable effect of a paired t-test; a claim's verdict from its numbers.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats as sps

from experiments.analysis.stats.counts import binomial_test

ALPHA = 0.05


def paired_t(diffs, *, null: float = 0.0) -> dict:
  """{n, mean, sd, se, t, df, p, ci, null}: Student's paired t-test of mean(diffs) = `null`
  (0 unless given: a non-inferiority margin is tested as null = -margin), two-sided, with
  a 95% CI of the mean; p and the CI are NaN below two differences, and p is 0 or 1 (sd 0,
  CI a point) when every difference is equal."""
  d = np.asarray(diffs, np.float64)
  n = int(d.size)
  null = float(null)
  mean = float(d.mean()) if n else math.nan
  if n < 2:
    return {"n": n, "mean": mean, "sd": math.nan, "se": math.nan, "t": math.nan,
            "df": max(n - 1, 0), "p": math.nan, "ci": (math.nan, math.nan), "null": null}
  df = n - 1
  sd = float(d.std(ddof=1))
  # Equal differences: not only sd == 0, since their mean can round off their value.
  if sd == 0.0 or (d == d[0]).all():
    return {"n": n, "mean": mean, "sd": 0.0, "se": 0.0,
            "t": 0.0 if mean == null else math.copysign(math.inf, mean - null), "df": df,
            "p": 1.0 if mean == null else 0.0, "ci": (mean, mean), "null": null}
  se = sd / math.sqrt(n)
  t = (mean - null) / se
  p = min(1.0, 2.0 * float(sps.t.sf(abs(t), df)))
  half = float(sps.t.ppf(1.0 - ALPHA / 2.0, df)) * se
  return {"n": n, "mean": mean, "sd": sd, "se": se, "t": t, "df": df, "p": p,
          "ci": (mean - half, mean + half), "null": null}


def noninferiority_t(diffs, margin: float, *, alpha: float = ALPHA) -> dict:
  """The one-sided paired t of H1: mean(diffs) > -margin against H0: mean(diffs) <= -margin
  (diffs > 0 the claim's direction, `margin` > 0 the loss it still calls "no worse").

  Returns `paired_t(diffs, null=-margin)` with "p" the one-sided p (scipy's
  `ttest_1samp(diffs, -margin, alternative="greater")`), "p_two_sided" the two-sided p of
  mean = -margin, "margin", and "lower" the one-sided (1 - alpha) lower confidence bound
  of the mean: non-inferior at level alpha exactly when lower > -margin."""
  if not margin > 0:
    raise ValueError(f"noninferiority_t: margin={margin} must be > 0.")
  out = paired_t(diffs, null=-margin)
  out["p_two_sided"], out["margin"] = out["p"], float(margin)
  n, t = out["n"], out["t"]
  if n < 2:
    out["lower"] = math.nan
    return out
  if out["se"] == 0.0:
    out["p"] = 0.0 if out["mean"] > -margin else 1.0
    out["lower"] = out["mean"]
    return out
  out["p"] = float(sps.t.sf(t, out["df"]))
  out["lower"] = out["mean"] - float(sps.t.ppf(1.0 - alpha, out["df"])) * out["se"]
  return out


def tost(diffs, low: float, high: float, *, alpha: float = ALPHA) -> dict:
  """Equivalence by two one-sided paired t-tests (Schuirmann's TOST): H1: low < mean(diffs)
  < high. {n, mean, sd, se, df, p_low (H0: mean <= low), p_high (H0: mean >= high), p (the
  larger: equivalent at level alpha when p < alpha), ci (the (1 - 2 alpha) CI: inside
  (low, high) exactly when p < alpha)}; NaN below two differences."""
  if not low < high:
    raise ValueError(f"tost: need low < high, got {low} and {high}.")
  base = paired_t(diffs)
  n, df, se, mean = base["n"], base["df"], base["se"], base["mean"]
  out = {"n": n, "mean": mean, "sd": base["sd"], "se": se, "df": df, "low": float(low),
         "high": float(high)}
  if n < 2:
    return {**out, "p_low": math.nan, "p_high": math.nan, "p": math.nan,
            "ci": (math.nan, math.nan)}
  if se == 0.0:
    p_low, p_high = float(not mean > low), float(not mean < high)
    half = 0.0
  else:
    p_low = float(sps.t.sf((mean - low) / se, df))
    p_high = float(sps.t.cdf((mean - high) / se, df))
    half = float(sps.t.ppf(1.0 - alpha, df)) * se
  return {**out, "p_low": p_low, "p_high": p_high, "p": max(p_low, p_high),
          "ci": (mean - half, mean + half)}


def sign_flip_p(diffs) -> float:
  """Exact two-sided permutation p over all 2^n sign flips of the paired differences:
  the share of flips whose |mean| reaches the observed one (ties count). NaN for none."""
  d = np.asarray(diffs, np.float64)
  n = d.size
  if n == 0:
    return math.nan
  if n > 20:
    raise ValueError(f"sign_flip_p: n={n} > 20 would enumerate 2^{n} flips.")
  signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))   # [2^n, n]
  means = np.abs(signs @ d) / n
  observed = abs(d.mean())
  return float(np.mean(means >= observed - 1e-12 * max(1.0, observed)))


def min_flip_p(n: int) -> float:
  """The smallest p `sign_flip_p` can give with n differences (all flips distinct)."""
  return 2.0 / 2.0 ** n if n else math.nan


def sign_test_p(diffs) -> float:
  """Exact two-sided binomial sign test of P(d > 0) = 1/2 (zero differences dropped):
  `binomial_test` of the positive differences at p0 = 1/2. NaN when every d is 0."""
  d = np.asarray(diffs, np.float64)
  pos, neg = int((d > 0).sum()), int((d < 0).sum())
  return float(binomial_test(pos, pos + neg, 0.5).p_value)


def _t_critical(alpha: float, df: int, alternative: str) -> float:
  if alternative == "two-sided":
    return float(sps.t.ppf(1.0 - alpha / 2.0, df))
  if alternative == "greater":
    return float(sps.t.ppf(1.0 - alpha, df))
  raise ValueError(f"alternative={alternative!r}; use 'two-sided' or 'greater'.")


def t_power(effect: float, sd: float, n: int, alpha: float = ALPHA, *,
            alternative: str = "two-sided") -> float:
  """Power of a paired t-test of n seeds at level `alpha` when the differences' true mean
  is `effect` and their sd `sd`: P(reject) under the noncentral t of n - 1 degrees of
  freedom and noncentrality effect · sqrt(n) / sd. "two-sided" rejects |t| above
  t_{1-alpha/2} (either direction), "greater" t above t_{1-alpha}. NaN below two seeds."""
  if n < 2 or not math.isfinite(sd) or sd <= 0:
    return math.nan
  df = n - 1
  crit = _t_critical(alpha, df, alternative)
  nc = effect * math.sqrt(n) / sd
  power = float(sps.nct.sf(crit, df, nc))
  if alternative == "two-sided":
    # P(T < -crit) as P(T' > crit) under -nc: scipy's nct.cdf returns NaN deep in the
    # lower tail, its sf does not (the two agree wherever both are finite).
    power += float(sps.nct.sf(crit, df, -nc))
  return power


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA,
                          power: float = 0.8, *, alternative: str = "two-sided") -> float:
  """Mean paired difference that a paired t-test of n seeds at level `alpha` (two-sided,
  as the verdicts test; `alternative="greater"` for a one-sided test) detects with
  probability `power`, for differences of standard deviation `sd`: the effect δ ≥ 0 at
  which `t_power(δ, sd, n, alpha)` equals `power`, solved on the noncentral t. (The
  normal-shift shortcut (t_{1-alpha/2} + t_{power}) · sd / sqrt(n) is 9-17% smaller at
  n = 5-3 and alpha = 0.05/21, where its "80%" is 67-71%.) 0 when `power` is at most the
  test's size or sd is 0; NaN below two seeds."""
  if n < 2 or not math.isfinite(sd):
    return math.nan
  if not 0.0 < power < 1.0:
    raise ValueError(f"min_detectable_effect: power={power} must be in (0, 1).")
  if sd == 0.0:
    return 0.0
  from scipy.optimize import brentq

  df = n - 1
  if power <= t_power(0.0, 1.0, n, alpha, alternative=alternative):
    return 0.0
  # In units of sd: the normal-shift value lies below the root; widen until power passes.
  crit = _t_critical(alpha, df, alternative)
  hi = max(1.0, 2.0 * (crit + float(sps.norm.ppf(power))) / math.sqrt(n))
  while t_power(hi, 1.0, n, alpha, alternative=alternative) < power:
    hi *= 2.0
  effect = brentq(lambda x: t_power(x, 1.0, n, alpha, alternative=alternative) - power,
                  0.0, hi, xtol=1e-12, rtol=1e-12, maxiter=500)
  return float(effect) * sd


def verdict(test: dict, holm_p: float, *, alpha: float = ALPHA) -> str:
  """The verdict of a claim from its paired t-test and Holm-adjusted p: 'supported' or
  'reversed' when holm_p < alpha (by the side of the test's null the mean difference lies
  on: 0, or -margin for a non-inferiority claim, where 'reversed' reads "worse by more
  than the margin"), else 'not shown', 'pending' below two paired seeds."""
  if test["n"] < 2 or math.isnan(holm_p):
    return "pending"
  if holm_p < alpha:
    return "supported" if test["mean"] > test.get("null", 0.0) else "reversed"
  return "not shown"
