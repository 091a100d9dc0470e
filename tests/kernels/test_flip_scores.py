"""The flip-scores kernel (the one-bit surrogate's backward) against its XLA twin.

Kernel level, no model: row ids (with -1 = read and add nothing), a table, one
cotangent per id. Interpret mode on CPU with a tail block and duplicate ids
(which the table add must all accumulate); lowering for CUDA (Triton) on CPU at
the gpu shape; on a GPU, the real kernel, whose atomics race on hot rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import use_abstract_mesh
from lowering import H100

from kernels.flip_scores import flip_scores_reference
from kernels.flip_scores import triton_gpu as flip_kernel

FLIPS = (0, 1, 3, 5)


def _inputs(seed, n, rows, dim, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  table = jnp.asarray(rng.normal(size=(rows, dim)), dtype)
  ids = rng.integers(-1, rows, n)
  ids[-4:] = [7, 7, 7, -1]  # duplicates inside one block, and a -1
  g = jnp.asarray(rng.normal(size=(n, dim)), jnp.float32)
  return table, jnp.asarray(ids, jnp.int32), g


def _check(table, ids, g, tol, **kw):
  want_s, want_t = flip_scores_reference(table, ids, g, flips=FLIPS)
  got_s, got_t = flip_kernel.flip_scores(table, ids, g, flips=FLIPS, **kw)
  assert got_s.shape == (ids.shape[0], 1 + len(FLIPS)) and got_t.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got_s), np.asarray(want_s), rtol=tol, atol=tol)
  np.testing.assert_allclose(np.asarray(got_t), np.asarray(want_t), rtol=tol, atol=tol)
  assert float(jnp.max(jnp.abs(want_t[7]))) > 0
  assert np.all(np.asarray(got_s)[np.asarray(ids) < 0] == 0)
  return got_s


@pytest.mark.parametrize("dim", [16, 5], ids=["d16", "d5-padded"])
def test_kernel_equals_reference(dim):
  """37 ids in blocks of 8: a tail block; D = 16 and a D = 5 padded to 16."""
  table, ids, g = _inputs(dim, 37, 64, dim)
  got_s = _check(table, ids, g, 1e-5, block_w=8, interpret=True)
  # The same program without the table add returns the same scores.
  only_s, none = flip_kernel.flip_scores(table, ids, g, flips=FLIPS, block_w=8,
                                         with_table_grad=False, interpret=True)
  assert none is None
  np.testing.assert_array_equal(np.asarray(only_s), np.asarray(got_s))


def test_bad_arguments_are_rejected():
  table, ids, g = _inputs(0, 8, 64, 16)
  with pytest.raises(ValueError, match="block_w=6 must be a power of 2"):
    flip_kernel.flip_scores(table, ids, g, flips=FLIPS, block_w=6, interpret=True)
  with pytest.raises(ValueError, match=r"g \(8, 4\) must be \(N, D\)"):
    flip_kernel.flip_scores(table, ids, g[:, :4], flips=FLIPS, interpret=True)


@pytest.mark.parametrize("with_table_grad", [True, False])
def test_kernel_lowers_for_cuda(with_table_grad):
  """The gpu shape's order-3 table (R 64, M 4, Dm 128, bfloat16) over B·T·R = 8192·64 ids."""
  S = jax.ShapeDtypeStruct
  avals = (S((64 * 16**3, 128), jnp.bfloat16), S((8192 * 64,), jnp.int32),
           S((8192 * 64, 128), jnp.float32))
  f = functools.partial(flip_kernel.flip_scores, flips=tuple(range(12)),
                        with_table_grad=with_table_grad)
  with use_abstract_mesh(H100):
    text = jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_kernel_on_gpu(dtype):
  """100k ids on 256 rows (~400 atomic adds per row), D = 128, a tail block."""
  table, ids, g = _inputs(1, 100_003, 256, 128, dtype)
  with jax.default_matmul_precision("highest"):  # no TF32 in the XLA reference's dots
    _check(table, ids, g, 1e-3)
