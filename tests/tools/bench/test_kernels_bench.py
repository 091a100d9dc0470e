"""`python -m experiments.tools.bench.kernels --shape tiny` runs end to end (CPU smoke mode)."""

import json
import math

import pytest

from experiments.tools.bench import kernels as bench


@pytest.mark.slow  # a benchmark smoke run through interpret-mode kernels
def test_bench_tiny_smoke(capsys, tmp_path):
  bench.main(["--shape", "tiny", "--forms", "pallas", "--json", str(tmp_path / "k.json")])
  out = capsys.readouterr().out
  if "(cpu)" in out:
    assert "interpret mode" in out  # the warning that these times mean nothing
  rows = [line for line in out.splitlines() if line.startswith("| pallas |")]
  assert len(rows) == 2, out  # the layer row and the readout row
  for row in rows:
    assert "error" not in row, row
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert math.isfinite(float(cells[1])) and math.isfinite(float(cells[2])), row
  saved = json.loads((tmp_path / "k.json").read_text())
  assert [(r["table"], r.get("readout", r.get("form"))) for r in saved["rows"]] == [
      ("layer", "pallas"), ("readout tiny", "pallas")]
  for row, printed in zip(saved["rows"], rows, strict=True):  # the JSON holds the table's numbers
    cells = [c.strip() for c in printed.strip("|").split("|")]
    assert f"{row['fwd_ms']:.3f}" == cells[1] and f"{row['fwd_bwd_ms']:.3f}" == cells[2]


@pytest.mark.slow  # interpret-mode kernels
def test_a_layer_row_times_the_fused_readout_with_the_one_kernel_backward(capsys):
  rows = []
  bench.bench_layer(bench.TINY_LAYER, ["pallas_fused+triton"], repeats=1, inner=1, record=rows)
  assert [r["readout"] for r in rows] == ["pallas_fused+triton"]
  for r in rows:
    assert "error" not in r, r
    assert math.isfinite(r["fwd_ms"]) and math.isfinite(r["fwd_bwd_ms"]), r
  assert "| pallas_fused+triton |" in capsys.readouterr().out
