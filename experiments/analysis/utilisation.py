"""Table 9 / App. C.1 of the Lngram v2 paper: are the discrete codes used, or collapsed?

Per Lngram layer, over the positions of the given records (both splits by
default: utilisation needs no reference/held-out separation): per route
N_eff = exp(H) of the code histogram, H / log C, the top code's share; their
means over routes, and the dead codes (never seen) over all R·C.
"""

from __future__ import annotations

import numpy as np

from experiments.analysis import stats
from experiments.analysis.id_readers import jsonable

# Lngram v2 paper, Table 9 (R = 128 routes, C = 16 codes: 2,048 per layer).
PAPER_TABLE9 = [
    # layer, effective codes, normalised entropy, top-code frequency, dead, total
    (1, 7.7916, 0.7210, 0.3206, 0, 2048),
    (13, 7.9979, 0.7291, 0.3093, 0, 2048),
]


def utilisation(*records, layers=None) -> dict:
  """Table 9 statistics of every Lngram layer over the positions of all `records`.

  Returns
  -------
  {"n_positions", "codes_per_route", "layers": {layer: {"n_eff", "normalised_entropy",
  "top_freq" (route means), "dead_codes", "total_codes", "per_route": {...: [R]}}}}
  """
  if not records:
    raise ValueError("utilisation: pass at least one PositionRecords")
  layers = tuple(records[0].layers if layers is None else layers)
  n_codes = 2 ** records[0].bits
  out = {"n_positions": int(sum(len(r.file_ids) for r in records)),
         "splits": [r.split for r in records], "codes_per_route": n_codes, "layers": {}}
  for layer in layers:
    codes_PxR = np.concatenate([np.asarray(r.codes[layer]) for r in records])
    u = stats.code_utilisation(codes_PxR, n_codes)
    out["layers"][str(layer)] = {
        "routes": int(codes_PxR.shape[1]),
        "n_eff": u["mean_n_eff"], "normalised_entropy": u["mean_normalised_entropy"],
        "top_freq": u["mean_top_freq"], "dead_codes": u["dead_codes"],
        "total_codes": u["total_codes"],
        "per_route": {key: u[key] for key in ("n_eff", "normalised_entropy", "top_freq",
                                              "dead")},
    }
  return jsonable(out)


def _row(layer, n_eff, ent, top, dead, total) -> str:
  def f(x, spec):
    return "—" if x is None else format(x, spec)
  return f"| {layer} | {f(n_eff, '.4f')} | {f(ent, '.4f')} | {f(top, '.4f')} | {dead:,} / {total:,} |"


def markdown(result: dict) -> str:
  """Table 9 as Markdown: our layers, then the paper's."""
  C = result["codes_per_route"]
  lines = [f"Code utilisation over {result['n_positions']} positions ({', '.join(result['splits'])};"
           f" {C} codes per route)", "",
           "| layer | effective codes | normalised entropy | top-code frequency | dead codes |",
           "| --- | --- | --- | --- | --- |"]
  for layer, row in result["layers"].items():
    lines.append(_row(layer, row["n_eff"], row["normalised_entropy"], row["top_freq"],
                      row["dead_codes"], row["total_codes"]))
  lines += ["", "Paper (Table 9; 128 routes x 16 codes):", "",
            "| layer | effective codes | normalised entropy | top-code frequency | dead codes |",
            "| --- | --- | --- | --- | --- |"]
  lines += [_row(*row) for row in PAPER_TABLE9]
  return "\n".join(lines) + "\n"
