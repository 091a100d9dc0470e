"""`DecoderLM(scan=True)`: runs of branch-free blocks as one `lax.scan` over stacked weights.

The scanned model draws the unrolled model's weights and computes its numbers in
every mode: the parallel forward (logits, diagnostics, gradients), prefill over
ragged packed prompts (logits and caches) and decode step by step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.models import BranchContext, DecoderLM, LMConfig, ParallelMLPConfig, liven_lngram
from experiments.models.lm import layer_spans
from lngram_jax.config import LngramConfig

MEMORY = LngramConfig(d_model=32, routes=4, bits=2, orders=(2, 3), mem_dim=8, q_heads=2,
                      kv_heads=1, head_dim=8)
# Layers 0-1 and 3-4 are runs without a branch (scanned); 2 holds Lngram, 5 the MLP.
CONFIG = LMConfig(d_model=32, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64,
                  vocab_size=256, max_len=32, memory_layers=(2,), memory=MEMORY,
                  ffn_branch_layers=(5,), ffn_branch=ParallelMLPConfig(d_model=32, hidden_dim=16))
TOL = dict(atol=1e-5, rtol=1e-5)


def _pair(config=CONFIG):
  return tuple(liven_lngram(DecoderLM(config, rngs=nnx.Rngs(0), scan=scan), key=3,
                            w_o_std=0.02, conv_std=0.5) for scan in (False, True))


def _tokens(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(1, 256, shape), jnp.int32)


def test_layer_spans():
  assert layer_spans(CONFIG, scan=False) == tuple((i, i + 1) for i in range(6))
  assert layer_spans(CONFIG, scan=True) == ((0, 2), (2, 3), (3, 5), (5, 6))
  plain = CONFIG.replace(memory_layers=(), memory=None, ffn_branch_layers=(), ffn_branch=None)
  assert layer_spans(plain, scan=True) == ((0, 6),)
  # A lone branch-free layer between two branched ones is not stacked.
  assert layer_spans(CONFIG.replace(memory_layers=(1, 3)), scan=True) == (
      (0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6))


def test_the_scanned_model_holds_the_unrolled_weights_stacked():
  unrolled, scanned = _pair()
  assert len(scanned.blocks) == 4
  for block, (start, stop) in zip(scanned.blocks, scanned.layer_spans, strict=True):
    got = nnx.state(block, nnx.Param)
    for i in range(start, stop):
      want = nnx.state(unrolled.blocks[i], nnx.Param)
      j = i - start if stop - start > 1 else ...
      jax.tree.map(lambda g, w, j=j: np.testing.assert_array_equal(g[j], w), got, want)
  for name in ("embed", "final_norm"):
    jax.tree.map(np.testing.assert_array_equal, nnx.state(getattr(scanned, name)),
                 nnx.state(getattr(unrolled, name)))


@pytest.mark.parametrize("remat", [False, True])
def test_forward_logits_aux_and_gradients_equal_the_unrolled_model(remat):
  unrolled, scanned = _pair(CONFIG.replace(remat=remat))
  tokens_BxT = _tokens((2, 12))
  segment_ids_BxT = jnp.asarray([[0] * 7 + [1] * 5, [0] * 12], jnp.int32)
  ctx = BranchContext(probe=True)

  def run(model):
    return nnx.jit(lambda m, t, s: m(t, segment_ids=s, return_aux=True, context=ctx))(
        model, tokens_BxT, segment_ids_BxT)

  (want, want_aux), (got, got_aux) = run(unrolled), run(scanned)
  np.testing.assert_allclose(got, want, **TOL)
  assert sorted(got_aux) == sorted(want_aux)
  assert {"attn/0/probs", "attn/4/probs", "block/1/hidden", "memory/2/codes"} <= set(got_aux)
  for key in want_aux:
    np.testing.assert_allclose(got_aux[key], want_aux[key], err_msg=key, **TOL)

  def loss(model):
    return jnp.mean(model(tokens_BxT, segment_ids=segment_ids_BxT) ** 2)

  def close(got, want):  # gradients are small: tolerances relative to their scale
    assert float(jnp.max(jnp.abs(want))) > 0
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(want))))

  grad = nnx.jit(nnx.grad(loss))   # eager, the backward pass dispatches op by op
  g_want, g_got = grad(unrolled), grad(scanned)
  close(g_got["embed"]["table"][...], g_want["embed"]["table"][...])
  # Scanned entries: layers (0, 1), the Lngram layer 2, layers (3, 4), the MLP layer 5.
  close(g_got["blocks"][1]["memory"]["router_w"][...],
        g_want["blocks"][2]["memory"]["router_w"][...])
  close(g_got["blocks"][2]["attn"]["w_q"][...][1], g_want["blocks"][4]["attn"]["w_q"][...])
  close(g_got["blocks"][0]["mlp_norm"]["scale"][...][1],
        g_want["blocks"][1]["mlp_norm"]["scale"][...])


def test_prefill_and_decode_equal_the_unrolled_model():
  unrolled, scanned = _pair()
  T, S, N = 8, 16, 4
  prompt_BxT = _tokens((3, T))
  lengths_B = jnp.asarray([8, 5, 1], jnp.int32)
  segment_ids_BxT = jnp.asarray([[0] * 3 + [1] * 5, [0] * 8, [0] * 8], jnp.int32)
  prefill = nnx.jit(lambda m, t: m.prefill(t, lengths=lengths_B, segment_ids=segment_ids_BxT,
                                          cache_len=S))
  (want, want_cache), (got, got_cache) = prefill(unrolled, prompt_BxT), prefill(scanned,
                                                                                 prompt_BxT)
  valid_BxT = jnp.arange(T)[None, :] < lengths_B[:, None]
  np.testing.assert_allclose(jnp.where(valid_BxT[..., None], got, 0),
                             jnp.where(valid_BxT[..., None], want, 0), **TOL)
  # Stacked caches hold the unrolled layers' caches in layer order.
  assert [lc.k_BxSxHkvxDh.shape[0] for lc in got_cache.layers] == [2, 3, 2, 3]
  for lc, (start, stop) in zip(got_cache.layers, scanned.layer_spans, strict=True):
    for i in range(start, stop):
      k = lc.k_BxSxHkvxDh if stop - start == 1 else lc.k_BxSxHkvxDh[i - start]
      np.testing.assert_allclose(k, want_cache.layers[i].k_BxSxHkvxDh, **TOL)
  decode = nnx.jit(lambda m, t, c: m.decode_step(t, c))
  for step, token_Bx1 in enumerate(_tokens((N, 3, 1), seed=1)):
    want, want_cache = decode(unrolled, token_Bx1, want_cache)
    got, got_cache = decode(scanned, token_Bx1, got_cache)
    np.testing.assert_allclose(got, want, err_msg=f"decode step {step}", **TOL)


def test_an_empty_scanned_cache_decodes_like_the_unrolled_one():
  unrolled, scanned = _pair()
  tokens_NxBx1 = _tokens((3, 2, 1))
  caches = [m.init_cache(2, 8) for m in (unrolled, scanned)]
  assert caches[1].layers[0].k_BxSxHkvxDh.shape == (2, 2, 8, 1, 16)
  for token_Bx1 in tokens_NxBx1:
    (want, caches[0]), (got, caches[1]) = (m.decode_step(token_Bx1, c) for m, c in
                                           zip((unrolled, scanned), caches, strict=True))
    np.testing.assert_allclose(got, want, **TOL)
