"""One PNG per analysis result (what `analyze_lm` writes beside the JSON and Markdown).

A module with its own `plot(result, ax)` (stability, injection) draws itself;
the record analyses are drawn here from their JSON-able results. Any result
this file cannot draw still gets a PNG: its Markdown table as text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _num(values) -> np.ndarray:
  """JSON values (None for NaN) as floats."""
  return np.asarray([np.nan if v is None else v for v in values], np.float64)


def _bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
  width = 0.8 / max(len(series), 1)
  x = np.arange(len(groups))
  for i, (name, values) in enumerate(series.items()):
    ax.bar(x + i * width, _num(values), width, label=name)
  ax.set_xticks(x + 0.4 - width / 2, groups, fontsize=7)
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=7)


def plot_utilisation(result: dict, ax) -> None:
  """Effective codes of every route, one bar series per layer; C as a dashed line."""
  for layer, row in result["layers"].items():
    n_eff = _num(row["per_route"]["n_eff"])
    ax.plot(np.arange(len(n_eff)), n_eff, "o-", label=f"layer {layer}")
  ax.axhline(result["codes_per_route"], color="gray", ls="--", lw=1, label="C")
  ax.set_xlabel("route")
  ax.set_ylabel("effective codes exp(H)")
  ax.legend(fontsize=7)


def plot_id_knn(result: dict, ax) -> None:
  """Mean AP of each reader per (layer, target level)."""
  from experiments.analysis.id_readers import READERS
  groups, series = [], {r: [] for r in READERS}
  for layer, row in result["layers"].items():
    for level in row["ap"]["ID"]:
      groups.append(f"L{layer} {level}")
      for r in READERS:
        value = row["ap"].get(r, {}).get(level)   # older results lack surface_byte
        series[r].append(float("nan") if value is None else value)
  _bars(ax, groups, series, "mean AP")


def plot_associations(result: dict, ax) -> None:
  """Held-out P0 and P of the strongest replicated examples."""
  ex = result["examples"]
  if not ex:
    ax.text(0.5, 0.5, "no replicated association", ha="center", va="center")
    ax.set_axis_off()
    return
  _bars(ax, [e["expression"] for e in ex], {"P0": [e["P0"] for e in ex],
                                            "P": [e["P"] for e in ex]}, "rate on held-out")
  ax.tick_params(axis="x", labelrotation=70, labelsize=5)


def plot_distributed(result: dict, ax) -> None:
  """AP_m against the number of top routes m, per layer and level."""
  for layer, row in result["layers"].items():
    ms = row["ms"]
    for level in row["ap_s_dict"]:
      ax.plot(ms, _num([row["ap_m"][str(m)][level] for m in ms]), "o-",
              label=f"L{layer} {level}")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("top-m routes by |Δ_ref|")
  ax.set_ylabel("mean AP")
  ax.legend(fontsize=7)


PLOTTERS = {"utilisation": plot_utilisation, "id_knn": plot_id_knn,
            "associations": plot_associations, "distributed": plot_distributed}


def write_png(path, name: str, result: dict, module, text: str) -> Path:
  """Draws `result` into `path` (a PNG); falls back to the Markdown text."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  draw = getattr(module, "plot", None) or PLOTTERS.get(name)
  fig, ax = plt.subplots(figsize=(8, 4.5))
  try:
    if draw is None:
      raise KeyError(name)
    draw(result, ax)
    ax.set_title(name)
  except (KeyError, TypeError, ValueError, IndexError):
    # A result of another shape (e.g. an analysis changed its JSON): show its table.
    fig.clf()
    fig.text(0.01, 0.99, text, family="monospace", fontsize=5, va="top")
  fig.tight_layout()
  fig.savefig(path, dpi=120, format="png")
  plt.close(fig)
  return Path(path)
