"""The chunked cross entropy equals the one over full logits: values and gradients.

`chunked_token_nll` (experiments/models/cross_entropy.py) never holds more than one
chunk of logits; its twin `token_nll_reference` materialises [B, T, V]. Both
orientations of the output projection (a tied [V, D] table, an untied [D, V]),
chunks that divide T and that do not (padding), targets outside the vocabulary,
float32 and float64 (which stays float64).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from experiments.models.cross_entropy import (
    chunked_token_nll,
    default_chunk,
    token_nll_reference,
)

B, T, D, V = 2, 10, 8, 37


def _problem(dtype, vocab_axis, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(B, T, D)), dtype)
  w_shape = (V, D) if vocab_axis == 0 else (D, V)
  w = jnp.asarray(rng.normal(size=w_shape), dtype)
  targets = jnp.asarray(rng.integers(0, V, size=(B, T)), jnp.int32)
  weights = jnp.asarray(rng.normal(size=(B, T)), dtype)
  return x, w, targets, weights


PRECISIONS = {"f32": (jnp.float32, 2e-5), "f64": (jnp.float64, 1e-12)}
VOCAB_AXES = {"tied": 0, "untied": 1}
CHUNKS = {"c1": 1, "c5": 5, "c4_padded": 4, "c16": 16}


class ChunkedEqualsFullLogitsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(precision=sorted(PRECISIONS), orientation=sorted(VOCAB_AXES),
                         chunking=sorted(CHUNKS))
  def test_values_and_gradients_equal_the_full_logits(self, precision, orientation, chunking):
    dtype, tol = PRECISIONS[precision]
    with jax.enable_x64(dtype == jnp.float64):
      self._compare(dtype, tol, VOCAB_AXES[orientation], CHUNKS[chunking])

  def _compare(self, dtype, tol, vocab_axis, chunk):
    x, w, targets, weights = _problem(dtype, vocab_axis)

    def loss(fn, x, w):
      return jnp.sum(weights * fn(x, w, targets, vocab_axis=vocab_axis))

    chunked = self.variant(jax.value_and_grad(
        lambda x, w: loss(lambda *a, **k: chunked_token_nll(*a, **k, chunk=chunk), x, w),
        argnums=(0, 1)))
    reference = jax.value_and_grad(lambda x, w: loss(token_nll_reference, x, w), argnums=(0, 1))
    got, want = chunked(x, w), reference(x, w)
    chex.assert_type(jax.tree.leaves(got), dtype)
    chex.assert_trees_all_close(got, want, rtol=tol, atol=tol)


def test_reference_is_optax_cross_entropy_and_out_of_vocab_targets():
  x, w, targets, _ = _problem(jnp.float32, 1)
  logits = jnp.einsum("btd,dv->btv", x, w)
  want = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  np.testing.assert_allclose(token_nll_reference(x, w, targets, vocab_axis=1), want,
                             rtol=1e-5, atol=1e-5)
  # A target outside [0, V) reads no logit (nll = lse) and gets no one-hot gradient.
  bad = targets.at[0, 3].set(V).at[1, 0].set(-1)
  got = chunked_token_nll(x, w, bad, vocab_axis=1, chunk=4)
  np.testing.assert_allclose(got, token_nll_reference(x, w, bad, vocab_axis=1),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[0, 3], jax.nn.logsumexp(logits[0, 3]), rtol=1e-5)


def test_default_chunk_fits_the_budget():
  # 64 rows x 4,095 targets at Qwen3-VL's vocabulary: float32 logits of a chunk <= 1 GiB,
  # and the padding to a multiple of the chunk under one position per chunk.
  chunk = default_chunk(64, 4095, 151_936)
  assert 64 * chunk * 151_936 * 4 <= 1 << 30 and -4095 % chunk < 4095 // chunk
  assert default_chunk(2, 10, 37) == 10          # one chunk when it fits
  assert default_chunk(1, 191, 10**6, budget=128 * 4 * 10**6) == 96   # 2 x 96, not 2 x 128


def test_bad_shapes_are_refused():
  x, w, targets, _ = _problem(jnp.float32, 0)
  with pytest.raises(ValueError, match="vocab_axis"):
    chunked_token_nll(x, w, targets, vocab_axis=2)
  with pytest.raises(ValueError, match="does not match"):
    chunked_token_nll(x, w, targets, vocab_axis=1)
  with pytest.raises(ValueError, match=r"\[B, T\]"):
    chunked_token_nll(x, w, targets[:, :3], vocab_axis=0)


def test_a_frozen_projection_gets_no_weight_gradient():
  """Differentiated for x alone (a frozen unembedding, VLM Stage I), the backward does
  not compute dw: one matmul fewer per chunk, and dx is unchanged."""
  from experiments.plan.jaxpr_flops import jaxpr_flops
  x, w, targets, weights = _problem(jnp.float32, 1)

  def loss(x, w):
    return jnp.sum(weights * chunked_token_nll(x, w, targets, vocab_axis=1, chunk=5))

  both = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w)
  x_only = jax.make_jaxpr(jax.grad(loss, argnums=0))(x, w)
  per_product = 2 * B * T * D * V
  assert jaxpr_flops(both) == 4 * per_product    # logits twice, dx, dw
  assert jaxpr_flops(x_only) == 3 * per_product  # no dw
  chex.assert_trees_all_close(jax.grad(loss)(x, w), jax.grad(loss, argnums=(0, 1))(x, w)[0],
                              rtol=1e-6)
