"""Table 1 of the Lngram v2 paper: semantics read from the Lngram IDs alone (§3.2).

Every reader scores held-out query positions for each concept from REFERENCE
positions only:

  * H_model: the K nearest reference positions from distinct files by cosine
    on the layer input h; the score of concept z is the share of neighbours
    having z;
  * Q_route: the same on the router logits z (pre-threshold);
  * ID: the same by route-Hamming distance over the codes (routes that differ);
  * nuisance: the reference rate of z in the query's nuisance stratum (column
    x line x row-position bucket): the best any reader of position alone can
    do, so a harder baseline than a KNN over strata (ties among the whole
    stratum would make that one an arbitrary sample of the same rate);
  * surface: the reference rate of z given (current byte, previous byte),
    falling back to the current byte, then to the overall rate;
  * surface_byte: the reference rate of z given the current byte alone.

On the records of a token run (records.py) a position is a token and its surface
features are token ids: `surface` reads (current token id, previous token id),
`surface_byte` the current token id alone, and `perm_strata="nuisance_byte"` crosses
the nuisance stratum with the current token id (the names stay those of the byte runs).

The surface readers say how much of a target the bytes alone give away; on the
local target (the Python token kind) they can beat every KNN reader, so rho is
also reported against the best of them, rho_surface = (AP_ID - AP_S) /
(AP_H - AP_S), beside rho against the nuisance reader. Both come with 95%
document-bootstrap CIs (`n_boot` resamples of the held-out query FILES, every
reader's AP recomputed on each resample).

Documents are matched across the splits by file path. AP per concept over
the queries (a concept counts where the queries hold a positive and a
negative), the mean per target level, the excess AP retained
rho = (AP_ID - AP_N) / (AP_H - AP_N), and a permutation test: the reference
signatures are permuted among reference DOCUMENTS within nuisance strata (per
stratum a bijection that keeps each file's signatures together), the ID reader
is rerun on `perm_queries` of the queries (id_permutation.py, `PermutedHammingKnn`:
distances once, a gather per permutation), p = (1 + #{null >= observed}) / (1 + n_perm).
`perm_strata="nuisance_byte"` permutes within nuisance stratum x current byte
instead: the null is then "the codes carry nothing beyond the position and
the byte itself"; `perm_movable` is the share of reference positions whose
cell holds two or more files (only those can move: with few reference
positions per cell the test has little power, and this says how little).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from experiments.analysis import knn, stats
from experiments.analysis.id_permutation import (
    PERM_STRATA,  # noqa: F401  (id_knn's perm_strata values, which analyze checks first)
    PermutedHammingKnn,
    movable_share,
    permutation_strata,
    stratum_document_permutation,
)
from experiments.analysis.rho_bootstrap import bootstrap_rho

READERS = ("H_model", "Q_route", "ID", "nuisance", "surface", "surface_byte")
SURFACE_READERS = ("surface", "surface_byte")   # == rho_bootstrap.SURFACE_READERS
TABLE_READERS = ("nuisance",) + SURFACE_READERS
KNN_METRIC = {"H_model": "cosine", "ID": "hamming"}   # Q_route: the `z_metric` argument

# Lngram v2 paper, Table 1 (Keye2B + Lngram v2 on COCO; layers 1 and 13).
PAPER_TABLE1 = [
    # layer, task, H_model, Q_route, ID-KNN, nuisance, rho
    (1, "caption mention", 0.239744, 0.225916, 0.200077, 0.016789, 0.8221),
    (1, "local presence", 0.470371, 0.450705, 0.396941, 0.008484, 0.8410),
    (1, "visual presence", 0.317607, 0.302142, 0.273789, 0.039000, 0.8427),
    (13, "caption mention", 0.206947, 0.177058, 0.152670, 0.016789, 0.7146),
    (13, "local presence", 0.403160, 0.328081, 0.268083, 0.008493, 0.6577),
    (13, "visual presence", 0.286478, 0.250947, 0.221730, 0.039000, 0.7384),
]
PAPER_P = 1 / 501


def _log(progress: bool, msg: str) -> None:
  if progress:
    print(f"[id_knn] {msg}", file=sys.stderr, flush=True)


def sample_queries(held, max_queries: int | None, seed: int) -> np.ndarray:
  """Sorted held-out position indices: all of them, or a seeded sample of `max_queries`.

  Every reader of one analysis (and the C.3 readers, given the same arguments)
  scores exactly these positions.
  """
  P = len(held.file_ids)
  if max_queries is None or max_queries >= P:
    return np.arange(P)
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(P, size=max_queries, replace=False))


def level_labels(records, idx=None) -> dict[str, tuple[list[str], np.ndarray]]:
  """level -> (concept names, bool [P, Z]) restricted to positions `idx`."""
  out = {}
  for level, (names, labels_PxZ) in records.targets.items():
    labels = np.asarray(labels_PxZ, bool)
    out[level] = (list(names), labels if idx is None else labels[idx])
  return out


def evaluable(labels_QxZ: np.ndarray) -> np.ndarray:
  """bool [Z]: concepts with at least one positive and one negative query (AP defined)."""
  n_pos = labels_QxZ.sum(0)
  return (n_pos > 0) & (n_pos < labels_QxZ.shape[0])


def ap_per_concept(scores_QxZ: np.ndarray, labels_QxZ: np.ndarray) -> np.ndarray:
  """float [Z]: average precision of each concept over the queries; NaN unless `evaluable`."""
  labels = np.asarray(labels_QxZ, bool)
  if labels.shape[1] == 0:
    return np.zeros(0)
  ap = np.asarray(stats.average_precision(np.asarray(scores_QxZ, np.float64), labels))
  return np.where(evaluable(labels), ap, np.nan)


def mean_ap(scores_QxZ: np.ndarray, labels_QxZ: np.ndarray) -> float:
  aps = ap_per_concept(scores_QxZ, labels_QxZ)
  return float(np.nanmean(aps)) if np.isfinite(aps).any() else float("nan")


def rho(ap_reader: float, ap_h: float, ap_n: float) -> float:
  """Excess AP retained, (AP_reader - AP_N) / (AP_H - AP_N); NaN when H does not beat N."""
  denom = ap_h - ap_n
  return float((ap_reader - ap_n) / denom) if denom > 0 else float("nan")


def rate_table(keys_ref: np.ndarray, labels_ref_PxZ: np.ndarray, keys_q: np.ndarray,
               fallback_QxZ: np.ndarray) -> np.ndarray:
  """float [Q, Z]: the reference rate of each concept among positions sharing the query's key.

  Queries whose key never occurs on the reference take `fallback_QxZ`.
  """
  uniq, inv = np.unique(keys_ref, return_inverse=True)
  counts = np.bincount(inv, minlength=len(uniq)).astype(np.float64)
  sums = np.zeros((len(uniq), labels_ref_PxZ.shape[1]))
  np.add.at(sums, inv, labels_ref_PxZ.astype(np.float64))
  rates = sums / counts[:, None]
  pos = np.clip(np.searchsorted(uniq, keys_q), 0, len(uniq) - 1)
  seen = uniq[pos] == keys_q
  return np.where(seen[:, None], rates[pos], fallback_QxZ)


def stratum_rates(records, labels_PxZ: np.ndarray, idx=None) -> np.ndarray:
  """float [P, Z]: each position's concept rate within its own nuisance stratum (same split)."""
  labels = np.asarray(labels_PxZ, bool)
  keys = np.asarray(records.nuisance)
  glob = np.broadcast_to(labels.mean(0), labels.shape)
  rates = rate_table(keys, labels, keys, glob)
  return rates if idx is None else rates[idx]


