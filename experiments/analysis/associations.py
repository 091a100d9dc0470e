"""App. C.2 of the Lngram v2 paper: single route-code associations `C_{l,r} = c => z`.

For a code u = (layer l, route r, code c) and a concept z, over the positions
where route r of layer l reads c (n of them, `pos` having z):

  P  = pos / n,
  P0 = the mean, over those same positions, of the rate of z in each
       position's nuisance stratum (the split's own rate: what position alone
       predicts for exactly these positions),
  Δ  = P - P0.

The test is the exact binomial test of pos in n against the fixed rate P0
(`stats.binomial_test`, two-sided); the 95% CI of Δ is Clopper–Pearson's
interval of P minus P0. (With P0 a mean of stratum rates, the count under
"z does not depend on the code within strata" is Poisson-binomial, whose
variance is at most the binomial one: the test errs on the safe side.)

Candidates are decided on the reference split: support n >= `min_support`,
|Δ| >= `min_delta` and reference p < `ref_alpha`; their direction is the sign
of Δ_ref. On the held-out split a candidate is evaluable with held-out support
>= `min_support_heldout` and a stratum rate strictly between 0 and 1 at some
of its positions (else z is fixed by position there); it replicates when Δ_held has the same
sign, its CI excludes 0 and its Benjamini–Hochberg adjusted p (over all
evaluable candidates) is <= q. The test treats positions as independent;
positions of one file are not, so p-values of file-level concepts are
optimistic (the replication on held-out FILES is the safeguard).
"""

from __future__ import annotations

import numpy as np

from experiments.analysis import stats
from experiments.analysis.id_readers import jsonable, stratum_rates

# Lngram v2 paper, App. C.2 (both layers together) and Table 10 (examples).
PAPER = {"candidates": 16304, "evaluable": 14002, "replicated": 9220, "rate": 0.6585,
         "rate_local_presence": {"1": 0.8301, "13": 0.8494}}


def all_concepts(records) -> tuple[list[str], list[str], np.ndarray]:
  """(levels, names, bool [P, Z]) of every target level side by side."""
  levels, names, cols = [], [], []
  for level, (lv_names, labels) in records.targets.items():
    levels += [level] * len(lv_names)
    names += list(lv_names)
    cols.append(np.asarray(labels, bool))
  P = len(records.file_ids)
  return levels, names, (np.concatenate(cols, 1) if cols else np.zeros((P, 0), bool))


def code_counts(codes_PxR: np.ndarray, labels_PxZ: np.ndarray, base_PxZ: np.ndarray,
                n_codes: int) -> dict[str, np.ndarray]:
  """Per (route, code, concept): n [R, C], positives, expected E = Σ p_i and V = Σ p_i(1-p_i).

  One one-hot [P, R·C] matmul per statistic.
  """
  P, R = codes_PxR.shape
  flat_PxR = np.arange(R)[None, :] * n_codes + np.asarray(codes_PxR, np.int64)
  onehot = np.zeros((P, R * n_codes), np.float64)
  onehot[np.arange(P)[:, None], flat_PxR] = 1.0
  shape = (R, n_codes, labels_PxZ.shape[1])
  return {
      "n": onehot.sum(0).reshape(R, n_codes),
      "pos": (onehot.T @ labels_PxZ.astype(np.float64)).reshape(shape),
      "exp": (onehot.T @ base_PxZ).reshape(shape),
      "var": (onehot.T @ (base_PxZ * (1 - base_PxZ))).reshape(shape),
  }


