"""The demo trains end to end for a few steps (it is the quickest look at the layer)."""

import math

from lngram_jax import demo


def test_demo_runs_three_steps_with_and_without_memory(capsys):
  results = demo.main(["--steps", "3", "--log-every", "1", "--batch", "4", "--seq-len", "32",
                       "--train-bytes", "20000", "--val-bytes", "4000"])
  out = capsys.readouterr().out
  assert set(results) == {"lngram", "no memory"}
  for r in results.values():
    assert math.isfinite(r["train_bpb"]) and math.isfinite(r["val_bpb"])
    assert 0 < r["val_bpb"] < 12  # about log2(256) = 8 bits at the start
  lngram = results["lngram"]
  assert 0 < lngram["route_mass"] < 1
  assert len(lngram["codes_used_per_route"]) == 8
  assert all(1 <= n <= 16 for n in lngram["codes_used_per_route"])
  assert "[lngram] step    3" in out and "validation" in out and "distinct codes" in out


def test_stdlib_slice_is_deterministic():
  train_a, val_a, files_a = demo.stdlib_bytes(5000, 1000)
  train_b, val_b, files_b = demo.stdlib_bytes(5000, 1000)
  assert files_a == files_b and len(train_a) == 5000 and len(val_a) == 1000
  assert (train_a == train_b).all() and (val_a == val_b).all()
  assert train_a.max() < 256 and train_a.min() >= 0