def _table_scores(ref, held, q_idx, reader: str) -> dict[str, np.ndarray]:
  """The nuisance or surface reader's scores [Q, Z] per level."""
  out = {}
  for level, (_, labels_ref) in level_labels(ref).items():
    glob = np.broadcast_to(labels_ref.mean(0), (len(q_idx), labels_ref.shape[1]))
    if reader == "nuisance":
      out[level] = rate_table(np.asarray(ref.nuisance), labels_ref,
                              np.asarray(held.nuisance)[q_idx], glob)
      continue
    # surface: (byte, previous byte), else the byte alone, else the overall rate.
    s_ref = np.asarray(ref.surface, np.int64)
    s_q = np.asarray(held.surface, np.int64)[q_idx]
    by_byte = rate_table(s_ref[:, 0], labels_ref, s_q[:, 0], glob)
    if reader == "surface_byte":
      out[level] = by_byte
      continue
    # (current, previous) as one key, in the same order for bytes (width 512) and token
    # ids (wider: a vocabulary's); the previous one is -1 at the file start.
    width = max(512, int(max(s_ref.max(initial=0), s_q.max(initial=0))) + 2)
    out[level] = rate_table(s_ref[:, 0] * width + (s_ref[:, 1] + 1), labels_ref,
                            s_q[:, 0] * width + (s_q[:, 1] + 1), by_byte)
  return out


