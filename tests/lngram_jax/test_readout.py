"""The sink readout: literal, streaming and absorbed forms against each other and by hand.

All three forms take (q, x̂, W_K, W_V); they must agree in values, in the float32
log-sum-exp, and in the gradients of all four inputs. `sink_readout` itself is
checked against the per-head loop of `lngram_jax.reference` (`sink_gqa_reference`),
and the sink against closed forms.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

from lngram_jax import (
  absorbed_readout,
  literal_readout,
  reference,
  route_mass_from_lse,
  sink_logit,
  sink_readout,
  streaming_readout,
)

B, T, HQ, HKV, DH, R, D = 2, 3, 4, 2, 8, 6, 10


def _inputs(seed=0, dtype=jnp.float32, routes=R):
  kq, km, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(kq, (B, T, HQ, DH))
  mem = jax.random.normal(km, (B, T, routes, D))
  w_k = 0.5 * jax.random.normal(kk, (D, HKV, DH))
  w_v = 0.5 * jax.random.normal(kv, (D, HKV, DH))
  return tuple(x.astype(dtype) for x in (q, mem, w_k, w_v))


def _form(name, chunk=None):
  if name == "literal":
    return literal_readout
  if name == "absorbed":
    return absorbed_readout
  return functools.partial(streaming_readout, chunk=chunk)


def _value_and_grads(q, mem, w_k, w_v, g_o, g_lse, b0, *, name, chunk=None):
  """(o, lse) and the vjp of the cotangents (g_o, g_lse) for all four inputs.

  Module-level with static `name`/`chunk` and a traced b0, so that every test
  that asks for the same form at the same shapes reuses one compilation.
  """
  fn = lambda *x: _form(name, chunk)(*x, sink_logit=b0, return_lse=True)
  (o, lse), vjp = jax.vjp(fn, q, mem, w_k, w_v)
  return o, lse, vjp((g_o.astype(o.dtype), g_lse))


_value_and_grads_jit = jax.jit(_value_and_grads, static_argnames=("name", "chunk"))


def _cotangents(seed=1):
  ko, kl = jax.random.split(jax.random.PRNGKey(seed))
  return jax.random.normal(ko, (B, T, HQ, DH)), jax.random.normal(kl, (B, T, HQ))


def _readout_vjp(name, chunk, inputs, b0, jit=True):
  run = _value_and_grads_jit if jit else _value_and_grads
  return run(*inputs, *_cotangents(), jnp.float32(b0), name=name, chunk=chunk)


def _rel_err(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


class FormsAgreeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ("streaming_chunk4_ragged", "streaming", 4),
      ("absorbed", "absorbed", None),
  )
  def test_float32_values_lse_and_grads_match_literal(self, name, chunk):
    run = self.variant(_value_and_grads, static_argnames=("name", "chunk"))
    self._check_against_literal(functools.partial(run, name=name, chunk=chunk))

  @parameterized.named_parameters(
      ("streaming_chunk2_divides", "streaming", 2),
      ("streaming_chunk_gt_R", "streaming", 16),
  )
  def test_float32_other_chunk_sizes_match_literal(self, name, chunk):
    self._check_against_literal(
        functools.partial(_value_and_grads_jit, name=name, chunk=chunk))

  def _check_against_literal(self, run):
    inputs = _inputs()
    b0 = jnp.float32(sink_logit(R, 0.5))
    o, lse, grads = run(*inputs, *_cotangents(), b0)
    o_ref, lse_ref, grads_ref = _readout_vjp("literal", None, inputs, b0)
    chex.assert_trees_all_equal_shapes_and_dtypes((o, lse, grads), (o_ref, lse_ref, grads_ref))
    chex.assert_trees_all_close((o, lse), (o_ref, lse_ref), rtol=1e-5, atol=1e-6)
    for arg, g_ref in zip(("q", "mem", "w_k", "w_v"), grads_ref, strict=True):
      self.assertGreater(float(jnp.max(jnp.abs(g_ref))), 0.0, arg)
    chex.assert_trees_all_close(grads, grads_ref, rtol=1e-5, atol=1e-5)

  @parameterized.named_parameters(
      ("literal", "literal", None),
      ("streaming_ragged", "streaming", 4),
      ("absorbed", "absorbed", None),
  )
  def test_bfloat16_loosely_matches_float32_literal(self, name, chunk):
    inputs = _inputs(seed=3, dtype=jnp.bfloat16)
    b0 = sink_logit(R, 0.5)
    o, lse, grads = _readout_vjp(name, chunk, inputs, b0)
    self.assertEqual(o.dtype, jnp.bfloat16)
    self.assertEqual(lse.dtype, jnp.float32)  # softmax statistics stay float32
    ref_inputs = tuple(x.astype(jnp.float32) for x in inputs)
    o_ref, lse_ref, grads_ref = _readout_vjp("literal", None, ref_inputs, b0)
    self.assertLess(_rel_err(o, o_ref), 3e-2)
    self.assertLess(_rel_err(lse, lse_ref), 1e-2)
    for arg, g, g_ref in zip(("q", "mem", "w_k", "w_v"), grads, grads_ref, strict=True):
      self.assertEqual(g.dtype, jnp.bfloat16, arg)
      self.assertLess(_rel_err(g, g_ref), 5e-2, arg)


class SinkReadoutTest(chex.TestCase):

  @parameterized.parameters(0.5, 0.2)
  def test_matches_per_head_loop_reference(self, mu0):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(7), 3)
    q = jax.random.normal(kq, (B, T, HQ, DH))
    k = jax.random.normal(kk, (B, T, R, HKV, DH))
    v = jax.random.normal(kv, (B, T, R, HKV, DH))
    b0 = sink_logit(R, mu0)
    o, lse = sink_readout(q, k, v, sink_logit=b0, return_lse=True)
    o_ref, lse_ref = reference.sink_gqa_reference(q, k, v, sink_logit=b0)
    chex.assert_trees_all_close((o, lse), (o_ref, lse_ref), rtol=1e-5, atol=1e-6)

  def test_literal_readout_is_sink_readout_of_projections(self):
    q, mem, w_k, w_v = _inputs(seed=5)
    b0 = sink_logit(R, 0.5)
    o_ref, lse_ref = reference.readout(q, mem, w_k, w_v, sink_logit=b0)
    o, lse = literal_readout(q, mem, w_k, w_v, sink_logit=b0, return_lse=True)
    chex.assert_trees_all_close((o, lse), (o_ref, lse_ref), rtol=1e-5, atol=1e-5)


ALL_FORMS = [("literal", "literal", None), ("streaming", "streaming", 4),
             ("absorbed", "absorbed", None)]


class SinkByHandTest(chex.TestCase):
  """Every route holds the same token, so every route has the same score s."""

  def _equal_route_inputs(self, w_k_scale, seed=11):
    q, mem, w_k, w_v = _inputs(seed=seed)
    mem_same = jnp.broadcast_to(mem[:, :, :1], mem.shape)
    return q, mem_same, w_k_scale * w_k, w_v

  @parameterized.named_parameters(
      *[(f"{n}_mu{mu}", n, c, mu) for n, _, c in ALL_FORMS for mu in (0.5, 0.2, 0.9)])
  def test_zero_scores_give_route_mass_mu0(self, name, chunk, mu0):
    # W_K = 0 makes every score exactly 0: mass = R/(e^b0 + R) = μ0.
    q, mem, w_k, w_v = self._equal_route_inputs(0.0)
    b0 = sink_logit(R, mu0)
    o, lse = _form(name, chunk)(q, mem, w_k, w_v, sink_logit=b0, return_lse=True)
    np.testing.assert_allclose(route_mass_from_lse(lse, b0), mu0, rtol=1e-5)
    # With equal values the output is the route mass times that value.
    v0 = np.einsum("btd,dkh->btkh", np.float64(mem[:, :, 0]), np.float64(w_v))
    v0_per_q_head = np.repeat(v0, HQ // HKV, axis=2)
    np.testing.assert_allclose(o, mu0 * v0_per_q_head, rtol=1e-5, atol=1e-6)

  @parameterized.named_parameters(*ALL_FORMS)
  def test_equal_scores_give_closed_form_mass(self, name, chunk):
    q, mem, w_k, w_v = self._equal_route_inputs(1.0)
    b0 = sink_logit(R, 0.5)
    k0 = np.einsum("btd,dkh->btkh", np.float64(mem[:, :, 0]), np.float64(w_k))
    s = np.einsum("btkgh,btkh->btkg", np.float64(q).reshape(B, T, HKV, HQ // HKV, DH),
                  k0).reshape(B, T, HQ) / math.sqrt(DH)
    mass = R * np.exp(s) / (np.exp(b0) + R * np.exp(s))
    _, lse = _form(name, chunk)(q, mem, w_k, w_v, sink_logit=b0, return_lse=True)
    self.assertGreater(np.ptp(mass), 0.1)  # the scores really vary across heads
    np.testing.assert_allclose(route_mass_from_lse(lse, b0), mass, rtol=1e-5, atol=1e-6)

  @parameterized.named_parameters(*ALL_FORMS)
  def test_sink_only_extreme_gives_zero_output_and_finite_grads(self, name, chunk):
    # Scores ~ -1e4, far below b0: everything goes to the zero-value sink.
    mem = jnp.ones((B, T, R, D))
    w_k = jnp.ones((D, HKV, DH))
    q = jnp.full((B, T, HQ, DH), -50.0)
    w_v = 0.5 * jax.random.normal(jax.random.PRNGKey(2), (D, HKV, DH))
    b0 = sink_logit(R, 0.5)
    o, lse, grads = _readout_vjp(name, chunk, (q, mem, w_k, w_v), b0)
    np.testing.assert_array_equal(np.isfinite(o), True)
    np.testing.assert_allclose(o, 0.0, atol=1e-30)
    np.testing.assert_allclose(route_mass_from_lse(lse, b0), 0.0, atol=1e-30)
    np.testing.assert_allclose(lse, b0, rtol=1e-6)
    for g in grads:
      np.testing.assert_array_equal(np.isfinite(g), True)

  @parameterized.named_parameters(*ALL_FORMS)
  def test_route_only_extreme_reads_the_value(self, name, chunk):
    # Scores ~ +1e4: the sink gets nothing; exp must not overflow.
    mem = jnp.ones((B, T, R, D))
    w_k = jnp.ones((D, HKV, DH))
    q = jnp.full((B, T, HQ, DH), 50.0)
    w_v = 0.5 * jax.random.normal(jax.random.PRNGKey(2), (D, HKV, DH))
    b0 = sink_logit(R, 0.5)
    o, lse, grads = _readout_vjp(name, chunk, (q, mem, w_k, w_v), b0)
    v0 = np.repeat(np.einsum("d,dkh->kh", np.ones(D), np.float64(w_v)), HQ // HKV, axis=0)
    np.testing.assert_allclose(o, np.broadcast_to(v0, o.shape), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(route_mass_from_lse(lse, b0), 1.0, rtol=1e-6)
    for g in grads:
      np.testing.assert_array_equal(np.isfinite(g), True)


class ReadoutInputChecksTest(chex.TestCase):

  @parameterized.named_parameters(*ALL_FORMS)
  def test_shape_errors_name_the_argument(self, name, chunk):
    q, mem, w_k, w_v = _inputs()
    form = _form(name, chunk)
    with self.assertRaisesRegex(ValueError, "mem"):
      form(q, mem[0], w_k, w_v, sink_logit=0.0)
    with self.assertRaisesRegex(ValueError, "w_v"):
      form(q, mem, w_k, w_v[:, :1], sink_logit=0.0)
    with self.assertRaisesRegex(ValueError, "Hq"):
      form(q[:, :, :3], mem, w_k, w_v, sink_logit=0.0)
