"""`DecoderLM(scan=True)`: runs of branch-free blocks as one `lax.scan` over stacked weights.

The scanned model draws the unrolled model's weights and computes its numbers in
every mode: the parallel forward (logits, diagnostics, gradients), prefill over
ragged packed prompts (logits and caches) and decode step by step.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tree_checks import relative_to_reference

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
      chex.assert_trees_all_equal(jax.tree.map(lambda g, j=j: g[j], got), want)
  for name in ("embed", "final_norm"):
    chex.assert_trees_all_equal(nnx.state(getattr(scanned, name)),
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
  assert {"attn/0/probs", "attn/4/probs", "block/1/hidden", "memory/2/codes"} <= set(got_aux)
  chex.assert_trees_all_close((got, got_aux), (want, want_aux), **TOL)

  def loss(model):
    return jnp.mean(model(tokens_BxT, segment_ids=segment_ids_BxT) ** 2)

  grad = nnx.jit(nnx.grad(loss))   # eager, the backward pass dispatches op by op
  g_want, g_got = grad(unrolled), grad(scanned)
  # Scanned entries: layers (0, 1), the Lngram layer 2, layers (3, 4), the MLP layer 5.
  got = {"embed": g_got["embed"]["table"][...],
         "router_w": g_got["blocks"][1]["memory"]["router_w"][...],
         "w_q": g_got["blocks"][2]["attn"]["w_q"][...][1],
         "mlp_norm": g_got["blocks"][0]["mlp_norm"]["scale"][...][1]}
  want = {"embed": g_want["embed"]["table"][...],
          "router_w": g_want["blocks"][2]["memory"]["router_w"][...],
          "w_q": g_want["blocks"][4]["attn"]["w_q"][...],
          "mlp_norm": g_want["blocks"][1]["mlp_norm"]["scale"][...]}
  for name, w in want.items():
    assert float(jnp.max(jnp.abs(w))) > 0, name
  # Gradients are small: tolerances relative to each one's own scale,
  # |got - want| <= 1e-5·max|want| + 1e-4·|want|.
  chex.assert_trees_all_close(*relative_to_reference(got, want), rtol=1e-4, atol=1e-5)


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
  # Decode writes each row's token into every layer's slice of the stacks.
  for lc, (start, stop) in zip(got_cache.layers, scanned.layer_spans, strict=True):
    for i in range(start, stop):
      j = slice(None) if stop - start == 1 else i - start
      np.testing.assert_allclose(lc.k_BxSxHkvxDh[j], want_cache.layers[i].k_BxSxHkvxDh, **TOL)
      np.testing.assert_allclose(lc.v_BxSxHkvxDh[j], want_cache.layers[i].v_BxSxHkvxDh, **TOL)


def test_an_empty_scanned_cache_decodes_like_the_unrolled_one():
  unrolled, scanned = _pair()
  tokens_NxBx1 = _tokens((3, 2, 1))
  caches = [m.init_cache(2, 8) for m in (unrolled, scanned)]
  assert caches[1].layers[0].k_BxSxHkvxDh.shape == (2, 2, 8, 1, 16)
  for token_Bx1 in tokens_NxBx1:
    (want, caches[0]), (got, caches[1]) = (m.decode_step(token_Bx1, c) for m, c in
                                           zip((unrolled, scanned), caches, strict=True))
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, TOL), (jnp.bfloat16, dict(atol=2e-2))])
def test_decode_rows_attends_like_decode_without_writing_the_cache(dtype, tol):
  """The scanned layers' decode: the new key beside the cache, not in it, gives the
  output and rows of `decode`, whatever stale values sit in the slot being written
  and in slots the mask leaves out."""
  from experiments.models.attention import Attention

  attn = Attention(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, rope_theta=1e4,
                   dtype=dtype, param_dtype=jnp.float32, init_std=0.3, out_std=0.3,
                   rngs=nnx.Rngs(0))
  B, S = 3, 8
  rng = np.random.default_rng(0)
  k_BxSxHkvxDh, v_BxSxHkvxDh = (jnp.asarray(rng.normal(size=(B, S, 2, 8)), dtype)
                                for _ in range(2))
  x_Bx1xD = jnp.asarray(rng.normal(size=(B, 1, 32)), dtype)
  index_B = jnp.asarray([5, 0, 7], jnp.int32)
  rows_B = jnp.arange(B)
  # Row 0 reads slots 0-4 and 2 of them are masked out (another segment); row 1 has
  # no earlier slot; row 2 reads all 7.
  old_ok_BxS = jnp.arange(S)[None, :] < index_B[:, None]
  old_ok_BxS = old_ok_BxS.at[0, jnp.asarray([1, 3])].set(False)
  positions_Bx1 = index_B[:, None] + 2
  want_y, want_k, want_v = attn.decode(x_Bx1xD, positions_Bx1, k_BxSxHkvxDh, v_BxSxHkvxDh,
                                       index_B=index_B,
                                       key_ok_BxS=old_ok_BxS.at[rows_B, index_B].set(True))
  got_y, k_BxHkvxDh, v_BxHkvxDh = attn.decode_rows(x_Bx1xD, positions_Bx1, k_BxSxHkvxDh,
                                                   v_BxSxHkvxDh, key_ok_BxS=old_ok_BxS)
  assert got_y.dtype == want_y.dtype == dtype and k_BxHkvxDh.dtype == dtype
  np.testing.assert_allclose(np.float32(got_y), np.float32(want_y), **tol)
  np.testing.assert_array_equal(np.float32(k_BxSxHkvxDh.at[rows_B, index_B].set(k_BxHkvxDh)),
                                np.float32(want_k))
  np.testing.assert_array_equal(np.float32(v_BxSxHkvxDh.at[rows_B, index_B].set(v_BxHkvxDh)),
                                np.float32(want_v))


def test_decode_rows_is_refused_by_a_block_with_a_branch():
  _, scanned = _pair()
  (k,) = [k for k, (start, _) in enumerate(scanned.layer_spans) if start == 2]
  block, cache = scanned.blocks[k], scanned.init_cache(1, 8).layers[k]
  with pytest.raises(ValueError, match="decode_rows"):
    block(jnp.zeros((1, 1, 32)), BranchContext(), mode="decode_rows",
          positions_BxT=jnp.zeros((1, 1), jnp.int32), cache=cache,
          key_ok_BxS=jnp.zeros((1, 8), bool))