def _features(records, layer: int, reader: str) -> np.ndarray:
  if reader == "H_model":
    return np.asarray(records.h[layer], np.float32)
  if reader == "Q_route":
    return np.asarray(records.z[layer], np.float32)
  return np.asarray(records.codes[layer], np.int32)


def document_ids(ref, held) -> tuple[np.ndarray, np.ndarray]:
  """int [P_ref], int [P_held]: documents of both splits in one id space (by file path).

  The splits number their files independently, so ids are matched through
  the paths; a file in both splits (never, with a split by hash) is one document.
  """
  paths = np.concatenate([np.asarray(ref.files, object)[np.asarray(ref.file_ids)],
                          np.asarray(held.files, object)[np.asarray(held.file_ids)]])
  _, inv = np.unique(paths.astype(str), return_inverse=True)
  inv = inv.reshape(-1).astype(np.int32)
  n_ref = len(ref.file_ids)
  return inv[:n_ref], inv[n_ref:]


def knn_indices(ref, held, q_idx, layer: int, reader: str, *, k: int, z_metric: str,
                docs=None) -> np.ndarray:
  """int [Q, k]: the reader's distinct-document reference neighbours of the queries (-1: none).

  `docs`: `document_ids(ref, held)` when already computed.
  """
  metric = KNN_METRIC.get(reader, z_metric)
  ref_docs, held_docs = document_ids(ref, held) if docs is None else docs
  return knn.distinct_doc_knn(
      _features(held, layer, reader)[q_idx], _features(ref, layer, reader), held_docs[q_idx],
      ref_docs, k, metric,
      n_codes=2 ** ref.bits if metric == "hamming" else None)


def knn_scores(idx_QxK: np.ndarray, ref) -> dict[str, np.ndarray]:
  """Scores [Q, Z] per level: the share of the neighbours having each concept."""
  return {level: np.asarray(knn.neighbour_scores(idx_QxK, labels))
          for level, (_, labels) in level_labels(ref).items()}


def reader_scores(ref, held, q_idx, layer: int, reader: str, *, k: int = 10,
                  z_metric: str = "cosine") -> dict[str, np.ndarray]:
  """One reader's scores [Q, Z] per target level for the queries `q_idx` of `held`."""
  if reader in TABLE_READERS:
    return _table_scores(ref, held, q_idx, reader)
  return knn_scores(knn_indices(ref, held, q_idx, layer, reader, k=k, z_metric=z_metric), ref)


def level_means(scores: dict[str, np.ndarray], labels: dict) -> dict[str, float]:
  """level -> mean AP of `scores[level]` against `labels[level]` (names, bool [Q, Z])."""
  return {level: mean_ap(scores[level], labels[level][1]) for level in labels}


def _rho_row(ap: dict, labels: dict) -> dict:
  """A layer's rho of the ID and Q_route readers (against the nuisance reader and the best
  surface reader) and whether its readers rank as the paper orders them, from its mean APs."""
  best_surface = {lv: max(SURFACE_READERS, key=lambda r: -np.inf if not np.isfinite(
      ap[r][lv]) else ap[r][lv]) for lv in labels}
  return {
      "rho": {lv: rho(ap["ID"][lv], ap["H_model"][lv], ap["nuisance"][lv]) for lv in labels},
      "best_surface": best_surface,
      "rho_surface": {lv: rho(ap["ID"][lv], ap["H_model"][lv], ap[best_surface[lv]][lv])
                      for lv in labels},
      "rho_q_route": {lv: rho(ap["Q_route"][lv], ap["H_model"][lv], ap["nuisance"][lv])
                      for lv in labels},
      "ordering": {lv: bool(ap["H_model"][lv] > ap["Q_route"][lv] > ap["ID"][lv]
                            > ap["nuisance"][lv]) for lv in labels},
  }


