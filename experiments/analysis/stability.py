"""Address stability across checkpoints (the Lngram v2 paper's App. B.2, Table 6).

Between ADJACENT checkpoints of one run, on the same held-out windows, per
Lngram layer:
  * code agreement: share of (position, route) whose code is unchanged;
  * Hamming: share of the R·M router bits that differ;
  * n-gram survival (n = 2, 3): share of (position, route) with a whole order-n
    window (`lngram_jax.addressing.ngram_rows`: no padding, not before the
    start) whose table row, i.e. its exact address, is unchanged.

Two protocols. "own": each checkpoint's own router on its own forward.
"fixed" (primary, as in the paper): the FINAL checkpoint's router applied to
each checkpoint's layer input computed with EVERY Lngram output disabled, so
only the backbone's drift can move an address. Values are aggregated within
each document first, then averaged over documents; 95% CIs come from a
seeded document-level bootstrap (10,000 resamples), as in App. B.1.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from experiments.analysis import stats
from experiments.analysis.probe import (
    Windows,
    lngram_layers,
    probe,
    router_codes,
    without_lngram,
)
from lngram_jax.addressing import ngram_rows

METRICS = ("code_agreement", "hamming", "survival_2", "survival_3")
# Lngram v2 paper, Table 6 (final router fixed, Lngram off): layer, modality, then each metric
# as (new VLM, mature Keye2B).
PAPER_TABLE6 = [
    (1, "visual", (0.8859, 0.9883), (0.1204, 0.0118), (0.7900, 0.9769), (0.7079, 0.9657)),
    (1, "text", (0.9249, 0.9462), (0.0774, 0.0575), (0.8578, 0.9028), (0.7964, 0.8625)),
    (13, "visual", (0.7702, 0.9246), (0.2630, 0.0779), (0.6020, 0.8565), (0.4754, 0.7945)),
    (13, "text", (0.8971, 0.9163), (0.1081, 0.0866), (0.8072, 0.8356), (0.7254, 0.7616)),
]
PROTOCOLS = ("fixed", "own")


def _popcount(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.uint32)
  count = np.zeros(x.shape, np.int32)
  while np.any(x):
    count += (x & 1).astype(np.int32)
    x = x >> 1
  return count


@functools.partial(jax.jit, static_argnames=("order", "bits"))
def _survival(codes_a_NxTxR, codes_b_NxTxR, valid_NxT, *, order: int, bits: int):
  """(share of routes whose order-n row is unchanged [N, T], whole-window mask [N, T])."""
  rows_a, ok = ngram_rows(codes_a_NxTxR, order=order, bits=bits, valid=valid_NxT)
  rows_b, _ = ngram_rows(codes_b_NxTxR, order=order, bits=bits, valid=valid_NxT)
  return (rows_a == rows_b).mean(-1), ok


def pair_metrics(codes_a_NxTxR, codes_b_NxTxR, valid_NxT, bits: int) -> dict:
  """Per position values and masks of the four metrics for two code arrays.

  Returns {metric: (value_NxT float64, mask_NxT bool)}: the value averages over
  routes; the mask says where the metric is defined (a real byte; for survival
  also a whole order-n window).
  """
  a = np.asarray(codes_a_NxTxR, np.int32)
  b = np.asarray(codes_b_NxTxR, np.int32)
  valid = np.asarray(valid_NxT, bool)
  out = {"code_agreement": ((a == b).mean(-1), valid),
         "hamming": (_popcount(a ^ b).mean(-1) / bits, valid)}
  for n in (2, 3):
    share, ok = _survival(a, b, valid, order=n, bits=bits)
    out[f"survival_{n}"] = (np.asarray(share, np.float64), np.asarray(ok))
  return out


def doc_means(value_NxT, mask_NxT, doc_N, n_docs: int) -> np.ndarray:
  """Mean of the masked values within each document [n_docs]; NaN where none."""
  total = np.zeros(n_docs)
  count = np.zeros(n_docs)
  np.add.at(total, doc_N, np.where(mask_NxT, value_NxT, 0.0).sum(-1))
  np.add.at(count, doc_N, mask_NxT.sum(-1))
  with np.errstate(invalid="ignore", divide="ignore"):
    return total / count


def doc_interval(per_doc: np.ndarray, *, n_boot: int = 10_000, seed: int = 0) -> list[float]:
  """[mean over documents, 95% CI low, high]: documents resampled with replacement."""
  per_doc = np.asarray(per_doc, np.float64)
  per_doc = per_doc[np.isfinite(per_doc)]
  if per_doc.size == 0:
    return [float("nan")] * 3
  # One value per document, so the bootstrap of positions is one of documents.
  ci = stats.bootstrap_mean_ci(per_doc, np.arange(per_doc.size), n_boot=n_boot, seed=seed)
  return [float(ci.estimate), float(ci.lo), float(ci.hi)]


def checkpoint_codes(models: list, windows: Windows, *, batch: int = 16,
                     progress=None) -> dict:
  """{protocol: [ {layer: codes_NxTxR} per checkpoint ]} for the two protocols.

  `models` are the checkpoints in step order; the last one is the final router.
  """
  final = models[-1]
  layers = lngram_layers(final)
  own, fixed = [], []
  for k, model in enumerate(models):
    on = probe(model, windows, batch=batch)
    off = probe(without_lngram(model), windows, batch=batch)
    own.append({i: on[f"codes/{i}"] for i in layers})
    fixed.append({i: router_codes(final, i, off[f"input/{i}"]) for i in layers})
    if progress:
      progress(k + 1, len(models))
  return {"fixed": fixed, "own": own}


def address_stability(models: list, steps: list[int], windows: Windows, *,
                      n_boot: int = 10_000, seed: int = 0, batch: int = 16,
                      progress=None) -> dict:
  """Table 6 for adjacent checkpoints (`models` restored at `steps`, ascending).

  Returns a JSON-able dict: `rows` (one per protocol, layer and step pair, each
  metric as [mean, ci_low, ci_high]) and the sample sizes.
  """
  if len(models) != len(steps) or len(models) < 2:
    raise ValueError(f"address_stability needs two or more checkpoints; got steps {steps}.")
  bits = models[-1].blocks[lngram_layers(models[-1])[0]].memory.config.bits
  codes = checkpoint_codes(models, windows, batch=batch, progress=progress)
  rows = []
  for protocol in PROTOCOLS:
    per_step = codes[protocol]
    for layer in sorted(per_step[0]):
      for k in range(len(steps) - 1):
        values = pair_metrics(per_step[k][layer], per_step[k + 1][layer],
                              windows.valid_NxT, bits)
        row = {"protocol": protocol, "layer": int(layer),
               "from_step": int(steps[k]), "to_step": int(steps[k + 1])}
        for m in METRICS:
          per_doc = doc_means(*values[m], windows.doc_N, windows.n_docs)
          row[m] = doc_interval(per_doc, n_boot=n_boot, seed=seed)
        rows.append(row)
  return {"steps": [int(s) for s in steps], "rows": rows, "n_docs": windows.n_docs,
          "n_positions": windows.n_positions, "bits": int(bits), "n_boot": n_boot,
          "seed": seed, "primary": "fixed"}


def markdown(result: dict) -> str:
  """Table 6 as Markdown: mean [95% CI] per metric."""
  lines = ["| protocol | layer | steps | code agreement ↑ | Hamming ↓ | 2-gram survival ↑ "
           "| 3-gram survival ↑ |", "|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    cells = ["–" if None in r[m] or np.isnan(r[m]).any()   # no defined position
             else f"{r[m][0]:.4f} [{r[m][1]:.4f}, {r[m][2]:.4f}]" for m in METRICS]
    lines.append(f"| {r['protocol']} | {r['layer']} | {r['from_step']}→{r['to_step']} | "
                 + " | ".join(cells) + " |")
  if not result["rows"]:
    lines.append(f"| – | – | steps {result['steps']} | {result.get('note', '')} | | | |")
  lines.append(f"\n{result['n_docs']} documents, {result['n_positions']} positions; "
               f"CIs: {result['n_boot']} document bootstrap resamples (seed {result['seed']}). "
               "Primary protocol: `fixed` (final router, Lngram outputs off).")
  lines += ["", "Paper (Table 6, fixed protocol; new VLM / mature Keye2B):", "",
            "| layer | modality | code agreement | Hamming | 2-gram survival | 3-gram survival |",
            "|---|---|---|---|---|---|"]
  for layer, modality, *pairs in PAPER_TABLE6:
    lines.append(f"| {layer} | {modality} | "
                 + " | ".join(f"{a:.4f} / {b:.4f}" for a, b in pairs) + " |")
  return "\n".join(lines) + "\n"


def plot(result: dict, ax) -> None:
  """Each metric along the checkpoint pairs, one line per protocol and layer."""
  for protocol in PROTOCOLS:
    rows = [r for r in result["rows"] if r["protocol"] == protocol]
    for layer in sorted({r["layer"] for r in rows}):
      mine = [r for r in rows if r["layer"] == layer]
      x = [r["to_step"] for r in mine]
      for m, style in zip(METRICS, ("o-", "s--", "^-", "v-"), strict=True):
        est, lo, hi = (np.asarray([r[m][j] for r in mine], np.float64) for j in range(3))
        y, err = est, [est - lo, hi - est]
        ax.errorbar(x, y, yerr=err, fmt=style, capsize=2,
                    label=f"{protocol} L{layer} {m}", alpha=1.0 if protocol == "fixed" else 0.5)
  ax.set_xlabel("later checkpoint of the adjacent pair (step)")
  ax.set_ylabel("share")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=6, ncol=2)
