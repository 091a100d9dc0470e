"""Injection and propagation of the Lngram delta (the Lngram v2 paper's App. B.3, Tables 7-8).

Disable Lngram at one layer i (and at all layers together: W_O = 0, so its
delta Y is exactly 0) and compare with the intact model on the same windows:
  * R_l = ‖h_l^on − h_l^off‖ / ‖h_l^on‖ for every block output h_l;
  * immediate R at the injection: the residual right after Y is added,
    ‖Y‖ / ‖x + Y‖ (before it, on and off are identical);
  * Retention_l = ‖Δh_l‖ / ‖δ_inj‖ with δ_inj = Y, the perturbation that enters
    the residual stream (float32 here, so no rounding in the addition);
  * next-token logit R, Jensen-Shannon divergence (nats), top-1 agreement;
  * the cosine between Y and the attention / MLP residual of that layer.

Norms are Frobenius norms over a document's real positions (a ratio per
document, then the mean over documents, as App. B.1 aggregates), so a
position with a tiny Y cannot dominate. The paper scores only the next token
after each prompt; we score every position of the windows.
"""

from __future__ import annotations

import numpy as np

from experiments.analysis.probe import Windows, lngram_layers, probe, without_lngram

# Lngram v2 paper, Table 7: layer, modality, model, immediate R, final R, final retention.
PAPER_TABLE7 = [
    (1, "visual", "new", 0.01465, 0.06442, 16.64),
    (1, "visual", "Keye2B", 0.01841, 0.09515, 3.685),
    (1, "text", "new", 0.008512, 0.01281, 12.79),
    (1, "text", "Keye2B", 0.04306, 0.11646, 4.935),
    (13, "visual", "new", 0.005987, 0.02476, 3.109),
    (13, "visual", "Keye2B", 0.05771, 0.10009, 1.890),
    (13, "text", "new", 0.0000926, 0.01069, 3.432),
    (13, "text", "Keye2B", 0.006358, 0.11245, 2.356),
]
# Table 8 (all Lngram layers disabled): metric, new VLM, Keye2B. |cos| <= ~0.016 in the text.
PAPER_TABLE8 = [
    ("final hidden R (visual)", 0.06510, 0.12395), ("final hidden R (text)", 0.01303, 0.14383),
    ("next-token logit R", 0.01741, 0.19282), ("next-token JS", 0.000297, 0.01250),
    ("top-1 agreement", 1.000, 0.875),
]


def _doc_sums(sq_NxT, valid_NxT, doc_N, n_docs) -> np.ndarray:
  out = np.zeros(n_docs)
  np.add.at(out, doc_N, np.where(valid_NxT, sq_NxT, 0.0).sum(-1))
  return out


def doc_norm_ratio(num_NxTxD, den_NxTxD, valid_NxT, doc_N, n_docs) -> float:
  """Mean over documents of ‖num‖_F / ‖den‖_F over that document's real positions."""
  num = _doc_sums((np.asarray(num_NxTxD, np.float64) ** 2).sum(-1), valid_NxT, doc_N, n_docs)
  den = _doc_sums((np.asarray(den_NxTxD, np.float64) ** 2).sum(-1), valid_NxT, doc_N, n_docs)
  keep = den > 0
  return float(np.mean(np.sqrt(num[keep] / den[keep]))) if keep.any() else float("nan")


def doc_mean(value_NxT, valid_NxT, doc_N, n_docs) -> float:
  """Mean over documents of the within-document mean over real positions."""
  total = _doc_sums(np.asarray(value_NxT, np.float64), valid_NxT, doc_N, n_docs)
  count = _doc_sums(np.ones(valid_NxT.shape), valid_NxT, doc_N, n_docs)
  keep = count > 0
  return float(np.mean(total[keep] / count[keep]))


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def js_divergence(logits_p, logits_q) -> np.ndarray:
  """Jensen-Shannon divergence (nats) of the softmax distributions, per position."""
  lp, lq = _log_softmax(np.asarray(logits_p, np.float64)), _log_softmax(
      np.asarray(logits_q, np.float64))
  p, q = np.exp(lp), np.exp(lq)
  m = 0.5 * (p + q)
  lm = np.log(np.maximum(m, 1e-300))
  return 0.5 * (p * (lp - lm)).sum(-1) + 0.5 * (q * (lq - lm)).sum(-1)


def cosine(a_NxTxD, b_NxTxD) -> np.ndarray:
  """Cosine per position; NaN where either vector is zero."""
  a, b = np.asarray(a_NxTxD, np.float64), np.asarray(b_NxTxD, np.float64)
  na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    return (a * b).sum(-1) / (na * nb)


def _cos_summary(cos_NxT, valid_NxT) -> dict:
  keep = valid_NxT & np.isfinite(cos_NxT)
  if not keep.any():
    return {"mean": None, "mean_abs": None}
  return {"mean": float(cos_NxT[keep].mean()), "mean_abs": float(np.abs(cos_NxT[keep]).mean())}


