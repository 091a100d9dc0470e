"""experiments.tools.bench.hf_import runs end to end on a tiny checkpoint and prints its table."""

import json
import os

import pytest

from experiments.tools.bench import hf_import


@pytest.mark.slow   # two fresh processes importing jax and torch
def test_hf_import_bench_prints_both_loaders(tmp_path, capsys):
  pytest.importorskip("transformers")
  hf_import.main(["--dir", str(tmp_path / "ckpt"), "--layers", "1", "--tiny"])
  out = capsys.readouterr().out
  assert "| experiments.hf.load_hf |" in out and "| transformers from_pretrained |" in out
  assert "| ratio ours / transformers |" in out


def test_synthetic_checkpoint_is_reused_only_for_the_same_draw(tmp_path):
  out = tmp_path / "ckpt"
  weights = out / "model.safetensors"

  def rewritten(*args, **kwargs) -> bool:
    os.utime(weights, ns=(0, 0))   # an old stamp: any write moves it
    hf_import.write_checkpoint(out, *args, widths=hf_import.TINY, **kwargs)
    return weights.stat().st_mtime_ns != 0

  size = hf_import.write_checkpoint(out, 1, widths=hf_import.TINY)
  assert json.loads((out / "synthetic.json").read_text())["bytes"] == size
  assert not rewritten(1, reuse=True)          # the same draw: left as it is
  assert hf_import.write_checkpoint(out, 1, widths=hf_import.TINY, reuse=True) == size
  assert rewritten(1)                          # no reuse asked
  assert rewritten(1, seed=1, reuse=True)      # another seed
  assert rewritten(2, seed=1, reuse=True)      # another depth
  (out / "synthetic.json").unlink()            # a write cut short leaves no record
  assert rewritten(2, seed=1, reuse=True)
