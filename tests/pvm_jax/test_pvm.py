"""The PVM module: zero-init identity, text mask, Theorem 4.1, cache, padding, bad inputs."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pvm_jax import PVM, PVMConfig, VisualCache, param_count

D, NV = 32, 5
CONFIG = PVMConfig(d_model=D, latent_dim=32, head_dim=8, backbone_gqa_ratio=2, latent_ffn_dim=24)


def make_pvm(config=CONFIG, gate=None, seed=0):
  pvm = PVM(config, rngs=nnx.Rngs(seed))
  if gate is not None:
    pvm.gate[...] = gate
  return pvm


@nnx.jit
def run(pvm, x, **kwargs):
  """pvm(x, **kwargs) under jit: one compile instead of hundreds of eager ops."""
  return pvm(x, **kwargs)


@nnx.jit
def run_probs(pvm, x, **kwargs):
  return pvm(x, return_probs=True, **kwargs)


def randn(seed, shape):
  return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def toy_ffn(x_BxTxD):
  """A fixed stand-in for the backbone's FFN(norm(x))."""
  w1, w2 = randn(100, (D, 48)), randn(101, (48, D))
  xn = x_BxTxD * jax.lax.rsqrt(jnp.mean(x_BxTxD**2, -1, keepdims=True) + 1e-6)
  return jax.nn.silu(xn @ w1) @ w2 / math.sqrt(48)


def test_gate_zero_gives_exactly_the_base_layer():
  pvm = make_pvm()
  x, v = randn(0, (2, 6, D)), randn(1, (2, NV, D))
  y = run(pvm, x, visual=v)
  np.testing.assert_array_equal(np.asarray(y), 0.0)
  base = x + toy_ffn(x)
  with_pvm = x + toy_ffn(x) + y
  np.testing.assert_array_equal(np.asarray(with_pvm), np.asarray(base))
  # W_up is not zero (our init), so the zero comes from λ alone.
  assert float(jnp.abs(pvm.w_up[...]).max()) > 0


def test_image_tokens_get_exactly_zero():
  pvm = make_pvm(gate=1.0)
  x, v = randn(0, (2, 6, D)), randn(1, (2, NV, D))
  text_mask = jnp.array([[0, 0, 0, 1, 1, 1], [0, 1, 0, 1, 1, 0]], bool)
  y = np.asarray(run(pvm, x, visual=v, text_mask=text_mask))
  image = ~np.asarray(text_mask)
  assert np.all(y[image] == 0.0)
  assert np.all(np.abs(y[~image]).max(-1) > 0.1)
  # A float 1/0 mask means the same thing.
  y_float = run(pvm, x, visual=v, text_mask=text_mask.astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(y_float), y)


def joint_visual_mass(q_Dh, k_vis_NvxDh, k_txt_TxDh):
  """The backbone's case: one softmax over visual AND text keys (Theorem 3.1)."""
  s = jnp.concatenate([k_vis_NvxDh, k_txt_TxDh]) @ q_Dh
  return float(jax.nn.softmax(s)[: k_vis_NvxDh.shape[0]].sum())


