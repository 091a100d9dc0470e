"""Visual-only cross-attention against its reference twin, values and gradients."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pvm_jax import padding_bias, visual_attention, visual_attention_reference

B, T, NV, HQ, HKV, DH = 3, 4, 6, 4, 2, 8
# Example 0: all valid; 1: two padding tokens; 2: no valid token at all.
VALID = jnp.array([[1] * NV, [1, 1, 1, 1, 0, 0], [0] * NV], bool)


def qkv(seed=0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, T, HQ, DH)), jax.random.normal(kk, (B, NV, HKV, DH)),
          jax.random.normal(kv, (B, NV, HKV, DH)))


class MatchesReferenceTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_reference_values_and_probs(self):
    q, k, v = qkv()
    o, p = self.variant(lambda q, k, v: visual_attention(q, k, v, VALID, return_probs=True))(
        q, k, v)
    o_ref = jax.jit(visual_attention_reference)(q, k, v, VALID)
    chex.assert_trees_all_close(o, o_ref, rtol=1e-5, atol=1e-6)
    p = np.asarray(p)
    np.testing.assert_allclose(p[:2].sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(p[1, ..., 4:], 0.0)
    np.testing.assert_array_equal(p[2], 0.0)
    np.testing.assert_array_equal(np.asarray(o[2]), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_reference_gradients(self):
    q, k, v = qkv(1)
    w = jax.random.normal(jax.random.key(9), (B, T, HQ, DH))

    def loss(fn):
      return lambda q, k, v: jnp.sum(w * jnp.tanh(fn(q, k, v, VALID)))

    g = self.variant(jax.grad(loss(visual_attention), argnums=(0, 1, 2)))(q, k, v)
    g_ref = jax.jit(jax.grad(loss(visual_attention_reference), argnums=(0, 1, 2)))(q, k, v)
    chex.assert_tree_all_finite(g)
    chex.assert_trees_all_close(dict(zip("qkv", g, strict=True)),
                                dict(zip("qkv", g_ref, strict=True)), rtol=1e-4, atol=1e-6)
    # Padding tokens and the empty image receive no gradient.
    no_grad = {"k_padding": g[1][1, 4:], "v_empty_image": g[2][2]}
    chex.assert_trees_all_equal(no_grad, jax.tree.map(jnp.zeros_like, no_grad))


def test_hand_computed_single_head():
  # One query, two keys with scores 0 and ln 3 · √dh / √dh: weights 1/4, 3/4.
  dh = 4
  q = jnp.zeros((1, 1, 1, dh)).at[..., 0].set(1.0)
  k = jnp.zeros((1, 3, 1, dh)).at[0, 1, 0, 0].set(np.log(3.0) * np.sqrt(dh))
  v = jnp.arange(3 * dh, dtype=jnp.float32).reshape(1, 3, 1, dh)
  valid = jnp.array([[True, True, False]])
  o = jax.jit(visual_attention)(q, k, v, valid)
  np.testing.assert_allclose(np.asarray(o[0, 0, 0]), 0.25 * v[0, 0, 0] + 0.75 * v[0, 1, 0],
                             rtol=1e-6)


def test_padding_bias_uses_finfo():
  bias = padding_bias(jnp.array([True, False]), jnp.float32)
  assert float(bias[0]) == 0.0 and float(bias[1]) == float(jnp.finfo(jnp.float32).min)


def test_shape_errors():
  q, k, v = qkv()
  with pytest.raises(ValueError, match="k .* and v .* differ"):
    visual_attention(q, k, v[:, :2])
  with pytest.raises(ValueError, match="Hq a multiple of Hkv"):
    visual_attention(q[:, :, :3], k, v)
  with pytest.raises(ValueError, match=r"visual_valid must have shape \(3, 6\)"):
    visual_attention(q, k, v, VALID[:, :3])
