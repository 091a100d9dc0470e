"""The GPU suite's absolute speed targets, one `NAME: PASS|FAIL|n/a (measured)` line each.

Every verdict is computed from the numbers the benchmark measured in the same run;
`n/a` means the run has no row of the target's shape (a smoke run, a failing row).
Where a table has several forms of the same thing (readouts), the target is judged
on the fastest (or smallest) one and the line names it. The targets:

  readout fwd+bwd <= 0.6 ms        the Pallas readout at N 8192, R 64, D 256 (kernels.py)
  layer fwd <= 0.8 ms, fwd+bwd <= 3 ms, peak <= 1 GiB
                                   LngramV2 at d 2048, r64/m4/KV8/mem128, B 8, T 1024
                                   (kernels.py's layer rows; peak: compiled fwd+bwd)
  r512 layer fwd+bwd <= 10 ms, peak <= 3 GiB
                                   r512/m4/KV8/mem256 at B 4, T 1024 (layer.py gpu_r512)
  decode <= 0.15 ms/token          one r64 layer, B 1, after a 1,024-token prefill
                                   (lm_efficiency.py's layer-decode table)
  Table 12 overhead <= +2%         prefill at 1024 and decode, r64/m4/KV8 against the
                                   baseline, and how many Lngram rows meet it (lm_efficiency.py)
  PVM decode overhead <= +2%       projected to 36 layers with 3 branches at Qwen3-VL-8B
                                   widths (pvm_decode_cost.py)

The Lngram training-step target (<= +5% at Qwen3-1.7B widths) is printed by
hf_train_step.py itself.
"""

from __future__ import annotations

READOUT_MS = 0.6
LAYER_FWD_MS, LAYER_FWD_BWD_MS, LAYER_GIB = 0.8, 3.0, 1.0
R512_FWD_BWD_MS, R512_GIB = 10.0, 3.0
TABLE12_PCT = 2.0
PVM_DECODE_PCT = 2.0
READOUT_TABLE = "readout r64"   # kernels.py's table at N 8192, R 64, D 256


def line(name: str, passed: bool | None, detail: str) -> str:
  verdict = {True: "PASS", False: "FAIL", None: "n/a"}[passed]
  return f"{name}: {verdict} ({detail})"