def effects(records, layer: int, labels_PxZ: np.ndarray) -> dict[str, np.ndarray]:
  """On one split: n [R, C]; P, P0, Δ, the test's p and the CI of Δ [R, C, Z]."""
  base = stratum_rates(records, labels_PxZ)
  cnt = code_counts(np.asarray(records.codes[layer]), labels_PxZ, base, 2 ** records.bits)
  n = np.broadcast_to(cnt["n"][..., None], cnt["pos"].shape)
  with np.errstate(divide="ignore", invalid="ignore"):
    p0 = np.where(n > 0, cnt["exp"] / n, np.nan)
  # Counts are sums of 0/1 in float64: exact; round off matmul noise before the test.
  k = np.minimum(np.rint(cnt["pos"]), n)
  test = stats.binomial_test(k, n, np.where(n > 0, np.clip(p0, 0.0, 1.0), 0.5))
  return {"n": cnt["n"], "P": test.rate, "P0": p0, "delta": test.rate - p0,
          "p": test.p_value, "var": cnt["var"], "ci_low": test.lo - p0, "ci_high": test.hi - p0}


def candidate_mask(eff: dict, *, min_support: int, min_delta: float, ref_alpha: float):
  """bool [R, C, Z]: the reference candidates (support, effect size, reference test)."""
  n = eff["n"][..., None]
  with np.errstate(invalid="ignore"):
    return ((n >= min_support) & (np.abs(eff["delta"]) >= min_delta)
            & (eff["p"] < ref_alpha) & (eff["var"] > 0))


def reference_effects(ref, layer: int, *, min_support: int = 20, min_delta: float = 0.01,
                      ref_alpha: float = 0.01) -> tuple[list[str], list[str], np.ndarray]:
  """(levels, names, Δ_ref [R, C, Z]) with Δ_ref = 0 where the code is not a candidate."""
  levels, names, labels = all_concepts(ref)
  eff = effects(ref, layer, labels)
  mask = candidate_mask(eff, min_support=min_support, min_delta=min_delta, ref_alpha=ref_alpha)
  return levels, names, np.where(mask, eff["delta"], 0.0)


def associations(ref, held, *, min_support: int = 20, min_delta: float = 0.01,
                 ref_alpha: float = 0.01, min_support_heldout: int = 10, q: float = 0.05,
                 n_examples: int = 15, layers=None) -> dict:
  """C.2: candidates on reference, held-out tests with CIs, BH at q, replication rates, examples."""
  levels, names, labels_ref = all_concepts(ref)
  _, held_names, labels_held = all_concepts(held)
  if held_names != names:
    raise ValueError("reference and held-out records name different concepts; pass the "
                     "reference concept names when collecting the held-out records")
  layers = tuple(ref.layers if layers is None else layers)
  rows = []   # one dict of arrays per layer, over its candidates
  for layer in layers:
    e_ref = effects(ref, layer, labels_ref)
    e_held = effects(held, layer, labels_held)
    cand = candidate_mask(e_ref, min_support=min_support, min_delta=min_delta,
                          ref_alpha=ref_alpha)
    r, c, z = np.nonzero(cand)
    direction = np.sign(e_ref["delta"][r, c, z])
    ok = (e_held["n"][r, c] >= min_support_heldout) & (e_held["var"][r, c, z] > 0)
    rows.append({"layer": np.full(len(r), layer), "route": r, "code": c, "z": z,
                 "direction": direction, "evaluable": ok,
                 **{f"{k}_held": e_held[k][r, c, z] for k in
                    ("P", "P0", "delta", "p", "ci_low", "ci_high")},
                 "n_held": e_held["n"][r, c], "n_ref": e_ref["n"][r, c],
                 "delta_ref": e_ref["delta"][r, c, z]})
  cat = {k: np.concatenate([row[k] for row in rows]) for k in rows[0]} if rows else {}
  ev = cat["evaluable"] if cat else np.zeros(0, bool)
  p_adj = np.full(len(ev), np.nan)
  if ev.any():
    p_adj[ev] = stats.bh_adjust(cat["p_held"][ev])
  if cat:
    same = np.sign(cat["delta_held"]) == cat["direction"]
    excl = np.where(cat["direction"] > 0, cat["ci_low_held"] > 0, cat["ci_high_held"] < 0)
    replicated = ev & same & excl & (p_adj <= q)
  else:
    replicated = np.zeros(0, bool)

  def counts(sel):
    n_c, n_e, n_r = int(sel.sum()), int((sel & ev).sum()), int((sel & replicated).sum())
    return {"candidates": n_c, "evaluable": n_e, "replicated": n_r,
            "rate": n_r / n_e if n_e else None}

  level_of = np.asarray(levels)[cat["z"]] if cat else np.zeros(0, str)
  layer_of = cat["layer"] if cat else np.zeros(0, int)
  result = {
      "settings": {"min_support": min_support, "min_delta": min_delta, "ref_alpha": ref_alpha,
                   "min_support_heldout": min_support_heldout, "q": q},
      "n_reference": int(len(ref.file_ids)), "n_heldout": int(len(held.file_ids)),
      "total": counts(np.ones(len(ev), bool)),
      "by_layer": {str(lay): counts(layer_of == lay) for lay in layers},
      "by_level": {lv: counts(level_of == lv) for lv in dict.fromkeys(levels)},
      "by_layer_level": {f"{lay}/{lv}": counts((layer_of == lay) & (level_of == lv))
                         for lay in layers for lv in dict.fromkeys(levels)},
      "examples": _examples(cat, replicated, p_adj, names, levels, n_examples) if cat else [],
  }
  return jsonable(result)


