"""float64 stays float64: the layer against the float64 loop reference, and gradient checks.

With jax x64 enabled, a float64 `LngramV2` computes every stage in float64 (router
logits, lookup and surrogate, the readout statistics of every form, the norms, the
conv), so its output and the gradients of every parameter and of h equal the loop
reference `lngram_jax.reference.forward` to ~1e-12 (a float32 stage anywhere shows
up as ~1e-7). `jax.test_util.check_grads` then checks the differentiable parts
against finite differences: the readout forms, the conv, RMSNorm, and the whole
layer with the router frozen (surrogate "none", whose zero router gradient is the
true derivative of the hard codes).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

from lngram_jax import (
    LngramConfig,
    LngramParams,
    LngramV2,
    absorbed_readout,
    core,
    literal_readout,
    reference,
    rms_norm,
    short_conv,
    streaming_readout,
)
from lngram_jax.pallas import pallas_readout

B, T, D = 2, 8, 8
# R = 3 with route_chunk 2: a ragged streaming chunk; Hq = 4 over Hkv = 2.
CONFIG = LngramConfig(d_model=D, routes=3, bits=2, orders=(2, 3), mem_dim=4, q_heads=4,
                      kv_heads=2, head_dim=3, route_chunk=2, dtype=jnp.float64,
                      param_dtype=jnp.float64)
SEGMENTS = np.array([[0] * 3 + [1] * 5, [0] * 8], np.int32)
VALID = np.array([[True] * 8, [True] * 6 + [False] * 2])
TOL = 1e-12
# Central differences in float64: truncation ~eps², rounding ~1e-16/eps.
EPS = 1e-6


@pytest.fixture(autouse=True)
def _x64():
  with jax.enable_x64(True):
    yield


def _rel_err(got, want):
  got, want = np.asarray(got), np.asarray(want)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def _live_layer(config):
  """W_O and the conv drawn nonzero (zero at init hides the readout from every
  gradient), and router logits of order 1 so the codes vary."""
  layer = LngramV2(config, rngs=nnx.Rngs(0))
  k_o, k_c, k_r = jax.random.split(jax.random.key(102), 3)
  layer.w_o[...] = 0.3 * jax.random.normal(k_o, layer.w_o.shape, jnp.float64)
  layer.conv_kernel[...] = 0.5 * jax.random.normal(k_c, layer.conv_kernel.shape, jnp.float64)
  layer.router_w[...] = jax.random.normal(k_r, layer.router_w.shape, jnp.float64)
  return layer


def _h_and_cotangent():
  rng = np.random.default_rng(1)
  return (jnp.asarray(rng.normal(size=(B, T, D)), jnp.float64),
          jnp.asarray(rng.normal(size=(B, T, D)), jnp.float64))


def _layer_value_and_grads(layer, h, g_y):
  """y and the gradients of Σ g_y·y: parameters (as `LngramParams`) and h."""
  graphdef, state = nnx.split(layer, nnx.Param)

  @jax.jit
  def run(state, h):
    def loss(state, h):
      y = nnx.merge(graphdef, state)(h, segment_ids=jnp.asarray(SEGMENTS),
                                     valid=jnp.asarray(VALID))
      return jnp.sum(y * g_y), y
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(state, h)
    return y, grads

  y, (d_state, d_h) = run(state, h)
  return y, LngramParams.from_state(nnx.to_pure_dict(d_state)), d_h


@functools.cache
def _reference_value_and_grads_fn(config):
  def loss(p, h, g_y):
    y = reference.forward(p, config, h, segment_ids=SEGMENTS, valid=VALID)
    return jnp.sum(y * g_y), y
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _reference_value_and_grads(layer, h, g_y):
  (_, y), (d_p, d_h) = _reference_value_and_grads_fn(layer.config)(layer.param_arrays(), h, g_y)
  return y, d_p, d_h


@pytest.mark.parametrize("readout, surrogate", [
    ("literal", "onebit"), ("streaming", "exact"), ("absorbed", "exact"),
    ("absorbed", "onebit")])
def test_float64_layer_equals_float64_reference(readout, surrogate):
  layer = _live_layer(CONFIG.replace(readout=readout, surrogate=surrogate))
  h, g_y = _h_and_cotangent()
  y, d_p, d_h = _layer_value_and_grads(layer, h, g_y)
  y_ref, d_p_ref, d_h_ref = _reference_value_and_grads(layer, h, g_y)
  assert y.dtype == d_h.dtype == jnp.float64
  np.testing.assert_array_equal(np.asarray(y)[~VALID], 0.0)
  assert float(jnp.max(jnp.abs(y))) > 1e-2
  assert _rel_err(y, y_ref) < TOL
  assert _rel_err(d_h, d_h_ref) < TOL
  for name in core.PARAM_NAMES:
    got, want = getattr(d_p, name), getattr(d_p_ref, name)
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)):
      assert g.dtype == jnp.float64, (name, i)
      assert float(jnp.max(jnp.abs(w))) > 0.0, (name, i)  # every parameter gets signal
      assert _rel_err(g, w) < TOL, (name, i, _rel_err(g, w))


def test_float64_layer_aux_is_float64():
  layer = _live_layer(CONFIG)
  h, _ = _h_and_cotangent()
  _, aux = nnx.jit(lambda layer, h: layer(h, return_aux=True))(layer, h)
  _, aux_ref = reference.forward(layer.param_arrays(), CONFIG, h, return_aux=True)
  assert aux["logits"].dtype == aux["route_mass"].dtype == jnp.float64
  assert _rel_err(aux["logits"], aux_ref["logits"]) < TOL
  assert _rel_err(aux["route_mass"], aux_ref["route_mass"]) < TOL


# --- the readout forms, the kernel package's XLA path included ----------------------

_FORMS = {
    "literal": literal_readout,
    "streaming": functools.partial(streaming_readout, chunk=2),
    "absorbed": absorbed_readout,
    "pallas_xla": functools.partial(pallas_readout, implementation="xla"),
}
SINK = CONFIG.sink_logit


def _readout_inputs():
  rng = np.random.default_rng(2)
  shapes = [(B, 3, 4, 3), (B, 3, 5, 6), (6, 2, 3), (6, 2, 3)]  # q, x̂, W_K, W_V; R = 5
  return tuple(jnp.asarray(rng.normal(size=s), jnp.float64) for s in shapes)


@pytest.mark.parametrize("name", sorted(_FORMS))
def test_float64_readout_forms_equal_reference(name):
  args = _readout_inputs()
  rng = np.random.default_rng(3)
  g_o = jnp.asarray(rng.normal(size=(B, 3, 4, 3)), jnp.float64)
  g_lse = jnp.asarray(rng.normal(size=(B, 3, 4)), jnp.float64)
  form = functools.partial(_FORMS[name], sink_logit=SINK, return_lse=True)
  ref = functools.partial(reference.readout, sink_logit=SINK)
  (o, lse), vjp = jax.vjp(jax.jit(form), *args)
  (o_ref, lse_ref), vjp_ref = jax.vjp(jax.jit(ref), *args)
  assert o.dtype == lse.dtype == jnp.float64
  assert _rel_err(o, o_ref) < TOL and _rel_err(lse, lse_ref) < TOL
  for g, w in zip(vjp((g_o, g_lse)), vjp_ref((g_o, g_lse)), strict=True):
    assert g.dtype == jnp.float64 and _rel_err(g, w) < TOL


@pytest.mark.parametrize("name", ["literal", "streaming", "absorbed"])
def test_readout_forms_pass_check_grads(name):
  form = functools.partial(_FORMS[name], sink_logit=SINK, return_lse=True)
  check_grads(form, _readout_inputs(), order=1, modes=("fwd", "rev"), eps=EPS)


def test_conv_and_rms_norm_pass_check_grads():
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float64)
  kernel = jnp.asarray(rng.normal(size=(4, D)), jnp.float64)
  scale = jnp.asarray(1.0 + 0.1 * rng.normal(size=(D,)), jnp.float64)
  conv = lambda x, k: short_conv(x, k, dilation=3, segment_ids=jnp.asarray(SEGMENTS))
  check_grads(conv, (x, kernel), order=2, modes=("fwd", "rev"), eps=EPS)
  norm = lambda x, s: rms_norm(x, s, eps=1e-6)
  check_grads(norm, (x, scale), order=2, modes=("fwd", "rev"), eps=EPS)
  assert _rel_err(conv(x, kernel), reference.short_conv(x, kernel, dilation=3,
                                                        segment_ids=SEGMENTS)) < TOL


def test_layer_with_frozen_router_passes_check_grads():
  """Every gradient but the router's is the true derivative; with surrogate "none" the
  router's is too (zero: the codes are piecewise constant), so finite differences agree
  for all parameters and h. The lookup's custom_vjp has no forward mode: "rev" only."""
  config = CONFIG.replace(surrogate="none")
  layer = _live_layer(config)
  h, _ = _h_and_cotangent()
  seg, valid = jnp.asarray(SEGMENTS), jnp.asarray(VALID)
  forward = jax.jit(lambda p, h: core.forward(p, config, h, segment_ids=seg, valid=valid)[0])
  p = layer.param_arrays()
  # The finite-difference steps must not flip a code: no logit near the threshold.
  logits = core.router_logits(p, config, h)
  assert float(jnp.min(jnp.abs(logits))) > 1e-2
  check_grads(forward, (p, h), order=1, modes=("rev",), eps=EPS)