def test_output_does_not_depend_on_preceding_text():
  """Theorem 4.1: for a fixed hidden state x, more text before it changes nothing."""
  pvm = make_pvm(gate=0.7)
  v = jnp.broadcast_to(randn(1, (1, NV, D)), (3, NV, D))
  x_star = randn(2, (D,))
  # One batch, three rows: x_star at position 0, 3 and 40, after 0, 3 and 40
  # different text states (and followed by others).
  positions = (0, 3, 40)
  x = randn(3, (3, 41, D))
  x = x.at[jnp.arange(3), jnp.array(positions)].set(x_star)
  y, p = run_probs(pvm, x, visual=v)
  outs = [np.asarray(y[b, t]) for b, t in enumerate(positions)]
  probs = [np.asarray(p[b, t]) for b, t in enumerate(positions)]
  for out, prob in zip(outs[1:], probs[1:], strict=True):
    np.testing.assert_allclose(out, outs[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(prob, probs[0], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(probs[0].sum(-1), 1.0, rtol=1e-6)
  assert np.abs(outs[0]).max() > 0.1
  # Other hidden states do get other outputs (the comparison can fail).
  assert not np.allclose(np.asarray(y[0, 1]), outs[0], atol=1e-3)
  # The same query in a joint softmax over visual + text keys loses visual
  # mass as text accumulates: the contrast the theorem draws.
  q, k_vis = randn(3, (8,)), randn(4, (NV, 8))
  masses = [joint_visual_mass(q, k_vis, randn(5, (n, 8))) for n in positions]
  assert masses[0] == pytest.approx(1.0) and masses[0] > masses[1] > masses[2]


def test_cached_equals_uncached_and_decode_equals_parallel():
  pvm = make_pvm(gate=0.5)
  B, T = 2, 6
  x, v = randn(0, (B, T, D)), randn(1, (B, NV, D))
  valid = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  text_mask = jnp.array([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], bool)
  parallel = run(pvm, x, visual=v, visual_valid=valid, text_mask=text_mask)
  cache = pvm.visual_cache(v, valid)
  assert isinstance(cache, VisualCache)
  chex.assert_shape(cache.k, (B, NV, CONFIG.kv_heads, CONFIG.head_dim))
  cached = run(pvm, x, cache=cache, text_mask=text_mask)
  # Equal up to float rounding: the cache is built outside this jit, so XLA
  # may fuse the projections differently (1-ulp differences on jax 0.11).
  np.testing.assert_allclose(np.asarray(cached), np.asarray(parallel), rtol=1e-6, atol=1e-7)
  # Decode: one position per call against the same cache (the cache is a
  # pytree, so it passes through jit as an argument).
  decoded = jnp.concatenate(
      [run(pvm, x[:, t:t + 1], cache=cache, text_mask=text_mask[:, t:t + 1]) for t in range(T)],
      axis=1)
  np.testing.assert_allclose(np.asarray(decoded), np.asarray(parallel), rtol=1e-5, atol=1e-6)


def test_visual_padding_has_no_effect():
  pvm = make_pvm(gate=1.0)
  x, v = randn(0, (2, 6, D)), randn(1, (2, NV, D))
  valid = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]], bool)
  y = run(pvm, x, visual=v, visual_valid=valid)
  junk = v.at[:, 3:].set(jnp.array([1e4, -jnp.inf, jnp.nan, 3.0])[jnp.arange(D) % 4])
  y_junk = run(pvm, x, visual=junk, visual_valid=valid)
  np.testing.assert_array_equal(np.asarray(y_junk), np.asarray(y))
  y_trunc = run(pvm, x, visual=v[:, :3])
  np.testing.assert_allclose(np.asarray(y), np.asarray(y_trunc), rtol=1e-5, atol=1e-6)
  # Without the mask the padding tokens do change the output (the test can fail).
  assert not np.allclose(np.asarray(run(pvm, x, visual=v)), np.asarray(y), atol=1e-4)


def test_image_with_no_valid_token_gives_zero_and_finite_grads():
  pvm = make_pvm(gate=1.0)
  x, v = randn(0, (2, 6, D)), randn(1, (2, NV, D))
  valid = jnp.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], bool)
  y = run(pvm, x, visual=v, visual_valid=valid)
  np.testing.assert_array_equal(np.asarray(y[1]), 0.0)
  assert np.all(np.isfinite(np.asarray(y)))

  def loss(model):
    return jnp.sum(model(x, visual=v, visual_valid=valid) ** 2)

  grads = nnx.jit(nnx.grad(loss))(pvm)
  for leaf in jax.tree.leaves(grads):
    assert np.all(np.isfinite(np.asarray(leaf)))


def test_bfloat16_activations_track_float32():
  pvm = make_pvm(gate=1.0)
  pvm_bf16 = make_pvm(CONFIG.replace(dtype=jnp.bfloat16), gate=1.0)
  x, v = randn(0, (2, 6, D)), randn(1, (2, NV, D))
  y = run(pvm, x, visual=v)
  y_bf16 = run(pvm_bf16, x.astype(jnp.bfloat16), visual=v.astype(jnp.bfloat16))
  assert y_bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y_bf16, np.float32), np.asarray(y), atol=0.1)


