"""experiments/tools/bench/targets.py: every absolute target of the GPU suite is a PASS/FAIL line
computed from the measured numbers (n/a when the run has no row of the target's shape).
Synthetic rows of each bench's own format; the Table 12 and PVM inputs come from the
benches' own `summarize`."""

import pytest

from experiments.tools.bench import lm_efficiency, pvm_decode_cost, targets


def _layer_row(readout, fwd, fwd_bwd, gib, **shape):
  return dict(table="layer", readout=readout, fwd_ms=fwd, fwd_bwd_ms=fwd_bwd, compiled_gib=gib,
              **{"d_model": 2048, "routes": 64, "batch": 8, "time": 1024, **shape})


def test_kernel_lines_judge_the_fastest_pallas_readout_and_layer():
  rows = [dict(table="readout r64", form="xla absorbed", fwd_bwd_ms=0.1),   # not a kernel
          dict(table="readout r64", form="pallas", fwd_bwd_ms=1.18),
          dict(table="readout r64", form="pallas token_block", fwd_bwd_ms=0.55),
          dict(table="readout r64", form="pallas sweep", error="boom"),
          dict(table="readout r121", form="pallas", fwd_bwd_ms=0.01),    # another shape
          _layer_row("pallas_fused", 0.7, 3.5, 0.9), _layer_row("absorbed", 1.2, 4.4, 1.5),
          _layer_row("pallas", 0.1, 0.1, 0.1, d_model=16)]               # the tiny layer
  readout, fwd, fwd_bwd, peak = targets.kernel_lines(rows)
  assert readout.startswith("readout fwd+bwd <= 0.6 ms") and ": PASS (0.550 ms, form " \
      "pallas token_block)" in readout
  assert ": PASS (0.700 ms, readout pallas_fused)" in fwd
  assert ": FAIL (3.500 ms, readout pallas_fused)" in fwd_bwd
  assert ": PASS (0.900 GiB, readout pallas_fused)" in peak
  tiny = targets.kernel_lines([dict(table="readout tiny", form="pallas", fwd_bwd_ms=0.01)])
  assert all(": n/a (no " in line for line in tiny) and len(tiny) == 4


def test_r512_lines_only_at_the_r512_shape():
  rows = {"dense decoder layer": dict(fwd_bwd_ms=1.0),
          "lngram pallas_fused / onebit": dict(fwd_bwd_ms=9.0, compiled_gib=3.5),
          "lngram absorbed / onebit": dict(fwd_bwd_ms=12.0, compiled_gib=2.5),
          "lngram absorbed / onebit (gather)": dict(fwd_bwd_ms=1.0)}   # a twin: not judged
  time_line, peak_line = targets.r512_lines(rows, "gpu_r512")
  assert ": PASS (9.000 ms, variant pallas_fused / onebit)" in time_line
  assert ": PASS (2.500 GiB, variant absorbed / onebit)" in peak_line
  rows["lngram absorbed / onebit"]["compiled_gib"] = 3.1
  assert ": FAIL (3.100 GiB" in targets.r512_lines(rows, "gpu_r512")[1]
  assert all(": n/a" in line for line in targets.r512_lines(rows, "gpu"))


def _lm_row(prefill_ms, decode_ms):
  return {"prefill": {"1024": {"best_ms": prefill_ms, "median_ms": prefill_ms,
                               "memory_gib": 1.0}},
          "decode": {B: {"best_ms_per_token": decode_ms, "median_ms_per_token": decode_ms}
                     for B in ("1", "8")}}


def test_lm_efficiency_lines_from_its_summary():
  rows = {"baseline": _lm_row(100.0, 10.0), "r64/m4/KV8": _lm_row(101.0, 10.3),
          "r16/m4/KV8": _lm_row(101.0, 10.1)}
  result = {"smoke": False, "summary": lm_efficiency.summarize(rows, [1024], [1, 8]),
            "layer_decode": {"batches": {"1": {"best_ms_per_token": 0.2}}}}
  lines = targets.lm_efficiency_lines(result)
  assert lines[0].startswith("decode <= 0.15 ms/token") and ": FAIL (0.2000 ms/token" in lines[0]
  by_key = {key: line for key in ("prefill 1024", "decode b1", "decode b8") for line in lines
            if f"(r64/m4/KV8, {key})" in line}
  assert ": PASS (+1.0% over the baseline)" in by_key["prefill 1024"]
  assert ": FAIL (+3.0% over the baseline)" in by_key["decode b1"]
  assert lines[-1] == "Table 12 overhead <= +2%, every Lngram row: FAIL (1 of 2 rows meet it)"
  none = targets.lm_efficiency_lines({"smoke": True, "summary": {}, "layer_decode": None})
  assert [line.split(": ")[1].split()[0] for line in none] == ["n/a", "n/a"]


@pytest.mark.parametrize("pvm_s, verdict", [(4.1e-3, "PASS"), (4.5e-3, "FAIL")])
def test_pvm_decode_line_is_the_projection(pvm_s, verdict):
  # t(L) = 2 + 1·L ms; a branch of 0.1 ms -> 38.3 / 38 (+0.8%); 0.5 ms -> +3.9%.
  s = pvm_decode_cost.summarize({"base_l1": [3e-3], "base_l2": [4e-3], "pvm_l2": [pvm_s]},
                                (1, 2))
  s["setup"] = {"widths": "8b"}
  (line,) = targets.pvm_decode_lines(s)
  pct = 100 * (s["projected"]["ratio"] - 1)
  assert line.startswith("PVM decode overhead <= +2% (projected to 36 layers, 3 branches): "
                         f"{verdict} ({pct:+.1f}%;")
  s["setup"]["widths"] = "tiny"
  assert "[widths tiny, not the target's 8b]" in targets.pvm_decode_lines(s)[0]


def test_layer_bench_measures_the_r512_peak(monkeypatch):
  """layer.run adds the compiled peak to the Lngram rows at the r512 shape (here the tiny
  shape standing in for it), which r512_lines then judges."""
  from experiments.tools.bench import layer
  monkeypatch.setitem(layer.SHAPES, "gpu_r512", layer.SHAPES["tiny"])
  result = layer.run(layer.SHAPES["tiny"], readouts=("absorbed",), surrogates=("onebit",),
                     repeats=1, log=lambda *_: None)
  row = result["rows"]["lngram absorbed / onebit"]
  assert 0 < row["compiled_gib"] < 0.01
  assert "compiled_gib" not in result["rows"]["dense decoder layer"]
  time_line, peak_line = targets.r512_lines(result["rows"], "gpu_r512")
  assert ": PASS (" in time_line or ": FAIL (" in time_line   # a loaded CPU's time
  assert ": PASS (" in peak_line and "variant absorbed / onebit)" in peak_line
