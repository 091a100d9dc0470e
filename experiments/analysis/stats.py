"""Statistics of the Lngram analyses and of the reproduction's report, in numpy and scipy.

Everything here works on arrays already collected; none of it knows about models.
Distributions (Student's t, the binomial, the beta of Clopper–Pearson) are scipy's. The
analyses of "Lngram v2: Latent N-Gram Memory with Interpretable Discrete Representations"
(§3, App. B, App. C; `lngram-exp analyze`) and the verdicts of the reproduction's report
(`python -m experiments.tools.report`) are built on these.

Ranking and multiple testing:

  average_precision   AP per concept, ties grouped as sklearn's
                      `average_precision_score` groups them (one threshold per
                      distinct score), so KNN share scores (k/K, many ties) are
                      not ranked by an arbitrary order inside a tie.
  bh_adjust           Benjamini–Hochberg adjusted p-values (`p.adjust(p, "BH")`).
  holm                Holm's step-down adjusted p-values (`p.adjust(p, "holm")`), over a
                      pre-declared claim family.

Tests over seeds. Two arms of one setting trained with the same seed share the
backbone's init and the data order (experiments/models/lm.py draws the memory branch
after the backbone), so a claim "arm A has lower validation loss than arm B" is tested
on the per-seed differences d_s = loss_B(s) - loss_A(s) (positive: the claim's direction):

  paired_t            mean, sd, 95% CI and two-sided p of Student's t with n - 1
                      degrees of freedom;
  sign_flip_p         the exact permutation test over seeds: all 2^n sign flips of the
                      d_s (two-sided; its smallest attainable p, `min_flip_p`, is 2 / 2^n,
                      0.0625 at n = 5);
  sign_test_p         the exact binomial sign test (ties dropped);
  t_power             the exact power of a (paired) t-test of n seeds at a true mean
                      difference and sd: the noncentral t of n - 1 degrees of freedom;
  min_detectable_effect
                      the true mean difference a paired t-test of n seeds at this sd
                      detects with the given power (the noncentral t solved exactly; the
                      normal-shift shortcut t_{1-a/2} + t_{power} it replaces is 9-17%
                      smaller at n = 5-3 and α = 0.05/21, where its "80%" is 67-71%);
  noninferiority_t    the one-sided paired t of mean(diffs) > -margin ("matches or beats",
                      "is not worse than": a claim of no loss beyond a declared margin);
  tost                equivalence by two one-sided tests: low < mean(diffs) < high;
  verdict             a claim's verdict, computed from these numbers, never typed.

Counts:

  permutation_p       Monte-Carlo p = (1 + #{null >= observed}) / (1 + n), never 0;
                      `permutation_p_interval` bounds the p an infinite number of
                      permutations would give.
  binomial_test       exact two-sided test of k successes in n against a fixed rate
                      p0, with the Clopper–Pearson interval of the rate.

Resampling documents (positions of one document, or the tokens of one validation
document, are not independent; one percentile bootstrap over documents serves both):

  bootstrap_mean_ci   CI of a mean over positions, resampling whole documents.
  doc_bootstrap_ci    CI of the seed-mean difference of two arms' bits per unit,
                      resampling validation DOCUMENTS (one resample for both arms and
                      every seed): the evaluation-set uncertainty the seed tests do not see.
  group_bootstrap_ci  CI of a weighted contrast over evaluation items (e.g. validation
                      scenes), resampled within their groups.

Code use:

  code_utilisation    per-route N_eff = exp(H), H / log K, top-code share, dead codes.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
from scipy import stats as sps

ALPHA = 0.05


# --- ranking and multiple testing ----------------------------------------------------------

def average_precision(scores, labels) -> np.ndarray | float:
  """Average precision of `scores` for binary `labels`, as sklearn computes it.

  AP = sum_n (R_n - R_{n-1}) P_n over the distinct score thresholds, highest
  first; positions with equal scores enter together.

  Parameters
  ----------
  scores : float [P] or [P, Z]; higher means "more likely positive".
  labels : bool [P] or [P, Z], same shape.

  Returns
  -------
  float (1-D input) or float64 [Z]: NaN where a column has no positive (AP is
  undefined there; sklearn warns and returns 0 — use `np.nanmean` over concepts).
  """
  scores = np.asarray(scores, np.float64)
  labels = np.asarray(labels, bool)
  if scores.shape != labels.shape:
    raise ValueError(f"average_precision: scores {scores.shape} != labels {labels.shape}.")
  if np.isnan(scores).any():
    raise ValueError("average_precision: scores contain NaN.")
  one_d = scores.ndim == 1
  scores_PxZ = scores[:, None] if one_d else scores
  labels_PxZ = labels[:, None] if one_d else labels
  P, Z = scores_PxZ.shape
  if P == 0:
    ap_Z = np.full(Z, np.nan)
    return float(ap_Z[0]) if one_d else ap_Z
  # Descending, stable: the order inside a tie does not matter below, only
  # where each tie group ends.
  order_PxZ = np.argsort(-scores_PxZ, axis=0, kind="stable")
  s_PxZ = np.take_along_axis(scores_PxZ, order_PxZ, axis=0)
  y_PxZ = np.take_along_axis(labels_PxZ, order_PxZ, axis=0)
  tp_PxZ = np.cumsum(y_PxZ, axis=0)
  # A tie group ends where the next score differs (or at the last row).
  ends_PxZ = np.ones((P, Z), bool)
  ends_PxZ[:-1] = s_PxZ[:-1] != s_PxZ[1:]
  # Each row's group end: the nearest end at or after it (reverse running min).
  rows = np.arange(P)[:, None]
  end_idx_PxZ = np.where(ends_PxZ, rows, P)
  end_idx_PxZ = np.minimum.accumulate(end_idx_PxZ[::-1], axis=0)[::-1]
  precision_PxZ = np.take_along_axis(tp_PxZ, end_idx_PxZ, axis=0) / (end_idx_PxZ + 1)
  # Each positive adds 1/npos recall at its group's precision.
  npos_Z = y_PxZ.sum(axis=0)
  with np.errstate(invalid="ignore", divide="ignore"):
    ap_Z = np.where(y_PxZ, precision_PxZ, 0.0).sum(axis=0) / npos_Z
  ap_Z = np.where(npos_Z > 0, ap_Z, np.nan)
  return float(ap_Z[0]) if one_d else ap_Z


def bh_adjust(p) -> np.ndarray:
  """Benjamini–Hochberg adjusted p-values (R's `p.adjust(p, "BH")`).

  q_(i) = min_{j >= i} min(1, m p_(j) / j) over the sorted p. NaN entries are
  left NaN and do not count in m (they are not evaluable tests). Reject at FDR q
  where the adjusted value is <= q.
  """
  p = np.asarray(p, np.float64)
  out = np.full(p.shape, np.nan)
  flat = p.reshape(-1)
  finite = np.flatnonzero(~np.isnan(flat))
  m = finite.size
  if m == 0:
    return out
  if (flat[finite] < 0).any() or (flat[finite] > 1).any():
    raise ValueError("bh_adjust: p-values must lie in [0, 1].")
  order = finite[np.argsort(flat[finite], kind="stable")]
  scaled = flat[order] * m / np.arange(1, m + 1)
  adjusted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
  out_flat = out.reshape(-1)
  out_flat[order] = adjusted
  return out_flat.reshape(p.shape)


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


# --- tests over seeds ----------------------------------------------------------------------

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


# --- counts --------------------------------------------------------------------------------

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


# --- resampling documents ------------------------------------------------------------------

class Interval(NamedTuple):
  """A point estimate with its interval (`._asdict()` for JSON)."""
  estimate: float | np.ndarray
  lo: float | np.ndarray
  hi: float | np.ndarray


def bootstrap_mean_ci(values, docs, *, n_boot: int = 10_000, level: float = 0.95,
                      seed: int = 0, chunk: int = 500) -> Interval:
  """Mean of per-position `values` with a document-level percentile bootstrap CI.

  Each resample draws as many documents as there are, with replacement, and
  takes the mean over all their positions (a ratio of document sums to document
  sizes), so large documents weigh as much as their positions do.

  Parameters
  ----------
  values : float [P] or [P, V] (V statistics share the same resamples).
  docs : [P] document of each position (any values; equal means same document).
  n_boot, level, seed : resamples, interval coverage, numpy seed (fixed: reruns agree).
  chunk : resamples drawn at once (memory ~ chunk * n_docs * V).
  """
  values = np.asarray(values, np.float64)
  one_d = values.ndim == 1
  values_PxV = values[:, None] if one_d else values
  _, doc_P = np.unique(np.asarray(docs), return_inverse=True)
  doc_P = doc_P.reshape(-1)
  if doc_P.size != values_PxV.shape[0]:
    raise ValueError("bootstrap_mean_ci: values and docs differ in length.")
  if doc_P.size == 0:
    raise ValueError("bootstrap_mean_ci: no positions.")
  D = int(doc_P.max()) + 1
  sums_DxV = np.zeros((D, values_PxV.shape[1]))
  np.add.at(sums_DxV, doc_P, values_PxV)
  sizes_D = np.bincount(doc_P, minlength=D).astype(np.float64)
  estimate_V, lo_V, hi_V = _document_bootstrap(sums_DxV, sizes_D, n_boot=n_boot, level=level,
                                               seed=seed, chunk=chunk)
  if one_d:
    return Interval(float(estimate_V[0]), float(lo_V[0]), float(hi_V[0]))
  return Interval(estimate_V, lo_V, hi_V)


def doc_bootstrap_ci(delta_nats_SxD, tokens_D, *, n_boot: int = 2000, seed: int = 0,
                     level: float = 0.95, chunk: int = 500) -> Interval:
  """(point, lo, hi) of a paired contrast in bits per unit over the validation documents.

  `delta_nats_SxD` is, per seed s and document, the contrast of the arms' summed nats
  (e.g. nats_B - nats_A; rows are seeds, paired), `tokens_D` each document's target
  count (the same for every run of one validation set). The point is the seed mean of
  sum_D delta / sum_D tokens / ln 2; the CI is `bootstrap_mean_ci`'s document bootstrap of
  that ratio, one resample of documents shared by every seed (so the pairing stays).
  """
  delta = np.asarray(delta_nats_SxD, np.float64)
  w = np.asarray(tokens_D, np.float64)
  if delta.ndim != 2 or delta.shape[1] != w.size or w.size == 0:
    raise ValueError(f"doc_bootstrap_ci: delta {delta.shape} and tokens {w.shape} must be "
                     "[S, D] and [D], D > 0.")
  point, lo, hi = _document_bootstrap(delta.mean(axis=0), w, n_boot=n_boot, level=level,
                                      seed=seed, chunk=chunk, scale=1.0 / math.log(2.0))
  return Interval(float(point), float(lo), float(hi))


def _document_bootstrap(sums_D, sizes_D, *, n_boot: int, level: float, seed: int, chunk: int,
                        scale: float = 1.0):
  """The document bootstrap of a ratio: (estimate, lo, hi) of scale · sum_D sums / sum_D
  sizes and its percentile interval over `n_boot` resamples of the D documents with
  replacement (drawn `chunk` at a time; the draws do not depend on `chunk`).

  `sums_D` is [D] or [D, V] (V ratios over the same resamples, results [V]), `sizes_D` [D]
  each document's weight (positions, tokens). A resample whose sizes sum below 1 (empty
  documents only) divides by 1.
  """
  D = sizes_D.size
  estimate = sums_D.sum(0) / sizes_D.sum() * scale
  rng = np.random.default_rng(seed)
  ratios = []
  for start in range(0, n_boot, chunk):
    draw_BxD = rng.integers(0, D, size=(min(chunk, n_boot - start), D))
    size_B = np.maximum(sizes_D[draw_BxD].sum(1), 1.0)
    ratios.append(sums_D[draw_BxD].sum(1) / size_B.reshape(-1, *[1] * (sums_D.ndim - 1))
                  * scale)
  a = (1 - level) / 2
  lo, hi = np.quantile(np.concatenate(ratios), [a, 1 - a], axis=0)
  return estimate, lo, hi


def group_bootstrap_ci(delta_SxN, groups_N, weights: dict, *, n_boot: int = 2000,
                       seed: int = 0, level: float = 0.95) -> Interval:
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
    return Interval(math.nan, math.nan, math.nan)
  rng = np.random.default_rng(seed)
  point, boot = 0.0, np.zeros(n_boot)
  for g, w in weights.items():
    values = delta_N[members[g]]
    point += w * float(values.mean())
    boot += w * values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
  lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
  return Interval(point, float(lo), float(hi))


# --- code use ------------------------------------------------------------------------------

def histogram_stats(counts_RxK) -> dict:
  """N_eff = exp(H), H / log K and the top-code share of each row's histogram.

  H is the natural-log entropy of the row's empirical distribution (0 log 0 = 0).
  Rows with no counts give NaN.
  """
  counts_RxK = np.asarray(counts_RxK, np.float64)
  K = counts_RxK.shape[-1]
  total_R = counts_RxK.sum(-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    p_RxK = counts_RxK / total_R[..., None]
    plogp = np.where(p_RxK > 0, p_RxK * np.log(np.where(p_RxK > 0, p_RxK, 1.0)), 0.0)
    entropy_R = np.where(total_R > 0, -plogp.sum(-1), np.nan)
    top_R = np.where(total_R > 0, counts_RxK.max(-1) / total_R, np.nan)
  return {
      "entropy": entropy_R,
      "n_eff": np.exp(entropy_R),
      "normalised_entropy": entropy_R / np.log(K) if K > 1 else np.zeros_like(entropy_R),
      "top_freq": top_R,
  }


def code_utilisation(codes_PxR, K: int) -> dict:
  """Table 9 / C.1 statistics of one layer's codes over P positions.

  Parameters
  ----------
  codes_PxR : int codes in [0, K).
  K : codes per route (2**bits).

  Returns
  -------
  dict of numpy arrays per route ([R]: "n_eff", "normalised_entropy", "top_freq",
  "entropy", "dead" — codes never used on that route) and route means
  ("mean_n_eff", "mean_normalised_entropy", "mean_top_freq" as floats), plus
  "dead_codes" (int, over all R*K), "total_codes" (R*K), "counts" [R, K].
  """
  codes_PxR = np.asarray(codes_PxR)
  if codes_PxR.ndim != 2:
    raise ValueError(f"code_utilisation: codes must be [P, R], got {codes_PxR.shape}.")
  if codes_PxR.size and (codes_PxR.min() < 0 or codes_PxR.max() >= K):
    raise ValueError(f"code_utilisation: codes outside [0, {K}).")
  P, R = codes_PxR.shape
  flat = (codes_PxR.astype(np.int64) + K * np.arange(R)).reshape(-1)
  counts_RxK = np.bincount(flat, minlength=R * K).reshape(R, K)
  out = histogram_stats(counts_RxK)
  out["dead"] = (counts_RxK == 0).sum(-1)
  out["counts"] = counts_RxK
  out["dead_codes"] = int(out["dead"].sum())
  out["total_codes"] = R * K
  for key in ("n_eff", "normalised_entropy", "top_freq"):
    out[f"mean_{key}"] = float(np.mean(out[key])) if R else float("nan")
  return out
