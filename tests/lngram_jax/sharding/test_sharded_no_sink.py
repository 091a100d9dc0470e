"""sink=False (b0 = -inf) in the sharded forms: the route-parallel readout and its
log-sum-exp merge, the only sharded code that takes b0, add no sink; the result is
the plain softmax over all shards' routes. (Context parallelism and the generic
mode run the configured readout form, which test_no_sink.py covers.)"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from sharding_cases import assert_close, mesh

from lngram_jax.reference import softmax_readout
from lngram_jax.sharding import merge_partial_attention, sharded_readout

B, T, R, DR, HQ, HKV, DH = 2, 3, 16, 8, 4, 2, 4


def test_merge_without_sink_is_the_softmax_over_all_shards():
  # Two shards, one route each: scores 0 and 1, values 1 and 3.
  m = jnp.array([[0.0], [1.0]])
  total = jnp.ones((2, 1))
  u = jnp.array([[[1.0]], [[3.0]]])

  def merge(m, total, u):
    return merge_partial_attention(m, total, u, sink_logit=-math.inf, axis_name="shards")

  u_all, lse = jax.vmap(merge, axis_name="shards")(m, total, u)
  p = np.exp([0.0, 1.0]) / np.sum(np.exp([0.0, 1.0]))
  np.testing.assert_allclose(u_all[:, 0, 0], p[0] * 1 + p[1] * 3, rtol=1e-6)
  np.testing.assert_allclose(lse[:, 0], np.log(1 + np.e), rtol=1e-6)


def _values_and_grads(readout, args, cot, wrap=jax.jit):
  def loss(*a):
    o, lse = readout(*a)
    return jnp.sum(o * cot) + jnp.sum(jnp.sin(lse)), (o, lse)

  (_, (o, lse)), grads = wrap(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
      *args)
  names = ["grad_q", "grad_mem", "grad_w_k", "grad_w_v"]
  return jax.tree.map(np.asarray, {"o": o, "lse": lse, **dict(zip(names, grads, strict=True))})


class RouteParallelWithoutSinkTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_route_parallel_readout_without_sink_equals_plain_softmax(self):
    rng = np.random.default_rng(1)
    f32 = lambda *shape, s=1.0: jnp.asarray(s * rng.standard_normal(shape), jnp.float32)
    args = (f32(B, T, HQ, DH, s=3.0), f32(B, T, R, DR), f32(DR, HKV, DH), f32(DR, HKV, DH))
    cot = f32(B, T, HQ, DH)
    m = mesh(data=2, table=4)  # 4 routes per shard
    got = _values_and_grads(lambda *a: sharded_readout(*a, sink_logit=-math.inf, mesh=m),
                            args, cot, wrap=self.variant)
    chex.assert_tree_all_finite(got)  # b0 = -inf must not leak into a NaN
    assert_close(got, _values_and_grads(softmax_readout, args, cot))
