"""Route-parallel readout (partial softmax states, log-sum-exp merge, sink once)
== the unsharded absorbed readout, and the route-parallel layer == LngramV2."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sharding_cases import (
  assert_close,
  assert_nonzero,
  has_spec,
  mesh,
  packed_inputs,
  reference_layer,
  run,
)

from lngram_jax import absorbed_readout, sink_logit
from lngram_jax.sharding import (
  ShardingConfig,
  merge_partial_attention,
  partial_sink_attention,
  partial_sink_attention_reference,
  shard_layer,
  sharded_readout,
)

B, T, R, D, HQ, HKV, DH = 2, 3, 16, 8, 4, 2, 4


def _readout_problem():
  rng = np.random.default_rng(1)
  f32 = lambda *shape, s=1.0: jnp.asarray(s * rng.standard_normal(shape), jnp.float32)
  return (f32(B, T, HQ, DH, s=3.0), f32(B, T, R, D), f32(D, HKV, DH), f32(D, HKV, DH),
          f32(B, T, HQ, DH))


def _readout_grads(readout, q, mem, w_k, w_v, cot, wrap=jax.jit):
  def loss(q, mem, w_k, w_v):
    o, lse = readout(q, mem, w_k, w_v)
    return jnp.sum(o * cot) + jnp.sum(jnp.sin(lse)), (o, lse)

  (_, (o, lse)), grads = wrap(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(
      q, mem, w_k, w_v)
  out = {"o": o, "lse": lse}
  out.update({f"grad_{name}": g for name, g in zip(["q", "mem", "w_k", "w_v"], grads,
                                                   strict=True)})
  return jax.tree.map(np.asarray, out)


class RouteParallelReadoutTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_route_parallel_readout_equals_absorbed(self):
    q, mem, w_k, w_v, cot = _readout_problem()
    b0 = sink_logit(R, 0.5)
    want = _readout_grads(lambda *a: absorbed_readout(*a, sink_logit=b0, return_lse=True),
                          q, mem, w_k, w_v, cot)
    m = mesh(data=2, table=4)  # 4 routes per shard
    got = _readout_grads(lambda *a: sharded_readout(*a, sink_logit=b0, mesh=m),
                         q, mem, w_k, w_v, cot, wrap=self.variant)
    chex.assert_tree_all_finite(got)
    assert_close(got, want)
    assert_nonzero(want, ["grad_q", "grad_mem", "grad_w_k", "grad_w_v"])


def test_merge_counts_the_sink_once():
  # Two shards, each one route of score 0 and value 1, merged by hand over a
  # fake axis: α_r = 1 / (e^{b0} + 2), lse = log(e^{b0} + 2).
  b0 = 0.7
  m = jnp.zeros((2, 1))
  total = jnp.ones((2, 1))
  u = jnp.ones((2, 1, 1))

  def merge(m, total, u):
    return merge_partial_attention(m, total, u, sink_logit=b0, axis_name="shards")

  u_all, lse = jax.vmap(merge, axis_name="shards")(m, total, u)
  np.testing.assert_allclose(u_all[:, 0, 0], 2 / (np.exp(b0) + 2), rtol=1e-6)
  np.testing.assert_allclose(lse[:, 0], np.log(np.exp(b0) + 2), rtol=1e-6)


def test_partial_state_is_invariant_to_its_stabiliser():
  q, mem = _readout_problem()[:2]
  q_abs = jnp.einsum("bthd,de->bthe", q, jnp.ones((DH, D)))
  m, total, u = jax.jit(partial_sink_attention, static_argnames="scale")(q_abs, mem, scale=0.5)
  s = jnp.einsum("bthd,btrd->bthr", q_abs, mem) * 0.5
  np.testing.assert_allclose(m + jnp.log(total), jax.nn.logsumexp(s, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(u / total[..., None],
                             jnp.einsum("bthr,btrd->bthd", jax.nn.softmax(s), mem),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(jnp.float64, 1e-12), (jnp.float32, 2e-5),
                                       (jnp.bfloat16, 3e-2)])
def test_partial_state_backward_equals_autodiff_of_its_reference(dtype, tol):
  """The partial state's own backward (route tokens' gradient in one matmul of their
  dtype) against jax's gradient of `partial_sink_attention_reference`: float64 and
  float32 to round-off, bfloat16 within its precision; dtypes kept."""
  rng = np.random.default_rng(4)
  with jax.enable_x64(dtype == jnp.float64):
    q_abs = jnp.asarray(2 * rng.standard_normal((B, T, HQ, D)), dtype)
    mem = jnp.asarray(rng.standard_normal((B, T, R, D)), dtype)
    cot_l = jnp.asarray(rng.standard_normal((B, T, HQ)), jnp.promote_types(dtype, jnp.float32))
    cot_u = jnp.asarray(rng.standard_normal((B, T, HQ, D)), cot_l.dtype)

    def loss(form):
      def f(q, x):
        m, total, u = form(q, x, scale=0.5)
        return jnp.sum(total * cot_l) + jnp.sum(u * cot_u) + jnp.sum(m)
      return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(q_abs, mem)

    got_v, got_g = loss(partial_sink_attention)
    want_v, want_g = loss(partial_sink_attention_reference)
    for g, w, x in zip(got_g, want_g, (q_abs, mem), strict=True):
      assert g.dtype == x.dtype
      scale = float(jnp.max(jnp.abs(w.astype(jnp.float32)))) + 1e-30
      np.testing.assert_allclose(np.asarray(g, np.float64) / scale,
                                 np.asarray(w, np.float64) / scale, atol=tol, rtol=0)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-12)


def test_route_parallel_layer_equals_unsharded():
  # All three axes at once: routes over table, rows of the batch over data,
  # time over seq (halos cross the packed boundary at T/2).
  layer, inputs = reference_layer(), packed_inputs()
  want = run(layer, inputs)
  sharded = shard_layer(layer, mesh=mesh(data=2, seq=2, table=2),
                        sharding=ShardingConfig(mode="route_parallel"))
  assert has_spec(sharded.router_w[...], None, "table")
  assert has_spec(sharded.tables[1][...], "table", None)
  got = run(sharded, inputs)
  assert_close(got, want)
  assert_nonzero(want, ["grad_h", "grad/router_w", "grad/tables/0", "grad/tables/1",
                        "grad/w_kv", "grad/w_q", "grad/w_o", "grad/conv_kernel"])


def test_route_parallel_readout_with_the_kernel_equals_absorbed():
  """readout="pallas" on a table axis: each shard's partial state from the sink-readout
  kernel run without a sink (interpret mode, shards as a vmapped axis), merged with the
  sink once: values and gradients of the unsharded absorbed readout."""
  import functools

  from lngram_jax.sharding import route_parallel_readout
  q, mem, w_k, w_v, cot = _readout_problem()
  b0 = sink_logit(R, 0.5)
  want = _readout_grads(lambda *a: absorbed_readout(*a, sink_logit=b0, return_lse=True),
                        q, mem, w_k, w_v, cot)
  shards = 4   # 4 routes each

  def readout(q, mem, w_k, w_v):
    mem_SxBxTxRsxD = jnp.moveaxis(mem.reshape(B, T, shards, R // shards, D), 2, 0)
    per_shard = functools.partial(route_parallel_readout, sink_logit=b0, axis_name="table",
                                  kernel="interpret")
    o, lse = jax.vmap(per_shard, in_axes=(None, 0, None, None), axis_name="table")(
        q, mem_SxBxTxRsxD, w_k, w_v)
    return o[0], lse[0]   # identical on every shard

  got = _readout_grads(readout, q, mem, w_k, w_v, cot)
  assert_close(got, want, rtol=1e-4)
  assert_nonzero(want, ["grad_q", "grad_mem", "grad_w_k", "grad_w_v"])


def test_route_parallel_layer_with_readout_pallas_runs_on_cpu():
  """The layer with readout="pallas" on a mesh: on CPU its shards take the XLA partial
  state (an interpreted kernel cannot run inside shard_map), equal to the unsharded
  layer; the kernel's own state is checked above and lowers for TPU in the plan tests."""
  import dataclasses
  layer, inputs = reference_layer(), packed_inputs()
  want = run(layer, inputs)
  layer.config = dataclasses.replace(layer.config, readout="pallas")
  sharded = shard_layer(layer, mesh=mesh(data=2, table=4),
                        sharding=ShardingConfig(mode="route_parallel"))
  assert sharded.config.readout == "pallas"
  assert_close(run(sharded, inputs), want)
