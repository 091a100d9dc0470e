"""Multiple testing: Benjamini–Hochberg and Holm adjusted p-values (R's `p.adjust`)."""

from __future__ import annotations

import numpy as np


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
