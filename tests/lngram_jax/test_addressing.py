"""Hard codes and n-gram rows against the loop references of `lngram_jax.reference`.

The references are written from the conventions alone (bit j weighs 2^j; the
oldest symbol of a window is its least-significant digit; route r owns rows
[r·C^n, (r+1)·C^n); a window is invalid if it starts before the sequence, spans
two segments or touches padding), never from the code under test.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from lngram_jax import reference
from lngram_jax.addressing import codes_from_logits, ngram_rows

# Packed rows: segments of lengths 1, 2, 3, 1 and 2, 1, 1, 2, 1, 2 (several
# of length 1), with padding at the end of row 0 and inside row 1.
_SEGMENTS_2x9 = np.array([[0, 1, 1, 2, 2, 2, 3, 4, 4],
                          [5, 5, 6, 7, 8, 8, 9, 10, 10]], np.int32)
_VALID_2x9 = np.array([[1, 1, 1, 1, 1, 1, 1, 0, 0],
                       [1, 1, 1, 1, 0, 1, 1, 1, 1]], bool)


class CodesFromLogitsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1, 2, 3, 5, 8)
  def test_matches_loop(self, bits):
    rng = np.random.default_rng(bits)
    logits = rng.normal(size=(2, 3, 4, bits)).astype(np.float32)
    # Exact zeros (of both signs) are not > 0: their bit is 0.
    logits[0, 0, 0, :] = 0.0
    logits[0, 0, 1, :] = -0.0
    codes = self.variant(codes_from_logits)(jnp.asarray(logits))
    self.assertEqual(codes.dtype, jnp.int32)
    chex.assert_shape(codes, (2, 3, 4))
    np.testing.assert_array_equal(np.asarray(codes), reference.codes(logits))
    np.testing.assert_array_equal(np.asarray(codes[0, 0, :2]), [0, 0])

  def test_bit_weights(self):
    # One-hot bit j alone must give the code 2^j.
    bits = 5
    logits = -np.ones((1, 1, bits, bits), np.float32)
    for j in range(bits):
      logits[0, 0, j, j] = 1.0
    codes = codes_from_logits(jnp.asarray(logits))
    np.testing.assert_array_equal(np.asarray(codes)[0, 0], [2**j for j in range(bits)])

  def test_bf16_logits(self):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 4, 2, 3)).astype(np.float32)
    codes = codes_from_logits(jnp.asarray(logits, jnp.bfloat16))
    self.assertEqual(codes.dtype, jnp.int32)
    # bf16 rounding never changes a sign.
    np.testing.assert_array_equal(np.asarray(codes), reference.codes(logits))

  def test_rejects_integer_logits(self):
    with pytest.raises(TypeError, match="logits must be a floating array"):
      codes_from_logits(jnp.ones((1, 2, 3, 4), jnp.int32))

  def test_rejects_wrong_rank(self):
    with pytest.raises(ValueError, match=r"logits must have rank 4 \(\[B, T, R, M\]\)"):
      codes_from_logits(jnp.ones((2, 3, 4), jnp.float32))
    with pytest.raises(ValueError, match="rank 4"):
      jax.jit(codes_from_logits).trace(jnp.ones((1, 2, 3, 4, 5), jnp.float32))


class NgramRowsTest(chex.TestCase):

  def _check(self, fn, codes, order, bits, segment_ids=None, valid=None):
    rows, ok = fn(jnp.asarray(codes))
    self.assertEqual(rows.dtype, jnp.int32)
    self.assertEqual(ok.dtype, jnp.bool_)
    chex.assert_shape(rows, codes.shape)
    chex.assert_shape(ok, codes.shape[:2])
    want_rows, want_ok = reference.rows(codes, order=order, bits=bits,
                                        segment_ids=segment_ids, valid=valid)
    np.testing.assert_array_equal(np.asarray(ok), want_ok)
    rows = np.asarray(rows)
    C = 2**bits
    B, T, R = codes.shape
    for b in range(B):
      for t in range(T):
        for r in range(R):
          if want_ok[b, t]:
            self.assertEqual(int(rows[b, t, r]), int(want_rows[b, t, r]), (b, t, r))
          else:
            # Documented: invalid windows point at their route's first row.
            self.assertEqual(int(rows[b, t, r]), r * C**order, (b, t, r))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(order=(1, 2, 3), bits=(1, 2, 4))
  def test_plain(self, order, bits):
    rng = np.random.default_rng(10 * order + bits)
    codes = rng.integers(0, 2**bits, size=(2, 6, 3), dtype=np.int32)
    fn = self.variant(lambda c: ngram_rows(c, order=order, bits=bits))
    self._check(fn, codes, order, bits)
    # The first order-1 positions, and only those, are invalid.
    _, ok = fn(jnp.asarray(codes))
    np.testing.assert_array_equal(np.asarray(ok)[0], np.arange(6) >= order - 1)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(order=(1, 2, 3), bits=(2,))
  def test_segments_and_padding(self, order, bits):
    rng = np.random.default_rng(100 + 10 * order + bits)
    codes = rng.integers(0, 2**bits, size=(2, 9, 2), dtype=np.int32)
    segment_ids = jnp.asarray(_SEGMENTS_2x9)
    valid = jnp.asarray(_VALID_2x9)

    seg_fn = self.variant(
        lambda c, s: ngram_rows(c, order=order, bits=bits, segment_ids=s))
    self._check(lambda c: seg_fn(c, segment_ids), codes, order, bits,
                segment_ids=_SEGMENTS_2x9)

    pad_fn = self.variant(lambda c, v: ngram_rows(c, order=order, bits=bits, valid=v))
    self._check(lambda c: pad_fn(c, valid), codes, order, bits, valid=_VALID_2x9)

    both_fn = self.variant(
        lambda c, s, v: ngram_rows(c, order=order, bits=bits, segment_ids=s, valid=v))
    self._check(lambda c: both_fn(c, segment_ids, valid), codes, order, bits,
                segment_ids=_SEGMENTS_2x9, valid=_VALID_2x9)

  def test_hand_case(self):
    # C = 4, n = 3, R = 2: row = r·64 + a[t-2] + 4·a[t-1] + 16·a[t].
    codes = np.array([[[1, 0], [2, 3], [3, 1], [0, 2]]], np.int32)
    rows, ok = ngram_rows(jnp.asarray(codes), order=3, bits=2)
    np.testing.assert_array_equal(np.asarray(ok), [[False, False, True, True]])
    np.testing.assert_array_equal(
        np.asarray(rows)[0, 2:], [[1 + 4 * 2 + 16 * 3, 64 + 0 + 4 * 3 + 16 * 1],
                                  [2 + 4 * 3 + 16 * 0, 64 + 3 + 4 * 1 + 16 * 2]])

  def test_largest_rows_fit_int32(self):
    # R·C^n = 127·2^24 < 2^31: the top row is exact, nothing wraps.
    codes = jnp.full((1, 3, 127), 255, jnp.int32)
    rows, ok = ngram_rows(codes, order=3, bits=8)
    self.assertTrue(bool(ok[0, 2]))
    self.assertEqual(int(rows[0, 2, 126]), 127 * 2**24 - 1)
    self.assertEqual(int(rows[0, 2, 0]), 2**24 - 1)

  def test_rejects_overflow(self):
    # 128·2^24 = 2^31 rows do not fit int32 row ids.
    with pytest.raises(ValueError, match="overflows int32"):
      ngram_rows(jnp.zeros((1, 3, 128), jnp.int32), order=3, bits=8)
    with pytest.raises(ValueError, match="overflows int32"):
      jax.jit(lambda c: ngram_rows(c, order=4, bits=8)).trace(
          jnp.zeros((1, 4, 1), jnp.int32))

  def test_rejects_bad_input(self):
    with pytest.raises(TypeError, match="codes must be an integer array"):
      ngram_rows(jnp.zeros((1, 3, 2), jnp.float32), order=2, bits=2)
    with pytest.raises(ValueError, match=r"codes must have rank 3 \(\[B, T, R\]\)"):
      ngram_rows(jnp.zeros((3, 2), jnp.int32), order=2, bits=2)
    with pytest.raises(ValueError, match="order=0 must be >= 1"):
      ngram_rows(jnp.zeros((1, 3, 2), jnp.int32), order=0, bits=2)
    with pytest.raises(ValueError, match=r"segment_ids must have shape \(1, 3\)"):
      ngram_rows(jnp.zeros((1, 3, 2), jnp.int32), order=2, bits=2,
                 segment_ids=jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"valid must have shape \(1, 3\)"):
      jax.jit(lambda c, v: ngram_rows(c, order=2, bits=2, valid=v)).trace(
          jnp.zeros((1, 3, 2), jnp.int32), jnp.ones((3,), bool))
