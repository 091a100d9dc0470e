"""App. B.3 injection and propagation on a toy two-layer model with Lngram in both layers."""

import numpy as np
import pytest
from flax import nnx

from experiments.analysis import injection
from experiments.analysis.probe import file_windows, probe, without_lngram
from experiments.models import DecoderLM, LMConfig, liven_lngram
from lngram_jax.config import LngramConfig

LNGRAM = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=4,
                      kv_heads=2, head_dim=8)
CONFIG = LMConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64,
                  max_len=32, memory_layers=(0, 1), memory=LNGRAM)


@pytest.fixture(scope="module")
def setup():
  rng = np.random.default_rng(1)
  docs = [rng.integers(0, 256, n).astype(np.uint8) for n in (30, 12, 20)]
  windows = file_windows(docs, seq_len=16, max_docs=3, windows_per_doc=2)
  model = liven_lngram(DecoderLM(CONFIG, rngs=nnx.Rngs(0)), key=3, w_o_std=0.3, conv_std=0.3)
  return model, windows


def test_js_and_cosine_on_known_cases():
  big = 50.0
  assert injection.js_divergence([[big, 0.0]], [[0.0, big]])[0] == pytest.approx(np.log(2))
  assert injection.js_divergence([[1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0]])[0] == pytest.approx(0)
  np.testing.assert_allclose(injection.cosine([[[1.0, 0.0], [1.0, 1.0]]],
                                              [[[0.0, 2.0], [-3.0, -3.0]]])[0], [0.0, -1.0])


def test_norm_ratio_per_document():
  num = np.ones((3, 2, 4))
  den = 2 * np.ones((3, 2, 4))
  den[2] = 4.0
  valid = np.ones((3, 2), bool)
  # Docs: rows 0-1 -> ratio 1/2; row 2 -> 1/4; mean over documents 3/8.
  r = injection.doc_norm_ratio(num, den, valid, np.array([0, 0, 1]), 2)
  assert r == pytest.approx(0.375)


def test_probe_parts_rebuild_the_block(setup):
  model, windows = setup
  out = probe(model, windows, batch=4, parts=True)
  for i in (0, 1):
    rebuilt = out[f"input/{i}"] + out[f"y/{i}"] + out[f"attn/{i}"] + out[f"mlp/{i}"]
    np.testing.assert_allclose(rebuilt, out["outputs_LxNxTxD"][i], rtol=1e-4, atol=1e-5)
  # Batches of 4 rows (the last one padded) give what one batch gives.
  whole = probe(model, windows, batch=64)
  np.testing.assert_allclose(whole["logits_NxTxV"], out["logits_NxTxV"], rtol=1e-5, atol=1e-5)


def test_disabled_lngram_outputs_zero(setup):
  model, windows = setup
  off = probe(without_lngram(model, (1,)), windows, parts=True)
  assert not np.any(off["y/1"]) and np.any(off["y/0"])
  assert np.any(model.blocks[1].memory.w_o[...])   # the original is left alone


def test_r_and_retention_by_hand(setup):
  model, windows = setup
  res = injection.injection(model, windows, batch=4)
  assert set(res["interventions"]) == {"0", "1", "all"}
  on = probe(model, windows, batch=4, parts=True)
  off = probe(without_lngram(model, (1,)), windows, batch=4, parts=True)
  v, d = windows.valid_NxT, windows.doc_N
  r1 = res["interventions"]["1"]
  # Layer 0 runs before the injection at layer 1: identical outputs.
  assert r1["R_by_layer"][0] == 0.0 and r1["retention_by_layer"][0] is None
  dh = on["outputs_LxNxTxD"][1] - off["outputs_LxNxTxD"][1]
  want_r, want_ret = [], []
  for doc in range(windows.n_docs):
    m = (d[:, None] == doc) & v
    want_r.append(np.sqrt((dh[m] ** 2).sum() / (on["outputs_LxNxTxD"][1][m] ** 2).sum()))
    want_ret.append(np.sqrt((dh[m] ** 2).sum() / (on["y/1"][m] ** 2).sum()))
  assert r1["final_R"] == pytest.approx(np.mean(want_r), rel=1e-6)
  assert r1["final_retention"] == pytest.approx(np.mean(want_ret), rel=1e-6)
  # The immediate difference is Y itself against the residual it joins.
  assert 0 < r1["immediate_R"] < 10
  for name in ("0", "1", "all"):
    r = res["interventions"][name]
    assert r["logit_R"] > 0 and r["js"] > 0 and 0 <= r["top1_agreement"] <= 1
  assert res["interventions"]["all"]["immediate_R"] is None
  for part in ("attn", "mlp", "attn+mlp"):
    c = r1["cosine"][part]
    assert -1 <= c["mean"] <= 1 and 0 <= c["mean_abs"] <= 1
  text = injection.markdown(res)
  assert "| layer 1 |" in text and "| all Lngram layers |" in text


def test_a_fresh_model_is_unchanged_by_disabling(setup):
  _, windows = setup
  fresh = DecoderLM(CONFIG, rngs=nnx.Rngs(2))   # W_O = 0 at init: Y is already 0
  res = injection.injection(fresh, windows)
  r = res["interventions"]["all"]
  assert r["R_by_layer"] == [0.0, 0.0] and r["logit_R"] == 0.0
  assert r["top1_agreement"] == 1.0 and r["js"] == pytest.approx(0.0, abs=1e-12)
