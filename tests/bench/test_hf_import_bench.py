"""experiments.bench.hf_import runs end to end on a tiny checkpoint and prints its table."""

import pytest

from experiments.bench import hf_import


@pytest.mark.slow   # two fresh processes importing jax and torch
def test_hf_import_bench_prints_both_loaders(tmp_path, capsys):
  pytest.importorskip("transformers")
  hf_import.main(["--dir", str(tmp_path / "ckpt"), "--layers", "1", "--tiny"])
  out = capsys.readouterr().out
  assert "| experiments.hf.load_hf |" in out and "| transformers from_pretrained |" in out
  assert "| ratio ours / transformers |" in out
