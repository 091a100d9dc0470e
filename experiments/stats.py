"""Paired statistics of the reproduction's arm comparisons, in plain numpy and math.

Two arms of one setting trained with the same seed share the backbone's init and
the data order (experiments/models/lm.py draws the memory branch after the
backbone), so a claim "arm A has lower validation loss than arm B" is tested on
the per-seed differences d_s = loss_B(s) - loss_A(s) (positive: the claim's
direction):

  paired_t        mean, sd, 95% CI and two-sided p of Student's t with n - 1
                  degrees of freedom (the CDF from the regularised incomplete beta
                  function, evaluated by its continued fraction: no scipy);
  sign_flip_p     the exact permutation test over seeds: all 2^n sign flips of the
                  d_s (two-sided; its smallest attainable p is 2 / 2^n, 0.0625 at n = 5);
  sign_test_p     the exact binomial sign test (ties dropped);
  holm            Holm's step-down adjustment over the pre-declared claim family;
  min_detectable_effect
                  the true mean difference a paired t-test of n seeds at this sd
                  detects with the given power (normal-shift approximation with t
                  quantiles of n - 1 degrees of freedom);
  doc_bootstrap_ci
                  a 95% CI of the seed-mean difference of two arms' bits per unit
                  from resampling validation DOCUMENTS (the same resample for both
                  arms and every seed), the evaluation-set uncertainty the seed
                  tests do not see.

The verdict of a claim (`verdict`) is computed from these numbers, never typed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

ALPHA = 0.05


# --- Student's t ---------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
  """The continued fraction of the incomplete beta function (modified Lentz)."""
  tiny, eps = 1e-300, 1e-15
  qab, qap, qam = a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 10_000):
    m2 = 2 * m
    aa = m * (b - m) * x / ((qam + m2) * (a + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    h *= d * c
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    delta = d * c
    h *= delta
    if abs(delta - 1.0) < eps:
      break
  return h


def betainc(a: float, b: float, x: float) -> float:
  """The regularised incomplete beta function I_x(a, b), a, b > 0, x in [0, 1]."""
  if not 0.0 <= x <= 1.0:
    raise ValueError(f"betainc: x={x} must be in [0, 1].")
  if x in (0.0, 1.0):
    return x
  log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
               + a * math.log(x) + b * math.log1p(-x))
  # The fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry otherwise.
  if x < (a + 1.0) / (a + b + 2.0):
    return math.exp(log_front) * _betacf(a, b, x) / a
  return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
  """P(T <= t) for Student's t with `df` > 0 degrees of freedom."""
  if df <= 0:
    raise ValueError(f"t_cdf: df={df} must be > 0.")
  if math.isinf(t):
    return 1.0 if t > 0 else 0.0
  tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))   # P(T > |t|)
  return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
  """The q-quantile of Student's t (bisection on `t_cdf`, to ~1e-12)."""
  if not 0.0 < q < 1.0:
    raise ValueError(f"t_ppf: q={q} must be in (0, 1).")
  if q < 0.5:
    return -t_ppf(1.0 - q, df)
  lo, hi = 0.0, 1.0
  while t_cdf(hi, df) < q:
    hi *= 2.0
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if t_cdf(mid, df) < q:
      lo = mid
    else:
      hi = mid
    if hi - lo < 1e-12 * max(1.0, hi):
      break
  return 0.5 * (lo + hi)


# --- tests over seeds ------------------------------------------------------------------------

def paired_t(diffs) -> dict:
  """{n, mean, sd, se, t, df, p, ci}: Student's paired t-test of mean(diffs) = 0, two-sided,
  with a 95% CI of the mean; p and the CI are NaN below two differences, and p is 0 or 1
  (CI a point) when every difference is equal."""
  d = np.asarray(diffs, np.float64)
  n = int(d.size)
  mean = float(d.mean()) if n else math.nan
  if n < 2:
    return {"n": n, "mean": mean, "sd": math.nan, "se": math.nan, "t": math.nan,
            "df": max(n - 1, 0), "p": math.nan, "ci": (math.nan, math.nan)}
  sd = float(d.std(ddof=1))
  se = sd / math.sqrt(n)
  df = n - 1
  if se == 0.0:
    p = 1.0 if mean == 0.0 else 0.0
    return {"n": n, "mean": mean, "sd": sd, "se": se,
            "t": 0.0 if mean == 0.0 else math.copysign(math.inf, mean), "df": df, "p": p,
            "ci": (mean, mean)}
  t = mean / se
  p = min(1.0, 2.0 * (1.0 - t_cdf(abs(t), df)))
  half = t_ppf(1.0 - ALPHA / 2.0, df) * se
  return {"n": n, "mean": mean, "sd": sd, "se": se, "t": t, "df": df, "p": p,
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
  """Exact two-sided binomial sign test of P(d > 0) = 1/2 (zero differences dropped)."""
  d = np.asarray(diffs, np.float64)
  pos, neg = int((d > 0).sum()), int((d < 0).sum())
  n = pos + neg
  if n == 0:
    return math.nan
  k = min(pos, neg)
  tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
  return min(1.0, 2.0 * tail)


def holm(pvalues) -> list[float]:
  """Holm's step-down adjusted p-values (R's p.adjust(p, "holm")); NaN entries are not
  evaluable, are not counted in the family size and stay NaN."""
  p = np.asarray(pvalues, np.float64)
  out = np.full(p.shape, np.nan)
  ok = np.flatnonzero(~np.isnan(p))
  m = ok.size
  running = 0.0
  for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
    running = max(running, min(1.0, (m - rank) * p[i]))
    out[i] = running
  return out.tolist()


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA,
                          power: float = 0.8) -> float:
  """Mean paired difference that a two-sided paired t-test of n seeds at level `alpha`
  detects with probability `power`, for differences of standard deviation `sd`:
  (t_{1-alpha/2, n-1} + t_{power, n-1}) · sd / sqrt(n). NaN below two seeds."""
  if n < 2 or not math.isfinite(sd):
    return math.nan
  df = n - 1
  return (t_ppf(1.0 - alpha / 2.0, df) + t_ppf(power, df)) * sd / math.sqrt(n)


