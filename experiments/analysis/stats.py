"""Statistics for the Lngram ID analyses: AP, multiple testing, intervals, code use.

Everything here is plain numpy/scipy on arrays already collected; none of it
knows about models. The analyses of "Lngram v2: Latent N-Gram Memory with
Interpretable Discrete Representations" (§3, App. B, App. C) are built on these:

  average_precision   AP per concept, ties grouped as sklearn's
                      `average_precision_score` groups them (one threshold per
                      distinct score), so KNN share scores (k/K, many ties) are
                      not ranked by an arbitrary order inside a tie.
  bh_adjust           Benjamini–Hochberg adjusted p-values (`p.adjust(p, "BH")`).
  permutation_p       Monte-Carlo p = (1 + #{null >= observed}) / (1 + n), never 0;
                      `permutation_p_interval` bounds the p an infinite number of
                      permutations would give.
  bootstrap_mean_ci   percentile CI of a mean over positions, resampling whole
                      documents (positions of one file are not independent).
  binomial_test       exact two-sided test of k successes in n against a fixed rate
                      p0, with the Clopper–Pearson interval of the rate.
  code_utilisation    per-route N_eff = exp(H), H / log K, top-code share, dead codes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as sps


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
  estimate_V = sums_DxV.sum(0) / sizes_D.sum()
  rng = np.random.default_rng(seed)
  means = []
  for lo in range(0, n_boot, chunk):
    b = min(chunk, n_boot - lo)
    draw_BxD = rng.integers(0, D, size=(b, D))
    means.append(sums_DxV[draw_BxD].sum(1) / sizes_D[draw_BxD].sum(1)[:, None])
  means_BxV = np.concatenate(means)
  a = (1 - level) / 2
  lo_V, hi_V = np.quantile(means_BxV, [a, 1 - a], axis=0)
  if one_d:
    return Interval(float(estimate_V[0]), float(lo_V[0]), float(hi_V[0]))
  return Interval(estimate_V, lo_V, hi_V)


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