def _examples(cat, replicated, p_adj, names, levels, n_examples) -> list[dict]:
  """The strongest replicated positive associations by held-out Δ, one per concept first."""
  sel = np.flatnonzero(replicated & (cat["direction"] > 0))
  sel = sel[np.argsort(-cat["delta_held"][sel], kind="stable")]
  seen, first, rest = set(), [], []
  for i in sel:
    (rest if cat["z"][i] in seen else first).append(i)
    seen.add(cat["z"][i])
  out = []
  for i in (first + rest)[:n_examples]:
    z = int(cat["z"][i])
    out.append({
        "expression": f"C_{{{int(cat['layer'][i])},{int(cat['route'][i])}}}={int(cat['code'][i])}"
                      f" ⇒ {names[z]}",
        "layer": int(cat["layer"][i]), "route": int(cat["route"][i]),
        "code": int(cat["code"][i]), "concept": names[z], "level": levels[z],
        "P": float(cat["P_held"][i]), "P0": float(cat["P0_held"][i]),
        "delta": float(cat["delta_held"][i]), "delta_ref": float(cat["delta_ref"][i]),
        "ci": [float(cat["ci_low_held"][i]), float(cat["ci_high_held"][i])],
        "n": int(cat["n_held"][i]), "p_adj": float(p_adj[i]),
    })
  return out


def _rate(c: dict) -> str:
  return "—" if c["rate"] is None else f"{100 * c['rate']:.2f}%"


def markdown(result: dict) -> str:
  """Counts per layer and level, the examples in Table 10's form, the paper's totals."""
  lines = ["| layer / target | candidates | evaluable | replicated | rate |",
           "| --- | --- | --- | --- | --- |"]
  for key, c in [("all", result["total"]), *result["by_layer"].items(),
                 *result["by_layer_level"].items()]:
    lines.append(f"| {key} | {c['candidates']} | {c['evaluable']} | {c['replicated']} "
                 f"| {_rate(c)} |")
  lines.append(f"| paper (2 layers) | {PAPER['candidates']} | {PAPER['evaluable']} "
               f"| {PAPER['replicated']} | {100 * PAPER['rate']:.2f}% |")
  lines += ["", "| code expression | target | P | P0 | Δ |", "| --- | --- | --- | --- | --- |"]
  for ex in result["examples"]:
    lines.append(f"| `{ex['expression']}` | {ex['level']} | {100 * ex['P']:.2f}% "
                 f"| {100 * ex['P0']:.2f}% | {100 * ex['delta']:+.2f} pp |")
  return "\n".join(lines) + "\n"