# --- documents -----------------------------------------------------------------------------

def doc_bootstrap_ci(delta_nats_SxD, tokens_D, *, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
  """(point, lo, hi) of a paired contrast in bits per unit over the validation documents:
  `delta_nats_SxD` is, per seed s and document, the contrast of the arms' summed nats
  (e.g. nats_B - nats_A; rows are seeds, paired), `tokens_D` each document's target
  count (the same for every run of one validation set). The point is the seed mean of
  sum_D delta / sum_D tokens / ln 2; the CI is the percentile interval over resamples of
  documents with replacement, one resample shared by every seed (so the pairing stays)."""
  delta = np.asarray(delta_nats_SxD, np.float64)
  w = np.asarray(tokens_D, np.float64)
  if delta.ndim != 2 or delta.shape[1] != w.size or w.size == 0:
    raise ValueError(f"doc_bootstrap_ci: delta {delta.shape} and tokens {w.shape} must be "
                     "[S, D] and [D], D > 0.")
  delta_D = delta.mean(axis=0)
  scale = 1.0 / math.log(2.0)
  point = float(delta_D.sum() / w.sum() * scale)
  rng = np.random.default_rng(seed)
  idx_RxD = rng.integers(0, w.size, size=(resamples, w.size))
  boot = delta_D[idx_RxD].sum(axis=1) / np.maximum(w[idx_RxD].sum(axis=1), 1.0) * scale
  lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
  return point, float(lo), float(hi)


def group_bootstrap_ci(delta_SxN, groups_N, weights: dict, *, resamples: int = 2000,
                       seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
  """(point, lo, hi) of a paired contrast over evaluation items (e.g. validation scenes):
  `delta_SxN` is, per seed s and item, the arms' difference (rows are seeds, paired);
  the statistic is sum_g weights[g] · mean over the items of group g of the seed-mean
  difference (group "*" is every item), and the CI its percentile interval over resamples
  of the items with replacement within each group (stratified), one resample shared by
  every seed. NaNs when a weighted group has no item."""
  delta = np.asarray(delta_SxN, np.float64)
  groups = np.asarray(groups_N, dtype=object)
  if delta.ndim != 2 or delta.shape[1] != groups.size or groups.size == 0:
    raise ValueError(f"group_bootstrap_ci: delta {delta.shape} and groups {groups.shape} must "
                     "be [S, N] and [N], N > 0.")
  delta_N = delta.mean(axis=0)
  members = {g: (np.arange(groups.size) if g == "*" else np.flatnonzero(groups == g))
             for g in weights}
  if any(m.size == 0 for m in members.values()):
    return math.nan, math.nan, math.nan
  rng = np.random.default_rng(seed)
  point, boot = 0.0, np.zeros(resamples)
  for g, w in weights.items():
    values = delta_N[members[g]]
    point += w * float(values.mean())
    boot += w * values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
  lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
  return point, float(lo), float(hi)


# --- the verdict ---------------------------------------------------------------------------

def verdict(test: dict, holm_p: float, *, alpha: float = ALPHA) -> str:
  """The verdict of a claim from its paired t-test and Holm-adjusted p: 'supported' or
  'reversed' when holm_p < alpha (by the sign of the mean difference), else 'not shown',
  'pending' below two paired seeds."""
  if test["n"] < 2 or math.isnan(holm_p):
    return "pending"
  if holm_p < alpha:
    return "supported" if test["mean"] > 0 else "reversed"
  return "not shown"