def _best(rows: list[dict], key: str) -> dict | None:
  rows = [r for r in rows if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
  return min(rows, key=lambda r: r[key]) if rows else None


def _at_most(name: str, rows: list[dict], key: str, limit: float, unit: str, label: str,
             shape: str) -> str:
  best = _best(rows, key)
  if best is None:
    return line(name, None, f"no {shape} row in this run")
  value = best[key]
  return line(name, value <= limit, f"{value:.3f} {unit}, {label} {best['_label']}")


def kernel_lines(rows: list[dict]) -> list[str]:
  """kernels.py: the r64 readout and the d 2048 layer targets from its JSON rows."""
  readout = [dict(r, _label=r["form"]) for r in rows
             if r.get("table") == READOUT_TABLE and r.get("form", "").startswith("pallas")
             and "error" not in r]
  layer = [dict(r, _label=r["readout"]) for r in rows
           if r.get("table") == "layer" and "error" not in r and r.get("d_model") == 2048
           and r.get("routes") == 64 and r.get("batch") == 8 and r.get("time") == 1024]
  return [
      _at_most(f"readout fwd+bwd <= {READOUT_MS} ms (N 8192, R 64, D 256)", readout,
               "fwd_bwd_ms", READOUT_MS, "ms", "form", "r64 Pallas readout"),
      _at_most(f"layer fwd <= {LAYER_FWD_MS} ms (d 2048, r64/m4/KV8/mem128, B 8, T 1024)",
               layer, "fwd_ms", LAYER_FWD_MS, "ms", "readout", "d 2048 layer"),
      _at_most(f"layer fwd+bwd <= {LAYER_FWD_BWD_MS} ms (same layer)", layer, "fwd_bwd_ms",
               LAYER_FWD_BWD_MS, "ms", "readout", "d 2048 layer"),
      _at_most(f"layer peak <= {LAYER_GIB:g} GiB (same layer, compiled fwd+bwd)", layer,
               "compiled_gib", LAYER_GIB, "GiB", "readout", "d 2048 layer"),
  ]


def r512_lines(rows: dict, shape_name: str) -> list[str]:
  """layer.py at gpu_r512: the Lngram rows' fwd+bwd and compiled peak."""
  # Every Lngram row but the reference twins ("(gather)"): the fastest variant is judged.
  lngram = ([dict(r, _label=n.removeprefix("lngram ")) for n, r in rows.items()
             if n.startswith("lngram") and not n.endswith("(gather)")]
            if shape_name == "gpu_r512" else [])
  return [
      _at_most(f"r512 layer fwd+bwd <= {R512_FWD_BWD_MS:g} ms (r512/m4/KV8/mem256, B 4, "
               "T 1024)", lngram, "fwd_bwd_ms", R512_FWD_BWD_MS, "ms", "variant",
               "gpu_r512 layer"),
      _at_most(f"r512 layer peak <= {R512_GIB:g} GiB (same layer, compiled fwd+bwd)", lngram,
               "compiled_gib", R512_GIB, "GiB", "variant", "gpu_r512 layer"),
  ]


def _pct(fraction) -> str:
  return f"{100 * fraction:+.1f}%"


def lm_efficiency_lines(result: dict, row: str = "r64/m4/KV8") -> list[str]:
  """lm_efficiency.py: the layer decode target and Table 12's overheads."""
  out = []
  smoke = " [smoke shape, not the target's]" if result.get("smoke") else ""
  ld = result.get("layer_decode") or {}
  b1 = (ld.get("batches") or {}).get("1")
  name = "decode <= 0.15 ms/token (one r64 layer, B 1, after a 1,024-token prefill)"
  out.append(line(name, None, "not measured in this run") if b1 is None else
             line(name, b1["best_ms_per_token"] <= 0.15,
                  f"{b1['best_ms_per_token']:.4f} ms/token, best of the rounds{smoke}"))
  summary = result.get("summary") or {}
  s = summary.get(row)
  for key, what in [(k, k.replace("_", " ")) for k in (s or {}).get("verdict", {})] or [
      ("prefill/decode", "prefill and decode")]:
    name = f"Table 12 overhead <= +{TABLE12_PCT:g}% ({row}, {what})"
    value = s and s.get(f"{key}_best")
    out.append(line(name, None, "no baseline or row in this run") if value is None else
               line(name, 100 * value <= TABLE12_PCT, f"{_pct(value)} over the baseline{smoke}"))
  met = [n for n, v in summary.items() if v.get("target_met") is not None]
  if met:
    passed = [n for n in met if summary[n]["target_met"]]
    out.append(line(f"Table 12 overhead <= +{TABLE12_PCT:g}%, every Lngram row",
                    len(passed) == len(met), f"{len(passed)} of {len(met)} rows meet it{smoke}"))
  return out


def pvm_decode_lines(summary: dict) -> list[str]:
  """pvm_decode_cost.py: the decode overhead projected to the paper's model."""
  p = summary["projected"]
  name = (f"PVM decode overhead <= +{PVM_DECODE_PCT:g}% (projected to {p['layers']} layers, "
          f"{p['branches']} branches)")
  if p["ratio"] is None:
    return [line(name, None, "per-layer time <= 0: too noisy to project")]
  value = p["ratio"] - 1
  widths = (summary.get("setup") or {}).get("widths", "8b")
  note = "" if widths == "8b" else f" [widths {widths}, not the target's 8b]"
  return [line(name, 100 * value <= PVM_DECODE_PCT,
               f"{_pct(value)}; paper {_pct(summary['paper']['ratio'] - 1)} on an H200{note}")]