def id_knn(ref, held, *, k: int = 10, max_queries: int | None = 2000, n_perm: int = 500,
           perm_queries: int | None = 500, z_metric: str = "cosine", seed: int = 0,
           layers=None, progress: bool = True, perm_strata: str = "nuisance",
           n_boot: int = 0) -> dict:
  """Table 1: mean AP of every reader per layer and target level, rho, and the permutation test.

  Parameters
  ----------
  ref, held : PositionRecords of the reference and the held-out split.
  k : neighbours from k distinct reference files.
  max_queries : held-out positions scored (a seeded sample; None: all).
  n_perm : permutations of the test (0 skips it).
  perm_queries : the test's queries, a seeded sub-sample of the scored ones
    (None: all); every permutation is a full ID search, so this sets its cost.
    Its observed statistic is the ID reader's mean AP on these queries.
  z_metric : the Q_route reader's metric on the router logits ("cosine" or "euclidean").
  perm_strata : the permutation test's cells, one of `PERM_STRATA`.
  n_boot : query-document bootstrap resamples of the rho CIs (0: none).
  """
  ref_strata = permutation_strata(ref, perm_strata)   # the kind checked before any search
  t0 = time.time()
  q_idx = sample_queries(held, max_queries, seed)
  labels = level_labels(held, q_idx)
  layers = tuple(ref.layers if layers is None else layers)
  result = {
      "k": k, "n_queries": int(len(q_idx)), "n_reference": int(len(ref.file_ids)),
      "n_query_files": int(len(np.unique(np.asarray(held.file_ids)[q_idx]))),
      "n_reference_files": int(len(np.unique(ref.file_ids))), "n_perm": n_perm,
      "perm_queries": int(len(q_idx) if perm_queries is None else min(perm_queries, len(q_idx))),
      "z_metric": z_metric, "seed": seed, "max_queries": max_queries,
      "perm_strata": perm_strata, "n_boot": n_boot,
      "perm_movable": movable_share(ref_strata, ref.file_ids),
      "query_file_max_share": float(np.bincount(np.asarray(held.file_ids)[q_idx]).max()
                                    / len(q_idx)) if len(q_idx) else None,
      "levels": {level: {"concepts": names,
                         "evaluated": [n for n, ok in zip(names, evaluable(lab), strict=True) if ok]}
                 for level, (names, lab) in labels.items()},
      "layers": {},
  }
  table_scores = {r: _table_scores(ref, held, q_idx, r) for r in TABLE_READERS}
  table = {r: level_means(table_scores[r], labels) for r in TABLE_READERS}
  _log(progress, f"{len(q_idx)} queries, {len(ref.file_ids)} reference positions")
  for layer in layers:
    ap = dict(table)
    per_concept = {}
    all_scores = dict(table_scores)
    for reader in ("H_model", "Q_route", "ID"):
      scores = reader_scores(ref, held, q_idx, layer, reader, k=k, z_metric=z_metric)
      all_scores[reader] = scores
      ap[reader] = level_means(scores, labels)
      per_concept[reader] = {}
      for level, (names, lab) in labels.items():
        aps = jsonable(ap_per_concept(scores[level], lab))
        per_concept[reader][level] = dict(zip(names, aps, strict=True))
      _log(progress, f"layer {layer}: {reader} done ({time.time() - t0:.0f}s)")
    row = {"ap": ap, "ap_per_concept": per_concept, **_rho_row(ap, labels)}
    if n_boot > 0:
      row["bootstrap"] = bootstrap_rho(all_scores, labels, np.asarray(held.file_ids)[q_idx],
                                       n_boot=n_boot, seed=seed)
      _log(progress, f"layer {layer}: {n_boot} bootstrap resamples ({time.time() - t0:.0f}s)")
    if n_perm > 0:
      sub = np.sort(np.random.default_rng([seed, 2]).permutation(len(q_idx))[
          :result["perm_queries"]])
      row["permutation"] = _permutation_test(
          ref, held, q_idx[sub], layer, {lv: (n, lab[sub]) for lv, (n, lab) in labels.items()},
          k=k, n_perm=n_perm, seed=seed, progress=progress, t0=t0, strata=ref_strata)
    result["layers"][str(layer)] = jsonable(row)
  result["seconds"] = round(time.time() - t0, 2)
  return result


