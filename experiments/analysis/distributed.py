"""App. C.3 of the Lngram v2 paper: semantics distributed across routes.

The single-code effects Δ_ref(r, c, z) of App. C.2 (`associations`), estimated
on the reference split and set to 0 where the code is not a reference
candidate, are recombined on held-out signatures C = (c_1..c_R):

  S_dict(C, z) = (1/R) Σ_r Δ_ref(r, c_r, z),

read as a score per concept: AP per concept, mean per target level, and its
excess AP retained rho = (AP_S - AP_N) / (AP_H - AP_N) against the H_model and
nuisance readers of `id_readers` on the same queries. Then, per (query,
concept), the routes ranked by |Δ_ref(r, c_r, z)|: the top-m routes' sum is the
score, AP_m for m in {1, 2, 4, ..., R}, and AP_R / AP_1.
"""

from __future__ import annotations

import numpy as np

from experiments.analysis import id_readers
from experiments.analysis.associations import reference_effects

# Lngram v2 paper, §3.3 / App. C.3 (six settings: 2 layers x 3 targets).
PAPER = {"rho_range": (0.3179, 0.5482), "ap_ratio_range": (2.02, 12.32),
         "id_knn_rho_range": (0.6577, 0.8427)}


def route_counts(R: int) -> list[int]:
  """m in {1, 2, 4, ..., R}, R included when it is not a power of two."""
  ms = [1 << i for i in range(R.bit_length()) if 1 << i <= R]
  return ms if ms[-1] == R else ms + [R]


def route_effects(delta_RxCxZ: np.ndarray, codes_QxR: np.ndarray) -> np.ndarray:
  """float [Q, R, Z]: Δ_ref(r, c_r, z) of each query's code on each route."""
  R = codes_QxR.shape[1]
  return delta_RxCxZ[np.arange(R)[None, :], np.asarray(codes_QxR, np.int64)]


def top_m_scores(d_QxRxZ: np.ndarray, ms) -> dict[int, np.ndarray]:
  """m -> [Q, Z]: the sum of the m routes with the largest |Δ| per (query, concept)."""
  order = np.argsort(-np.abs(d_QxRxZ), axis=1, kind="stable")
  cum = np.cumsum(np.take_along_axis(d_QxRxZ, order, axis=1), axis=1)
  return {m: cum[:, m - 1, :] for m in ms}


def _split_levels(scores_QxZ: np.ndarray, levels: list[str]) -> dict[str, np.ndarray]:
  lv = np.asarray(levels)
  return {level: scores_QxZ[:, lv == level] for level in dict.fromkeys(levels)}


