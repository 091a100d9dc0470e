"""`python -m experiments.tools.bench.moe06b_params` prints the recipes' counts and Table 4's claim."""

from experiments.tools.bench import moe06b_params


def test_prints_counts_and_the_table4_claim(capsys):
  moe06b_params.main()
  out = capsys.readouterr().out
  assert "| moe06b_baseline.py | 593.15 | 253.42 | 0.00 | 0.00 | 1.311 |" in out
  assert "v2 vs v1: 82.6% fewer parameters, 95.2% fewer active" in out