def test_param_count_matches_module_and_paper():
  pvm = make_pvm()
  n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(pvm, nnx.Param)))
  assert n == param_count(CONFIG)["total"]
  # Qwen3-VL-8B: d 4096, FFN 12288, 32 query / 8 KV heads; PVM at 3 layers.
  qwen8b = PVMConfig(d_model=4096, backbone_ffn_dim=12288, backbone_gqa_ratio=4)
  assert (qwen8b.q_heads, qwen8b.kv_heads, qwen8b.ffn_dim) == (4, 1, 1536)
  abstract = nnx.eval_shape(lambda: PVM(qwen8b, rngs=nnx.Rngs(0)))
  n8b = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  assert n8b == param_count(qwen8b)["total"]
  assert round(3 * n8b / 1e6, 2) == 27.92


def test_qwen3_vl_4b_widths_truncate_the_latent_ffn_as_the_authors():
  """d 2560, FFN 9728, 32 query / 8 KV heads (GQA 4), d' 512, dh 128.

  int(512·(9728/2560)) = int(1945.6) = 1945 (rounding would give 1946 and
  1,536 extra parameters), and one branch then holds exactly 7,576,321.
  """
  qwen4b = PVMConfig(d_model=2560, latent_dim=512, head_dim=128, backbone_ffn_dim=9728,
                     backbone_gqa_ratio=4)
  assert (qwen4b.q_heads, qwen4b.kv_heads, qwen4b.ffn_dim) == (4, 1, 1945)
  counts = param_count(qwen4b)
  assert counts["total"] == 7_576_321
  assert counts["latent_ffn"] == 512 + 3 * 512 * 1945
  abstract = nnx.eval_shape(lambda: PVM(qwen4b, rngs=nnx.Rngs(0)))
  n = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  assert n == 7_576_321


@pytest.mark.parametrize(("changes", "pattern"), [
    (dict(d_model=0), "d_model=0"),
    (dict(latent_dim=30), "latent_dim=30 must be a multiple of head_dim=8"),
    (dict(latent_dim=72, head_dim=8, backbone_gqa_ratio=2), "query heads 9"),
    (dict(latent_ffn_dim=None), "latent_ffn_dim=None and backbone_ffn_dim=None"),
    (dict(up_init="ones"), "up_init='ones'"),
    (dict(eps=0.0), "eps=0.0"),
    (dict(backbone_gqa_ratio=0), "backbone_gqa_ratio=0"),
])
def test_config_rejects_bad_settings(changes, pattern):
  with pytest.raises(ValueError, match=pattern):
    CONFIG.replace(**changes)


def test_config_derives_heads_and_ffn_width():
  c = PVMConfig(d_model=64, latent_dim=32, head_dim=8, backbone_gqa_ratio=8, backbone_ffn_dim=176)
  assert (c.q_heads, c.kv_heads, c.ffn_dim, c.vis_dim) == (4, 1, 88, 64)


def test_bad_inputs_raise_clearly():
  pvm = make_pvm()
  x, v = randn(0, (2, 3, D)), randn(1, (2, NV, D))
  cache = pvm.visual_cache(v)
  cases = [
      (lambda: pvm(x[0], visual=v), ValueError, "x must have rank 3"),
      (lambda: pvm(x[..., :8], visual=v), ValueError, "d_model=32"),
      (lambda: pvm(x.astype(jnp.int32), visual=v), TypeError, "x must be a floating"),
      (lambda: pvm(x), ValueError, "exactly one of visual="),
      (lambda: pvm(x, visual=v, cache=cache), ValueError, "exactly one of visual="),
      (lambda: pvm(x, visual=v[..., :8]), ValueError, "visual width 32"),
      (lambda: pvm(x, visual=v, visual_valid=jnp.ones((2, 4), bool)), ValueError,
       r"visual_valid must have shape \(2, 5\)"),
      (lambda: pvm(x, visual=v, visual_valid=jnp.ones((2, NV))), TypeError, "must be bool"),
      (lambda: pvm(x, cache=cache, visual_valid=jnp.ones((2, NV), bool)), ValueError,
       "a cache already holds its mask"),
      (lambda: pvm(x[:1], cache=cache), ValueError, "cache batch 2 != x batch 1"),
      (lambda: pvm(x, visual=v, text_mask=jnp.ones((2, 4), bool)), ValueError,
       r"text_mask must have shape \(2, 3\)"),
      (lambda: pvm(x, cache=(cache.k, cache.v, cache.valid)), TypeError, "VisualCache"),
  ]
  for fn, err, pattern in cases:
    with pytest.raises(err, match=pattern):
      fn()