def distributed(ref, held, *, max_queries: int | None = 2000, seed: int = 0,
                readers: dict | None = None, k: int = 10, min_support: int = 20,
                min_delta: float = 0.01, ref_alpha: float = 0.01, layers=None) -> dict:
  """S_dict AP and rho per layer and level; AP_m over the top-m routes and AP_R / AP_1.

  `readers`: an `id_readers.id_knn` result on the same queries (same
  `max_queries` and `seed`) to take AP_H and AP_N from; without it the
  H_model and nuisance readers are run here.
  """
  q_idx = id_readers.sample_queries(held, max_queries, seed)
  labels = id_readers.level_labels(held, q_idx)
  if readers is not None and (readers["n_queries"] != len(q_idx) or readers["seed"] != seed):
    raise ValueError("`readers` was computed on other queries: pass the same max_queries/seed")
  layers = tuple(ref.layers if layers is None else layers)
  result = {"n_queries": int(len(q_idx)), "seed": seed, "max_queries": max_queries,
            "settings": {"min_support": min_support, "min_delta": min_delta,
                         "ref_alpha": ref_alpha}, "layers": {}}
  nuisance = None
  for layer in layers:
    levels, _, delta = reference_effects(ref, layer, min_support=min_support,
                                         min_delta=min_delta, ref_alpha=ref_alpha)
    d = route_effects(delta, np.asarray(held.codes[layer])[q_idx])
    R = d.shape[1]
    ms = route_counts(R)
    ap_s = {lv: id_readers.mean_ap(s, labels[lv][1])
            for lv, s in _split_levels(d.mean(1), levels).items()}
    ap_m = {m: {lv: id_readers.mean_ap(s, labels[lv][1])
                for lv, s in _split_levels(scores, levels).items()}
            for m, scores in top_m_scores(d, ms).items()}
    rho_id = {lv: None for lv in labels}
    if readers is not None:
      ap_h = readers["layers"][str(layer)]["ap"]["H_model"]
      ap_n = readers["layers"][str(layer)]["ap"]["nuisance"]
      rho_id = readers["layers"][str(layer)]["rho"]
    else:
      if nuisance is None:
        nuisance = id_readers.level_means(
            id_readers.reader_scores(ref, held, q_idx, layer, "nuisance"), labels)
      ap_n = nuisance
      ap_h = id_readers.level_means(
          id_readers.reader_scores(ref, held, q_idx, layer, "H_model", k=k), labels)
    row = {
        "ap_s_dict": ap_s, "ap_h_model": ap_h, "ap_nuisance": ap_n,
        "rho": {lv: id_readers.rho(ap_s[lv], _num(ap_h[lv]), _num(ap_n[lv])) for lv in labels},
        "rho_id_knn": rho_id,
        "supported_codes": int((delta != 0).any(-1).sum()), "codes": int(R * delta.shape[1]),
        "ms": ms, "ap_m": {str(m): v for m, v in ap_m.items()},
        "ratio": {lv: _ratio(ap_m[R][lv], ap_m[1][lv]) for lv in labels},
    }
    result["layers"][str(layer)] = id_readers.jsonable(row)
  return result


def _num(x) -> float:
  return float("nan") if x is None else float(x)


def _ratio(a, b) -> float:
  return float(a / b) if b and np.isfinite(a) and np.isfinite(b) and b > 0 else float("nan")


def _fmt(x, pct: bool = False) -> str:
  if x is None:
    return "—"
  return f"{100 * x:.2f}%" if pct else f"{x:.4f}"


def _fmt_ratio(x) -> str:
  return "—" if x is None else f"{x:.2f}"


def markdown(result: dict) -> str:
  """S_dict AP, rho and AP_R / AP_1 per layer and level; AP_m per m; the paper's ranges."""
  lines = ["| layer | target | S_dict AP | H_model | nuisance | ρ (S_dict) "
           "| ρ (ID-KNN) | AP_1 | AP_R | AP_R / AP_1 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for layer, row in result["layers"].items():
    R = str(row["ms"][-1])
    for lv in row["rho"]:
      lines.append(
          f"| {layer} | {lv} | {_fmt(row['ap_s_dict'][lv])} | {_fmt(row['ap_h_model'][lv])} "
          f"| {_fmt(row['ap_nuisance'][lv])} | {_fmt(row['rho'][lv], pct=True)} "
          f"| {_fmt(row.get('rho_id_knn', {}).get(lv), pct=True)} "
          f"| {_fmt(row['ap_m']['1'][lv])} | {_fmt(row['ap_m'][R][lv])} "
          f"| {_fmt_ratio(row['ratio'][lv])} |")
  lo, hi = PAPER["rho_range"]
  rlo, rhi = PAPER["ap_ratio_range"]
  lines += ["", f"Paper (six settings): S_dict retains {100 * lo:.2f}%–{100 * hi:.2f}% of the "
            f"excess AP (ID-KNN: 65.77%–84.27%); AP_128 / AP_1 = {rlo}–{rhi}.", ""]
  for layer, row in result["layers"].items():
    head = " | ".join(f"m={m}" for m in row["ms"])
    lines += [f"AP_m, layer {layer}:", "", f"| target | {head} |",
              "| --- | " + " | ".join("---" for _ in row["ms"]) + " |"]
    for lv in row["rho"]:
      lines.append(f"| {lv} | " + " | ".join(_fmt(row["ap_m"][str(m)][lv]) for m in row["ms"])
                   + " |")
    lines.append("")
  return "\n".join(lines)