def _permutation_test(ref, held, q_idx, layer, labels, *, k, n_perm, seed, progress,
                      t0, strata=None) -> dict:
  """The ID reader's mean AP per level, observed and with reference signatures permuted."""
  ref_docs, held_docs = document_ids(ref, held)
  search = PermutedHammingKnn(np.asarray(held.codes[layer])[q_idx], ref.codes[layer],
                              held_docs[q_idx], ref_docs, k, 2 ** ref.bits)
  observed = level_means(knn_scores(search(), ref), labels)
  rng = np.random.default_rng([seed, 1])   # the same permutations for every layer
  null = {level: [] for level in labels}
  for i in range(n_perm):
    src = stratum_document_permutation(ref.nuisance if strata is None else strata,
                                       ref.file_ids, rng)
    for level, m in level_means(knn_scores(search(src), ref), labels).items():
      null[level].append(m)
    if progress and (i + 1) % max(1, n_perm // 10) == 0:
      _log(progress, f"layer {layer}: permutation {i + 1}/{n_perm} ({time.time() - t0:.0f}s)")
  out = {}
  for level, values in null.items():
    v = np.asarray(values, np.float64)
    obs = observed[level]
    ok = np.isfinite(v) & np.isfinite(obs)
    out[level] = {
        "observed": obs, "null_mean": float(np.mean(v[ok])) if ok.any() else float("nan"),
        "null_max": float(np.max(v[ok])) if ok.any() else float("nan"),
        "p": float(stats.permutation_p(obs, v[ok])) if ok.any() else float("nan"),
        # Where the p of infinitely many permutations lies (95%, Clopper–Pearson).
        "p_interval": (list(stats.permutation_p_interval(obs, v[ok])) if ok.any()
                       else [float("nan")] * 2),
    }
  return out


def jsonable(x):
  """JSON has no NaN: NaN -> None, numpy scalars/arrays -> Python."""
  if isinstance(x, dict):
    return {k: jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple, np.ndarray)):
    return [jsonable(v) for v in x]
  if isinstance(x, (float, np.floating)):
    return None if not np.isfinite(x) else float(x)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return x


def _fmt(x, pct: bool = False) -> str:
  if x is None:
    return "—"
  return f"{100 * x:.2f}%" if pct else f"{x:.4f}"


def _with_ci(value, ci) -> str:
  text = _fmt(value, pct=True)
  if ci is None or any(c is None for c in ci):
    return text
  return f"{text} [{_fmt(ci[0], pct=True)}, {_fmt(ci[1], pct=True)}]"


def markdown(result: dict) -> str:
  """Table 1 as Markdown: our rows, then the paper's."""
  strata = result.get("perm_strata", "nuisance")
  movable = result.get("perm_movable")
  lines = [
      f"ID-KNN readers (K = {result['k']} distinct files; {result['n_queries']} held-out "
      f"queries from {result['n_query_files']} files, {result['n_reference']} reference "
      f"positions from {result['n_reference_files']} files; Q_route on {result['z_metric']}; "
      f"permutations within {strata.replace('_', ' x ')} cells"
      + ("" if movable is None else f", {100 * movable:.1f}% of reference positions movable")
      + "; ρ CIs: 95% bootstrap over query files)",
      "",
      "| layer | target | " + " | ".join(READERS) + " | ρ vs nuisance | ρ vs best surface "
      "| H>Q>ID>N | perm. p |",
      "| --- | --- | " + " | ".join("---" for _ in READERS) + " | --- | --- | --- | --- |",
  ]
  for layer, row in result["layers"].items():
    for level in row["rho"]:
      ap = row["ap"]
      perm = row.get("permutation", {}).get(level, {})
      p = perm.get("p")
      boot = row.get("bootstrap", {}).get(level, {})
      lines.append(
          f"| {layer} | {level} | " + " | ".join(_fmt(ap.get(r, {}).get(level)) for r in READERS)
          + f" | {_with_ci(row['rho'][level], boot.get('rho'))}"
          f" | {_with_ci(row.get('rho_surface', {}).get(level), boot.get('rho_surface'))}"
          f" | {'yes' if row['ordering'][level] else 'no'}"
          f" | {'—' if p is None else f'{p:.4g}'} |")
  lines += ["", "Paper (Table 1, Keye2B on COCO; p = 1/501 in every setting):", "",
            "| layer | target | H_model | Q_route | ID-KNN | nuisance | excess AP retained |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
  for layer, task, h, q, i, n, r in PAPER_TABLE1:
    lines.append(f"| {layer} | {task} | {h:.4f} | {q:.4f} | {i:.4f} | {n:.4f} | {100 * r:.2f}% |")
  return "\n".join(lines) + "\n"
