"""Document-bootstrap CIs of the excess AP retained (rho), against the nuisance and the
best surface reader (`id_readers.id_knn`, DESIGN.md §9.3).

A resample draws the held-out query FILES with replacement; a query then enters
with the multiplicity of its file. Every reader's mean AP is recomputed on the
resample, then the best surface reader, rho = (AP_ID - AP_N) / (AP_H - AP_N) and
rho_surface = (AP_ID - AP_S) / (AP_H - AP_S).

Fast path (`bootstrap_rho`): the scores of a reader never change between
resamples, only the multiplicities do, so each (reader, level) is sorted once
and every resample's AP is a weighted cumulative sum over that order, for a
chunk of resamples at once: AP = Σ_positives w·P(group) / Σ w·y with P(group) =
(Σ w·y) / (Σ w) up to the end of the tie group, which is what
`stats.average_precision` gives on the resample with its rows repeated (equal
scores form one group). `bootstrap_rho_reference` rebuilds every resample
explicitly and calls the readers' own AP: the slow twin the tests compare with.
"""

from __future__ import annotations

import numpy as np

from experiments.analysis import stats

SURFACE_READERS = ("surface", "surface_byte")


def _rho(ap_reader, ap_h, ap_n):
  """Elementwise (AP_reader - AP_N) / (AP_H - AP_N); NaN where H does not beat N."""
  ap_reader, ap_h, ap_n = (np.asarray(a, np.float64) for a in (ap_reader, ap_h, ap_n))
  denom = ap_h - ap_n
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denom > 0, (ap_reader - ap_n) / denom, np.nan)


def _resample_counts(query_docs_Q, n_boot: int, seed: int) -> np.ndarray:
  """int [n_boot, Q]: each query's multiplicity (its file's draws) per resample."""
  docs = np.asarray(query_docs_Q)
  _, inv = np.unique(docs, return_inverse=True)
  inv = inv.reshape(-1)
  n_docs = int(inv.max()) + 1 if inv.size else 0
  rng = np.random.default_rng([seed, 4])
  picks_BxD = rng.integers(0, n_docs, (n_boot, n_docs))
  file_counts = np.stack([np.bincount(p, minlength=n_docs) for p in picks_BxD])
  return file_counts[:, inv]