def compare(on: dict, off: dict, windows: Windows, *, injected: int | None) -> dict:
  """The B.3 numbers of one intervention from the on / off probes."""
  valid, doc, nd = windows.valid_NxT, windows.doc_N, windows.n_docs
  h_on, h_off = on["outputs_LxNxTxD"], off["outputs_LxNxTxD"]
  L = h_on.shape[0]
  out = {"R_by_layer": [doc_norm_ratio(h_on[j] - h_off[j], h_on[j], valid, doc, nd)
                        for j in range(L)]}
  out["final_R"] = out["R_by_layer"][-1]
  lon, loff = on["logits_NxTxV"], off["logits_NxTxV"]
  out["logit_R"] = doc_norm_ratio(lon - loff, lon, valid, doc, nd)
  out["js"] = doc_mean(js_divergence(lon, loff), valid, doc, nd)
  out["top1_agreement"] = doc_mean(lon.argmax(-1) == loff.argmax(-1), valid, doc, nd)
  if injected is None:
    out.update(immediate_R=None, retention_by_layer=None, final_retention=None, cosine=None)
    return out
  y, x = on[f"y/{injected}"], on[f"input/{injected}"]
  out["immediate_R"] = doc_norm_ratio(y, x + y, valid, doc, nd)
  out["retention_by_layer"] = [
      None if j < injected else doc_norm_ratio(h_on[j] - h_off[j], y, valid, doc, nd)
      for j in range(L)]
  out["final_retention"] = out["retention_by_layer"][-1]
  attn, mlp = on[f"attn/{injected}"], on[f"mlp/{injected}"]
  out["cosine"] = {name: _cos_summary(cosine(y, r), valid)
                   for name, r in (("attn", attn), ("mlp", mlp), ("attn+mlp", attn + mlp))}
  return out


def injection(model, windows: Windows, *, batch: int = 16, progress=None) -> dict:
  """Tables 7-8: each Lngram layer disabled alone, then all of them together."""
  layers = lngram_layers(model)
  on = probe(model, windows, batch=batch, parts=True)
  settings = [(str(i), (i,)) for i in layers] + [("all", layers)]
  result = {"layers": list(layers), "n_layers": len(model.blocks),
            "n_docs": windows.n_docs, "n_positions": windows.n_positions,
            "interventions": {}}
  for k, (name, off_layers) in enumerate(settings):
    # The same program as `on` (parts=True), so layers before the injection match bit for bit.
    off = probe(without_lngram(model, off_layers), windows, batch=batch, parts=True)
    result["interventions"][name] = {
        "disabled": list(off_layers),
        **compare(on, off, windows, injected=off_layers[0] if len(off_layers) == 1 else None)}
    if progress:
      progress(k + 1, len(settings))
  return result


def _fmt(x, spec=".4g"):
  return "–" if x is None else format(x, spec)


def markdown(result: dict) -> str:
  """Tables 7 and 8 as Markdown."""
  lines = ["| disabled | immediate R | final R | final retention | logit R | JS (nats) "
           "| top-1 agreement | cos(Y, attn) | cos(Y, MLP) | mean abs cos(Y, attn+MLP) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in result["interventions"].items():
    cos = r["cosine"] or {}
    c = [_fmt((cos.get(k) or {}).get("mean")) for k in ("attn", "mlp")]
    c.append(_fmt((cos.get("attn+mlp") or {}).get("mean_abs")))
    label = "all Lngram layers" if name == "all" else f"layer {name}"
    lines.append(f"| {label} | {_fmt(r['immediate_R'])} | {_fmt(r['final_R'])} | "
                 f"{_fmt(r['final_retention'])} | {_fmt(r['logit_R'])} | {_fmt(r['js'])} | "
                 f"{_fmt(r['top1_agreement'])} | " + " | ".join(c) + " |")
  lines.append(f"\n{result['n_docs']} documents, {result['n_positions']} positions; "
               "ratios of Frobenius norms per document, averaged over documents.")
  lines += ["", "Paper (Table 7):", "", "| layer | modality | model | immediate R | final R "
            "| final retention |", "|---|---|---|---|---|---|"]
  lines += [f"| {lay} | {mod} | {m} | {a:.4g} | {b:.4g} | {c:.4g} |"
            for lay, mod, m, a, b, c in PAPER_TABLE7]
  lines += ["", "Paper (Table 8, all Lngram layers off; mean |cos| with the attention/MLP "
            "residual <= 0.016):", "", "| metric | new VLM | Keye2B |", "|---|---|---|"]
  lines += [f"| {name} | {a:.4g} | {b:.4g} |" for name, a, b in PAPER_TABLE8]
  return "\n".join(lines) + "\n"


def plot(result: dict, ax) -> None:
  """R_l along the layers for each intervention (log scale)."""
  for name, r in result["interventions"].items():
    y = [v if v and v > 0 else np.nan for v in r["R_by_layer"]]   # 0 before the injection
    ax.plot(range(result["n_layers"]), y, "o-",
            label="all" if name == "all" else f"layer {name} off")
  ax.set_yscale("log")
  ax.set_xlabel("block output l")
  ax.set_ylabel("R_l = ‖h_on − h_off‖ / ‖h_on‖")
  ax.legend(fontsize=7)
