"""The token-block readout rows of `experiments.tools.bench.kernels` (CPU smoke, interpret mode)."""

import math

import jax.numpy as jnp
import pytest

from experiments.tools.bench import kernels as bench


def test_token_block_rows_only_at_small_r():
  wanted = ["pallas", "pallas_token_block"]
  assert [n for n, _ in bench.token_block_forms(bench.READOUT_SHAPES["r64"], wanted, False)] == [
      "pallas token_block"]
  swept = bench.token_block_forms(bench.READOUT_SHAPES["r64"], wanted, True)
  assert len(swept) == 1 + len(bench.TOKEN_BLOCK_SWEEP)
  assert bench.token_block_forms(bench.READOUT_SHAPES["r121"], wanted, True) == []
  assert bench.token_block_forms(bench.READOUT_SHAPES["r64"], ["pallas"], True) == []


@pytest.mark.slow  # a benchmark row through the interpret-mode kernel
def test_token_block_row_runs(capsys):
  rows = []
  forms = bench.token_block_forms(bench.TINY_READOUT, ["pallas_token_block"], False)
  bench.bench_readout(bench.TINY_READOUT, forms, dtype=jnp.bfloat16, repeats=1, inner=1,
                      record=rows)
  out = capsys.readouterr().out
  assert [r["form"] for r in rows] == ["pallas token_block"], out
  assert "error" not in rows[0], rows[0]
  assert math.isfinite(rows[0]["fwd_ms"]) and math.isfinite(rows[0]["fwd_bwd_ms"])
  assert "| pallas token_block |" in out
