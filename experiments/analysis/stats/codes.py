"""Code use: entropy, N_eff = exp(H), top-code share and dead codes of the IDs."""

from __future__ import annotations

import numpy as np


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
