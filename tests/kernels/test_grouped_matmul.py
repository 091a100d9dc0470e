"""The grouped matmul (kernels/grouped_matmul): megablox and the Triton gmm/tgmm
(interpreted here) and XLA's ragged_dot equal the per-group twin in values and gradients,
with empty groups and rows past the last group; the dispatch follows the lowering platform
(megablox in a TPU program, the Triton kernels in a GPU program, ragged_dot on CPU and for
float64); float64 stays float64; bad inputs are refused."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from lowering import KERNEL_CALL, lower_text

from kernels.grouped_matmul import grouped_matmul, grouped_matmul_reference

M, K, N = 200, 64, 96
SIZES = (30, 0, 100, 50, 7)   # an empty group; 13 rows past the last one


def _inputs(dtype=jnp.float32, sizes=SIZES):
  k = jax.random.split(jax.random.key(0), 3)
  lhs = jax.random.normal(k[0], (M, K), dtype)
  rhs = jax.random.normal(k[1], (len(sizes), K, N), dtype)
  r = jax.random.normal(k[2], (M, N), dtype)
  return lhs, rhs, jnp.asarray(sizes, jnp.int32), r


def _value_and_grads(fn, lhs, rhs, sizes, r, wrap=jax.jit):
  return wrap(jax.value_and_grad(lambda a, b: jnp.sum(jnp.sin(fn(a, b, sizes)) * r),
                                 argnums=(0, 1)))(lhs, rhs)


class TwinTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(implementation=["megablox", "triton", "ragged_dot", None],
                         sizes=[SIZES, (0, 0, 200, 0, 0), (41, 40, 39, 40, 40)])
  def test_equals_the_per_group_twin_values_and_grads(self, implementation, sizes):
    lhs, rhs, group_sizes, r = _inputs(sizes=sizes)
    fn = functools.partial(grouped_matmul, implementation=implementation)
    out = self.variant(fn)(lhs, rhs, group_sizes)
    want = grouped_matmul_reference(lhs, rhs, group_sizes)
    chex.assert_trees_all_close(out, want, rtol=1e-5, atol=1e-4)
    assert not np.asarray(out[sum(sizes):]).any()   # rows past the groups are zero
    v, grads = _value_and_grads(fn, lhs, rhs, group_sizes, r, wrap=self.variant)
    v0, grads0 = _value_and_grads(grouped_matmul_reference, lhs, rhs, group_sizes, r)
    np.testing.assert_allclose(v, v0, rtol=1e-5)
    chex.assert_trees_all_close(grads, grads0, rtol=1e-4, atol=1e-4)
    empty = [g for g, s in enumerate(sizes) if s == 0]
    assert not np.asarray(grads[1][np.asarray(empty, int)]).any()   # no rows, no gradient


def test_float64_stays_float64_against_the_twin():
  with jax.enable_x64(True):
    lhs, rhs, sizes, r = _inputs(jnp.float64)
    v, grads = _value_and_grads(grouped_matmul, lhs, rhs, sizes, r)
    v0, grads0 = _value_and_grads(grouped_matmul_reference, lhs, rhs, sizes, r)
    chex.assert_type([v, *grads], jnp.float64)
    np.testing.assert_allclose(v, v0, rtol=1e-12)
    chex.assert_trees_all_close(grads, grads0, rtol=1e-11, atol=1e-11)
    with pytest.raises(ValueError, match="megablox multiplies float32 and bfloat16"):
      grouped_matmul(lhs, rhs, sizes, implementation="megablox")
    with pytest.raises(ValueError, match="Triton kernels multiply float32, bfloat16"):
      grouped_matmul(lhs, rhs, sizes, implementation="triton")
    f64 = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (lhs, rhs, sizes)]
    cuda = lower_text(grouped_matmul, f64, "cuda")   # no kernel multiplies float64
    assert "chlo.ragged_dot" in cuda and KERNEL_CALL["cuda"] not in cuda


def test_dispatch_follows_the_lowering_platform_forward_and_backward():
  lhs, rhs, sizes, _ = _inputs(jnp.bfloat16)
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (lhs, rhs, sizes)]

  def loss(lhs, rhs, sizes):
    return jnp.sum(grouped_matmul(lhs, rhs, sizes).astype(jnp.float32))

  grad = jax.grad(loss, argnums=(0, 1))
  tpu_forward = lower_text(loss, avals, "tpu").count(KERNEL_CALL["tpu"])
  tpu_backward = lower_text(grad, avals, "tpu").count(KERNEL_CALL["tpu"])
  # The gradient: the transposed gmm (d lhs) and tgmm (d rhs); the forward is unused.
  assert tpu_forward == 1 and tpu_backward == 2
  # XLA:GPU computes ragged_dot densely: a GPU program takes the Triton gmm (d lhs) and
  # tgmm (d rhs) instead.
  cuda = lower_text(grad, avals, "cuda")
  # (lowered, not compiled: the forward's gmm is still there; the compile drops it)
  assert cuda.count(KERNEL_CALL["cuda"]) == 3 and "chlo.ragged_dot" not in cuda
  cpu = lower_text(grad, avals, "cpu")     # jax's own lowering of ragged_dot: dots
  assert "dot_general" in cpu and "custom_call" not in cpu.replace("Sharding", "")


def test_megablox_compiles_for_a_tpu_chip():
  from lowering import tpu_devices
  device = tpu_devices("v5e:2x2")[0]
  lhs, rhs, sizes, _ = _inputs(jnp.bfloat16)
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype,
                                sharding=jax.sharding.SingleDeviceSharding(device))
           for a in (lhs, rhs, sizes)]
  step = jax.jit(jax.grad(lambda a, b, s: jnp.sum(grouped_matmul(a, b, s).astype(jnp.float32)),
                          argnums=(0, 1)))
  text = step.trace(*avals).lower().compile().as_text()
  assert "tpu_custom_call" in text or "custom-call" in text


@pytest.mark.parametrize("args, match", [
    (((4, 3), (2, 5, 6), (2,)), "must be \\[M, K\\] and \\[G, K, N\\]"),
    (((4, 5), (2, 5, 6), (3,)), "group_sizes"),
])
def test_bad_shapes_are_refused(args, match):
  lhs, rhs, sizes = (jnp.zeros(s, jnp.int32 if i == 2 else jnp.float32)
                     for i, s in enumerate(args))
  with pytest.raises(ValueError, match=match):
    grouped_matmul(lhs, rhs, sizes)
  with pytest.raises(ValueError, match="implementation='cutlass'"):
    grouped_matmul(jnp.zeros((4, 5)), jnp.zeros((2, 5, 6)), jnp.zeros(2, jnp.int32),
                   implementation="cutlass")
