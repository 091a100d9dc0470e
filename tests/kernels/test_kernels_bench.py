"""`python -m kernels.bench --shape tiny` runs end to end (CPU smoke mode)."""

from kernels import bench


def test_bench_tiny_smoke(capsys):
  bench.main(["--shape", "tiny", "--forms", "pallas"])
  out = capsys.readouterr().out
  if "(cpu)" in out:
    assert "interpret mode" in out  # the warning that these times mean nothing
  rows = [line for line in out.splitlines() if line.startswith("| pallas |")]
  assert len(rows) == 2, out  # the layer row and the readout row
  for row in rows:
    assert "error" not in row, row
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and float(cells[2]) > 0, row  # fwd and fwd+bwd ms
