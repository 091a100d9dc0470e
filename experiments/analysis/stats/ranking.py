"""Ranking: average precision per concept, ties grouped as sklearn groups them."""

from __future__ import annotations

import numpy as np


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