class _SortedReader:
  """One reader's scores on one level, sorted once: the weighted mean AP of any resample."""

  def __init__(self, scores_QxZ, labels_QxZ):
    s = np.asarray(scores_QxZ, np.float64)
    y = np.asarray(labels_QxZ, bool)
    Q, _ = s.shape
    self.order_QxZ = np.argsort(-s, axis=0, kind="stable")
    s_sorted = np.take_along_axis(s, self.order_QxZ, axis=0)
    # float32: multiplicities are small integers, so the cumulative sums stay exact.
    self.y_sorted = np.take_along_axis(y, self.order_QxZ, axis=0).astype(np.float32)
    ends = np.ones(s.shape, bool)
    ends[:-1] = s_sorted[:-1] != s_sorted[1:]
    end_idx = np.where(ends, np.arange(Q)[:, None], Q)
    self.end_idx_QxZ = np.minimum.accumulate(end_idx[::-1], axis=0)[::-1]

  def mean_ap(self, w_BxQ: np.ndarray) -> np.ndarray:
    """float [B]: the mean AP over the concepts evaluable in each resample (NaN: none)."""
    w = np.asarray(w_BxQ, np.float32)[:, self.order_QxZ]            # [B, Q, Z]
    wy = w * self.y_sorted[None]
    tp = np.cumsum(wy, axis=1)
    n = np.cumsum(w, axis=1)
    idx = np.broadcast_to(self.end_idx_QxZ[None], w.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
      precision = np.take_along_axis(tp, idx, axis=1) / np.take_along_axis(n, idx, axis=1)
      npos = tp[:, -1]
      ap_BxZ = (wy * np.nan_to_num(precision)).sum(axis=1, dtype=np.float64) / npos
    ok = (npos > 0) & (n[:, -1] - npos > 0)   # a positive and a negative in the resample
    ap_BxZ = np.where(ok, ap_BxZ, np.nan)
    counts = ok.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(counts > 0, np.nansum(ap_BxZ, axis=1) / counts, np.nan)


def _summary(draws: dict, n_boot: int, level: float) -> dict:
  a = (1 - level) / 2
  out = {}
  for lv, d in draws.items():
    out[lv] = {}
    for key, values in d.items():
      v = np.asarray(values, np.float64)
      v = v[np.isfinite(v)]
      # NaN draws (H not above the baseline in that resample) are left out and counted.
      out[lv][key] = ([float(np.quantile(v, a)), float(np.quantile(v, 1 - a))] if v.size
                      else [float("nan")] * 2)
      out[lv][f"{key}_undefined"] = int(n_boot - v.size)
  return out


def _rhos(ap: dict) -> tuple:
  """(rho, rho_surface) of per-reader mean APs (scalars or arrays over resamples)."""
  best = np.fmax(*(np.asarray(ap[r], np.float64) for r in SURFACE_READERS))
  return (_rho(ap["ID"], ap["H_model"], ap["nuisance"]), _rho(ap["ID"], ap["H_model"], best))


def bootstrap_rho(scores: dict, labels: dict, query_docs_Q, *, n_boot: int, seed: int,
                  level: float = 0.95, chunk: int = 32) -> dict:
  """level -> {"rho": [lo, hi], "rho_surface": [lo, hi], "<key>_undefined": n}.

  `scores`: reader -> level -> float [Q, Z] (H_model, nuisance, ID and the surface
  readers at least); `labels`: level -> (names, bool [Q, Z]); `query_docs_Q`: the
  file of each query. `chunk` resamples are computed at once (memory B·Q·Z floats).
  """
  counts_BxQ = _resample_counts(query_docs_Q, n_boot, seed)
  needed = ("H_model", "ID", "nuisance") + SURFACE_READERS
  draws = {}
  for lv, (_, lab) in labels.items():
    readers = {r: _SortedReader(scores[r][lv], lab) for r in needed}
    ap = {r: np.concatenate([readers[r].mean_ap(counts_BxQ[i:i + chunk])
                             for i in range(0, n_boot, chunk)]) for r in needed}
    rho, rho_surface = _rhos(ap)
    draws[lv] = {"rho": rho, "rho_surface": rho_surface}
  return _summary(draws, n_boot, level)


def bootstrap_rho_reference(scores: dict, labels: dict, query_docs_Q, *, n_boot: int,
                            seed: int, level: float = 0.95) -> dict:
  """`bootstrap_rho` by the obvious method: each resample's rows repeated, AP from scratch."""
  counts_BxQ = _resample_counts(query_docs_Q, n_boot, seed)
  needed = ("H_model", "ID", "nuisance") + SURFACE_READERS
  draws = {lv: {"rho": [], "rho_surface": []} for lv in labels}
  for counts in counts_BxQ:
    pick = np.repeat(np.arange(len(counts)), counts)
    for lv, (_, lab) in labels.items():
      ap = {}
      for r in needed:
        lab_p = np.asarray(lab, bool)[pick]
        aps = np.asarray(stats.average_precision(np.asarray(scores[r][lv])[pick], lab_p))
        n_pos = lab_p.sum(0)
        aps = np.where((n_pos > 0) & (n_pos < len(pick)), aps, np.nan)
        ap[r] = float(np.nanmean(aps)) if np.isfinite(aps).any() else float("nan")
      rho, rho_surface = _rhos(ap)
      draws[lv]["rho"].append(float(rho))
      draws[lv]["rho_surface"].append(float(rho_surface))
  return _summary(draws, n_boot, level)
