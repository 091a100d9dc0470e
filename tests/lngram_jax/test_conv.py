"""The short depthwise causal conv against the tap loop of `lngram_jax.reference`,
with and without packed segments, in values and gradients."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from lngram_jax import reference, short_conv


def _random(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape)


# (kernel size, dilation, T): the default (4, 3), reach past T, dilation 1, kernel 1.
CASES = [(4, 3, 13), (4, 3, 5), (3, 1, 7), (1, 2, 4)]
SEGMENTS = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2],
                     [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 7, 7]], np.int32)


class ShortConvTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*CASES)
  def test_matches_loop_reference(self, k, dilation, T):
    x = _random(0, (2, T, 3))
    kernel = _random(1, (k, 3))
    y = self.variant(short_conv, static_argnames="dilation")(x, kernel, dilation=dilation)
    np.testing.assert_allclose(y, reference.short_conv(x, kernel, dilation=dilation), rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_segments_match_loop_reference(self):
    x = _random(2, (2, 13, 3))
    kernel = _random(3, (4, 3))
    conv = self.variant(short_conv, static_argnames="dilation")
    y = conv(x, kernel, dilation=3, segment_ids=jnp.asarray(SEGMENTS))
    y_ref = reference.short_conv(x, kernel, dilation=3, segment_ids=SEGMENTS)
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    # The segments really cut taps: without them the result differs.
    self.assertGreater(np.max(np.abs(y_ref - reference.short_conv(x, kernel, dilation=3))), 0.1)

  def test_kernel_orientation_last_tap_is_current_step(self):
    # A one-hot kernel at tap i delays the input by (k-1-i)·dilation steps.
    x = _random(4, (1, 12, 2))
    k, dilation = 4, 3
    for tap in range(k):
      kernel = jnp.zeros((k, 2)).at[tap].set(1.0)
      delay = (k - 1 - tap) * dilation
      y = short_conv(x, kernel, dilation=dilation)
      np.testing.assert_array_equal(y[:, delay:], x[:, : 12 - delay])
      np.testing.assert_array_equal(y[:, :delay], 0.0)

  def test_each_segment_equals_its_own_sequence(self):
    x = _random(5, (2, 13, 3))
    kernel = _random(6, (4, 3))
    y = short_conv(x, kernel, dilation=3, segment_ids=jnp.asarray(SEGMENTS))
    for b in range(2):
      for seg in np.unique(SEGMENTS[b]):
        where = np.flatnonzero(SEGMENTS[b] == seg)
        # The segment alone, moved to t = 0 (zeros after it: causal, so unread).
        alone = jnp.zeros_like(x[:1]).at[0, : where.size].set(x[b, where])
        y_alone = short_conv(alone, kernel, dilation=3)[0, : where.size]
        np.testing.assert_allclose(y[b, where], y_alone, rtol=1e-6, atol=1e-6)

  @parameterized.parameters(False, True)
  def test_gradients_match_loop_reference(self, with_segments):
    x = _random(7, (2, 13, 3))
    kernel = _random(8, (4, 3))
    seg = jnp.asarray(SEGMENTS) if with_segments else None
    w = _random(9, x.shape)

    def loss(fn, x, kernel):
      return jnp.sum(w * fn(x, kernel, 3, seg))

    conv = lambda x, kernel, d, s: short_conv(x, kernel, dilation=d, segment_ids=s)
    grads = jax.grad(lambda *a: loss(conv, *a), argnums=(0, 1))(x, kernel)
    conv_ref = lambda x, kernel, d, s: reference.short_conv(x, kernel, dilation=d, segment_ids=s)
    grads_ref = jax.grad(lambda *a: loss(conv_ref, *a), argnums=(0, 1))(x, kernel)
    chex.assert_trees_all_close(grads, grads_ref, rtol=1e-5, atol=1e-5)

  def test_keeps_bfloat16(self):
    x = _random(10, (1, 6, 2)).astype(jnp.bfloat16)
    kernel = _random(11, (4, 2)).astype(jnp.bfloat16)
    y = short_conv(x, kernel, dilation=1)
    self.assertEqual(y.dtype, jnp.bfloat16)
    np.testing.assert_allclose(y.astype(jnp.float32), reference.short_conv(x, kernel, dilation=1),
                               rtol=2e-2, atol=2e-2)

  def test_bad_inputs_name_the_argument(self):
    x = jnp.zeros((1, 6, 2))
    with self.assertRaisesRegex(ValueError, "x must have rank 3"):
      short_conv(x[0], jnp.zeros((4, 2)), dilation=1)
    with self.assertRaisesRegex(ValueError, "kernel"):
      short_conv(x, jnp.zeros((4, 3)), dilation=1)
    with self.assertRaisesRegex(ValueError, "dilation=0"):
      short_conv(x, jnp.zeros((4, 2)), dilation=0)
    with self.assertRaisesRegex(ValueError, "segment_ids"):
      short_conv(x, jnp.zeros((4, 2)), dilation=1, segment_ids=jnp.zeros((1, 5), jnp.int32))
