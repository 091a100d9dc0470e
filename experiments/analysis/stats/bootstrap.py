"""Percentile bootstraps over documents (positions of one document, or the tokens of one
validation document, are not independent) and over groups of evaluation items."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


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
