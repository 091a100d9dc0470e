"""App. B.2 address stability: metrics on hand-made code sequences, then on toy checkpoints."""

import numpy as np
import pytest
from flax import nnx

from experiments.analysis import stability
from experiments.analysis.probe import Windows, file_windows, probe, router_codes, without_lngram
from experiments.models import DecoderLM, LMConfig, liven_lngram
from lngram_jax.config import LngramConfig

LNGRAM = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=8)
CONFIG = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                  max_len=32, memory_layers=(0, 1), memory=LNGRAM)


def test_pair_metrics_on_hand_made_codes():
  # One route, M = 2, one window of 4 real bytes: a = 0 1 2 3, b = 0 1 0 3.
  a = np.array([[[0], [1], [2], [3]]])
  b = np.array([[[0], [1], [0], [3]]])
  valid = np.ones((1, 4), bool)
  m = stability.pair_metrics(a, b, valid, bits=2)
  agree, mask = m["code_agreement"]
  np.testing.assert_array_equal(agree[0], [1, 1, 0, 1])
  assert mask.all()
  np.testing.assert_allclose(m["hamming"][0][0], [0, 0, 0.5, 0])   # 2 vs 0: one bit of two
  # 2-grams end at t = 1, 2, 3: (0,1) (1,2) (2,3) vs (0,1) (1,0) (0,3): only the first survives.
  s2, ok2 = m["survival_2"]
  np.testing.assert_array_equal(ok2[0], [False, True, True, True])
  np.testing.assert_array_equal(s2[0][ok2[0]], [1, 0, 0])
  # 3-grams (0,1,2) (1,2,3) vs (0,1,0) (1,0,3): none survives.
  s3, ok3 = m["survival_3"]
  np.testing.assert_array_equal(ok3[0], [False, False, True, True])
  np.testing.assert_array_equal(s3[0][ok3[0]], [0, 0])


def test_pair_metrics_average_routes_and_skip_padding():
  # Two routes; route 1 differs everywhere (3 vs 0: both bits); the last byte is padding.
  a = np.array([[[1, 3], [2, 3], [1, 3]]])
  b = np.array([[[1, 0], [2, 0], [0, 0]]])
  valid = np.array([[True, True, False]])
  m = stability.pair_metrics(a, b, valid, bits=2)
  np.testing.assert_allclose(m["code_agreement"][0][0, :2], [0.5, 0.5])
  np.testing.assert_allclose(m["hamming"][0][0, :2], [0.5, 0.5])
  assert not m["code_agreement"][1][0, 2]
  s2, ok2 = m["survival_2"]
  np.testing.assert_array_equal(ok2[0], [False, True, False])   # the window on padding is out
  assert s2[0, 1] == 0.5
  assert not m["survival_3"][1].any()


def test_doc_means_and_interval():
  value = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]])
  mask = np.array([[True, True], [True, False], [False, False]])
  per_doc = stability.doc_means(value, mask, np.array([0, 0, 1]), 2)
  np.testing.assert_allclose(per_doc[0], (1.0 + 0.0 + 0.5) / 3)
  assert np.isnan(per_doc[1])   # no defined position: left out of the interval
  est, lo, hi = stability.doc_interval(np.array([0.2, 0.2, 0.2, np.nan]), n_boot=200)
  assert est == pytest.approx(0.2) and lo == pytest.approx(0.2) and hi == pytest.approx(0.2)
  a = stability.doc_interval(np.array([0.1, 0.5, 0.9, 0.3]), n_boot=500, seed=3)
  assert a == stability.doc_interval(np.array([0.1, 0.5, 0.9, 0.3]), n_boot=500, seed=3)
  assert a[1] < a[0] < a[2]


def _windows():
  rng = np.random.default_rng(0)
  docs = [rng.integers(0, 256, n).astype(np.uint8) for n in (40, 9, 0, 23)]
  return file_windows(docs, seq_len=16, max_docs=3, windows_per_doc=2, seed=0)


def test_file_windows_are_whole_documents_padded_at_the_end():
  docs = [np.arange(20, dtype=np.uint8), np.arange(5, dtype=np.uint8), np.zeros(0, np.uint8)]
  w = file_windows(docs, seq_len=8, max_docs=5, windows_per_doc=2)
  assert w.n_docs == 2   # the empty file is never drawn
  np.testing.assert_array_equal(w.doc_N, [0, 0, 1])
  np.testing.assert_array_equal(w.tokens_NxT[1], np.arange(8, 16))
  assert w.valid_NxT.sum() == 16 + 5 and w.n_positions == 21


def test_stability_of_toy_checkpoints():
  windows = _windows()
  early = liven_lngram(DecoderLM(CONFIG, rngs=nnx.Rngs(0)), key=1, w_o_std=0.3, conv_std=0.3)
  late = nnx.clone(early)
  # A drifted backbone (the first MLP) and a drifted router at layer 1.
  late.blocks[0].mlp.w_down[...] = late.blocks[0].mlp.w_down[...] * 3.0 + 0.05
  late.blocks[1].memory.router_w[...] = late.blocks[1].memory.router_w[...][:, ::-1]
  same = stability.address_stability([early, nnx.clone(early)], [1, 2], windows, n_boot=100)
  for row in same["rows"]:
    for m in stability.METRICS:
      assert row[m][0] == (0.0 if m == "hamming" else 1.0), (row, m)
  res = stability.address_stability([early, late], [1, 2], windows, n_boot=100)
  assert {(r["protocol"], r["layer"]) for r in res["rows"]} == {
      (p, lay) for p in ("fixed", "own") for lay in (0, 1)}
  by = {(r["protocol"], r["layer"]): r for r in res["rows"]}
  # Layer 0 reads the embedding: with Lngram off and one router, nothing can move it.
  assert by["fixed", 0]["code_agreement"][0] == 1.0
  # The own router of layer 1 changed, so its own-protocol codes moved more than the fixed ones.
  assert by["own", 1]["code_agreement"][0] < 1.0
  for row in res["rows"]:
    for m in stability.METRICS:
      est, lo, hi = row[m]
      assert 0.0 <= lo <= est <= hi <= 1.0
  assert "| fixed | 0 | 1→2 |" in stability.markdown(res)
  # The fixed protocol is the final router on the Lngram-off layer input.
  off = probe(without_lngram(early), windows)
  np.testing.assert_array_equal(
      stability.checkpoint_codes([early, late], windows)["fixed"][0][1],
      router_codes(late, 1, off["input/1"]))


def test_windows_type():
  w = _windows()
  assert isinstance(w, Windows) and w.tokens_NxT.dtype == np.int32
